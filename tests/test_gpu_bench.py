"""The GPU benchmark's driver (benchmarks/gpu_bench.py) where it is never run for real: no GPU
here, so the tiny GPT-2 on the CPU, through the same parts and the docs table."""

from __future__ import annotations

import json

import torch

from benchmarks import gpu_bench
from relmql.models import hf


def test_gpu_bench_parts_and_table_without_a_gpu(tmp_path):
    out = tmp_path / "gpu.json"
    cap = hf.LOGITS_BYTES
    gpu_bench.main(["--model", "tiny-gpt2", "--device", "cpu", "--nodes", "400", "--parts", "throughput,logits",
                    "--json", str(out)])
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
    assert table.count("| float32 |") == len(gpu_bench.BATCHES) + 2
    assert "one forward pass per batch" in table and "**tiny**" in table
