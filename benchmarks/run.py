"""Run every benchmark, keep its figures in docs/benchmarks.json and write docs/benchmarks.md from them.

    python -m benchmarks.run
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict

from . import (chat_bench, compile_bench, execute_bench, executor_bench, gemma_bench, gpu_bench, latency_bench,
               measure_bench, prompt_bench, shared_bench, precision_bench, scale_bench, statement_bench)
from .setting import setting

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"
TEMPLATE = ROOT / "docs" / "benchmarks.template.md"
STORE = ROOT / "docs" / "benchmarks.json"  # each part as last measured: its markdown, when and where
GPU_RUNS = ROOT / "docs" / "gpu-runs.json"  # later GPU runs' results, kept: their tables are written from it


def _read(path: str) -> Any:
    return json.loads(Path(path).read_text())


@dataclass(frozen=True)
class Part:
    """One section's figures: ``{{name}}`` in the template, ``--only name`` on the command line."""
    name: str
    measure: Callable[[Any], Any]  # the parsed arguments -> results
    render: Callable[[Any], str]  # results -> markdown


PARTS = (
    Part("compile", lambda a: compile_bench.run(),
         lambda r: compile_bench.table(r) + "\n\n" + compile_bench.reading(r)),
    Part("execute", lambda a: _read(a.execute_json) if a.execute_json else execute_bench.run(a.seconds),
         execute_bench.tables),
    Part("executor", lambda a: _read(a.executor_json) if a.executor_json else executor_bench.run(),
         executor_bench.tables),
    Part("latency", lambda a: latency_bench.run_all(), latency_bench.tables),
    Part("shared", lambda a: shared_bench.run([2, 3]), shared_bench.tables),
    Part("prompts", lambda a: prompt_bench.run(), prompt_bench.tables),
    Part("statement", lambda a: statement_bench.run(), statement_bench.tables),
    Part("chat", lambda a: chat_bench.run(), chat_bench.tables),
    Part("precision", lambda a: _read(a.precision_json) if a.precision_json else precision_bench.run(),
         precision_bench.tables),
    Part("measure", lambda a: measure_bench.run(), measure_bench.tables),
    Part("scale", lambda a: scale_bench.run(), scale_bench.tables),
    Part("gemma", lambda a: _read(a.gemma_json) if a.gemma_json else gemma_bench.run(), gemma_bench.tables),
)


def _stamp(entry: Dict) -> str:
    """Where and when: the end of the paragraph above it, and the start of the part's own, if that opens with text."""
    table_or_heading = entry["markdown"].startswith(("|", "#"))
    return f"Measured on {entry['date']}. Machine: {entry['machine']}; {entry['versions']}." + (
        "\n\n" if table_or_heading else "\n")


def render(store: Dict[str, Dict], template: str) -> str:
    """The page: the template with each part's stored markdown under the line that says where it ran."""
    text = template.replace("{{date}}", max((e["date"] for e in store.values()), default="(never)"))
    for part in PARTS:
        entry = store.get(part.name)
        body = _stamp(entry) + entry["markdown"] if entry else "(not measured)"
        text = text.replace("{{%s}}" % part.name, body)
    return text.replace("{{gpu_runs}}", gpu_bench.latest(json.loads(GPU_RUNS.read_text())))


def _kept(results: Any) -> Any:
    """The results as JSON, where they are (the tables can then be written again in another form)."""
    try:
        return json.loads(json.dumps(results))
    except (TypeError, ValueError):
        return None


def main():
    import argparse
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=30.0, help="time per URL memorization configuration")
    p.add_argument("--only", choices=[part.name for part in PARTS],
                   help="run one part (the others are left as they are)")
    p.add_argument("--render", action="store_true",
                   help="measure nothing: write the page again from the template, every part as it was measured")
    p.add_argument("--execute-json", help="take the executor results from this file (written by "
                                          "python -m benchmarks.execute_bench --json) instead of measuring them")
    p.add_argument("--executor-json", help="take the executor-against-baseline results from this file (written by "
                                           "python -m benchmarks.executor_bench --json) instead of measuring them")
    p.add_argument("--precision-json", help="take the precision results from this file (written by "
                                            "python -m benchmarks.precision_bench --json) instead of measuring them")
    p.add_argument("--gpu-json", help="add the GPU runs in this file to docs/gpu-runs.json (the page shows the "
                                      "newest): a list of {label, results}, each results written by python -m "
                                      "benchmarks.gpu_bench --json on a GPU machine (never measured here: CI and "
                                      "this machine have no GPU)")
    p.add_argument("--gemma-json", help="take the Gemma 3 results from this file (written by "
                                        "python -m benchmarks.gemma_bench --json) instead of measuring them")
    args = p.parse_args()
    store = json.loads(STORE.read_text()) if STORE.exists() else {}
    if args.gpu_json:
        GPU_RUNS.write_text(json.dumps(json.loads(GPU_RUNS.read_text()) + _read(args.gpu_json), indent=1) + "\n")
    for part in PARTS:
        if args.render or (args.only and args.only != part.name) or (args.gpu_json and not args.only):
            continue
        results = part.measure(args)
        now = setting()
        # results read from a --*-json file may say where they were measured (precision's always do)
        where = {k: results.get(k, getattr(now, k)) if isinstance(results, dict) else getattr(now, k)
                 for k in ("date", "machine", "versions")}
        store[part.name] = dict(where, markdown=part.render(results), results=_kept(results))
        STORE.write_text(json.dumps(store, indent=1, ensure_ascii=False) + "\n")  # each part kept as it ends
    PAGE.write_text(render(store, TEMPLATE.read_text()))
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
