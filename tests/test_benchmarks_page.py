"""docs/benchmarks.md is written by ``python -m benchmarks.run`` from its template and the figures kept in
docs/benchmarks.json: nothing on it is written by hand, and it stays short enough to read."""

from __future__ import annotations

import json
import re

from benchmarks import gpu_bench, run


def test_the_page_is_its_template_with_the_kept_figures():
    store = json.loads(run.STORE.read_text())
    assert run.PAGE.read_text() == run.render(store, run.TEMPLATE.read_text()), \
        "docs/benchmarks.md differs from what benchmarks.run writes: edit the template, then " \
        "python -m benchmarks.run --render"


def test_every_part_has_its_place_and_its_figures():
    template = run.TEMPLATE.read_text()
    names = {part.name for part in run.PARTS}
    assert set(re.findall(r"\{\{(\w+)\}\}", template)) == names | {"date", "gpu_runs"}
    store = json.loads(run.STORE.read_text())
    assert set(store) == names
    for name, entry in store.items():
        assert entry["markdown"].strip() and re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["date"]), name
        assert f"Measured on {entry['date']}. Machine: {entry['machine']};" in run.PAGE.read_text()


def test_the_page_reads_in_minutes():
    page = run.PAGE.read_text()
    assert len(page.splitlines()) <= 350
    assert "(not measured)" not in page
    # each section says how to run it again
    for section in re.split(r"\n## ", page)[1:]:
        assert "Rerun" in section or "--only" in section, section.splitlines()[0]


def _gpu_run(label, batches, forward=()):
    return {"label": label, "results": {
        "gpu": "G", "torch": "T", "load": {"seconds": 1.0},
        "throughput": [{"batch": b, "nodes": 100, "nodes_per_s": 10.0 * b, "forward_calls": 2, "forward_share": 0.5,
                        "gpu_utilization": 20.0} for b in batches],
        **({"forward": [{"batch": b, "past": 16, "wall_ms": 2.0, "kernels_ms": 1.0} for b in forward]}
           if forward else {})}}


def test_the_gpu_section_shows_the_newest_run():
    old = _gpu_run("old", [32, 64], forward=[32])
    older = _gpu_run("older", [8], forward=[8, 16])
    new = _gpu_run("new", [128])
    shown = gpu_bench.latest([older, old, new])
    # the newest run's rows, and the newest one-pass table of the runs before it (the newest has none)
    assert "**new**" in shown and shown.count("| float32 |") == 1 and "| float32 | 128 |" in shown
    assert "**old**" in shown and shown.count("| batch 32, 1 new token over 16 |") == 1
    assert "**older**" not in shown and "| batch 8," not in shown
    # a newest run with its own one-pass table needs no other
    newest = _gpu_run("newest", [256], forward=[256])
    shown = gpu_bench.latest([old, newest])
    assert "**old**" not in shown and "| batch 256, 1 new token over 16 |" in shown
    # the kept runs make the page's section
    runs = json.loads(run.GPU_RUNS.read_text())
    assert f"**{runs[-1]['label']}**" in gpu_bench.latest(runs)
