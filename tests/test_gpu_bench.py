"""The GPU benchmark's driver (benchmarks/gpu_bench.py) where it is never run for real: no GPU
here, so the tiny GPT-2 on the CPU, through the same parts and the docs table."""

from __future__ import annotations

import json

import torch

from benchmarks import gpu_bench
from relmql.models import passes as hf


def test_gpu_bench_parts_and_table_without_a_gpu(tmp_path):
    out = tmp_path / "gpu.json"
    cap = hf.LOGITS_BYTES
    gpu_bench.main(["--model", "tiny-gpt2", "--device", "cpu", "--nodes", "400", "--parts",
                    "host,throughput,logits,eager,forward", "--json", str(out)])
    assert hf.LOGITS_BYTES == cap  # the logits part raises the cap for its searches only
    res = json.loads(out.read_text())
    assert not any(k.endswith("_error") for k in res), res
    assert [t["batch"] for t in res["throughput"]] == list(gpu_bench.BATCHES)
    assert [t["batch"] for t in res["throughput_one_pass"]] == [512, 1024]
    for t in res["throughput"] + res["throughput_one_pass"]:
        assert t["nodes"] > 0 and t["forward_calls"] > 0
        assert 0 < t["forward_share"] < 1
        assert t["nodes_per_s"] == t["nodes"] / t["seconds"]
        if not torch.cuda.is_available():
            assert t["gpu_utilization"] is None
    table = gpu_bench.tables([{"label": "tiny", "results": res}])
    assert table.count("| float32 |") == 2 * len(gpu_bench.BATCHES) + 2
    assert "one forward pass per batch" in table and "**tiny**" in table
    # the same searches with no CUDA graphs (none on a CPU either way): the same nodes
    assert [t["nodes"] for t in res["throughput_eager"]] == [t["nodes"] for t in res["throughput"]]
    assert "eager forward passes (no CUDA graphs)" in table
    # one forward pass alone: wall time everywhere, kernel time and graphs only on CUDA
    assert [f["batch"] for f in res["forward"]] == [32, 256, 1024]
    assert all(f["wall_ms"] > 0 and ("kernels_ms" in f) == torch.cuda.is_available() for f in res["forward"])
    assert table.count("1 new token over 16") == 3
    assert res["host"]["nodes"] > 0 and f"{res['host']['nodes_per_s']:,.0f} nodes/s" in table


def test_the_kept_gpu_runs_make_their_tables():
    """docs/gpu-runs.json (runs measured on lent GPU machines) is what benchmarks.run writes the
    later GPU tables from: each run gives its rows."""
    from benchmarks.run import GPU_RUNS
    runs = json.loads(GPU_RUNS.read_text())
    table = gpu_bench.tables(runs)
    assert all(f"**{r['label']}**" in table for r in runs)
    rows = sum(len(r["results"].get(k, [])) for r in runs
               for k in ("throughput", "throughput_eager", "throughput_one_pass", "throughput_bf16"))
    assert table.count("| float32 |") + table.count("| bfloat16 |") == rows
