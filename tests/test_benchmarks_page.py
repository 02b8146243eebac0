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


def test_the_gpu_section_shows_the_newest_run():
    runs = json.loads(run.GPU_RUNS.read_text())
    shown = gpu_bench.latest(runs)
    newest = runs[-1]
    assert f"**{newest['label']}**" in shown
    assert all(f"**{r['label']}**" not in shown for r in runs[:-1] if not r["results"].get("forward"))
    rows = sum(len(newest["results"].get(k, [])) for k in ("throughput", "throughput_eager",
                                                             "throughput_one_pass", "throughput_bf16"))
    assert shown.count("| float32 |") + shown.count("| bfloat16 |") == rows
    # the newest run measured no pass alone: the newest run that did gives that table, once
    assert not newest["results"].get("forward") and shown.count("| one forward pass |") == 1
