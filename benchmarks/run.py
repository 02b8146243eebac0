"""Run every benchmark and write docs/benchmarks.md (machine, versions, date, results).

    python -m benchmarks.run
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from . import (chat_bench, compile_bench, execute_bench, executor_bench, gemma_bench, gpu_bench, latency_bench,
               measure_bench, prompt_bench, shared_bench, precision_bench, scale_bench, statement_bench)
from .setting import setting

ROOT = Path(__file__).resolve().parent.parent
GPU_RUNS = ROOT / "docs" / "gpu-runs.json"  # later GPU runs' results, kept: their tables are written from it


def _mark(tag: str, body: str) -> str:
    return f"{tag}\n{body}\n{tag}"


def _section(text: str, tag: str) -> str:
    parts = text.split(tag)
    return parts[1].strip("\n") if len(parts) >= 3 else "(not measured)"


def _header(text: str, key: str) -> str:
    """The date, machine or versions that an earlier docs/benchmarks.md names."""
    pattern = {"date": r"on (\d{4}-\d{2}-\d{2})\.",
               "machine": r"^- Machine: (.*?)(?: \(where a section names no other\))*$",  # the template adds it back
               "versions": r"^- Versions: (.*)$"}[key]
    m = re.search(pattern, text, re.M)
    return m.group(1) if m else ""


def main():
    import argparse
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=30.0, help="time per URL memorization configuration")
    p.add_argument("--only", choices=("compile", "execute", "executor", "measure", "precision", "scale", "gemma", "gpu",
                                      "statement", "chat", "latency", "shared", "prompts"),
                   help="run one part (the others are left as they are)")
    p.add_argument("--render", action="store_true",
                   help="measure nothing: write the page again from the template, every part as it was measured")
    p.add_argument("--execute-json", help="take the executor results from this file (written by "
                                          "python -m benchmarks.execute_bench --json) instead of measuring them")
    p.add_argument("--executor-json", help="take the executor-against-baseline results from this file (written by "
                                           "python -m benchmarks.executor_bench --json) instead of measuring them")
    p.add_argument("--precision-json", help="take the precision results from this file (written by "
                                            "python -m benchmarks.precision_bench --json) instead of measuring them")
    p.add_argument("--gpu-json", help="the GPU section from this file: a list of {label, results}, each results "
                                      "written by python -m benchmarks.gpu_bench --json on a GPU machine (never "
                                      "measured here: CI and this machine have no GPU)")
    p.add_argument("--gemma-json", help="take the Gemma 3 results from this file (written by "
                                        "python -m benchmarks.gemma_bench --json) instead of measuring them")
    args = p.parse_args()
    if args.render:
        args.only = "render"  # no part has this name: each is kept as it was
    out = ROOT / "docs" / "benchmarks.md"
    rows = compile_bench.run() if args.only in (None, "compile") else None
    if args.execute_json:
        executed = json.loads(Path(args.execute_json).read_text())
    else:
        executed = execute_bench.run(args.seconds) if args.only in (None, "execute") else None
    if args.executor_json:
        versus = json.loads(Path(args.executor_json).read_text())
    else:
        versus = executor_bench.run() if args.only in (None, "executor") else None
    measured = measure_bench.run() if args.only in (None, "measure") else None
    small = statement_bench.run() if args.only in (None, "statement") else None
    chatted = chat_bench.run() if args.only in (None, "chat") else None
    scaled = scale_bench.run() if args.only in (None, "scale") else None
    latency = latency_bench.run_all() if args.only in (None, "latency") else None
    shared = shared_bench.run([2, 3]) if args.only in (None, "shared") else None
    prompts = prompt_bench.run() if args.only in (None, "prompts") else None
    if args.gemma_json:
        gemma = json.loads(Path(args.gemma_json).read_text())
    else:
        gemma = gemma_bench.run() if args.only in (None, "gemma") else None
    if args.precision_json:
        precise = json.loads(Path(args.precision_json).read_text())
    else:
        precise = precision_bench.run() if args.only in (None, "precision") else None
    text = (ROOT / "docs" / "benchmarks.template.md").read_text()
    old = out.read_text() if out.exists() else ""
    compile_part = compile_bench.table(rows) if rows else _section(old, "<!-- compile -->")
    reading = compile_bench.reading(rows) if rows else _section(old, "<!-- compile reading -->")
    execute_part = execute_bench.tables(executed) if executed else _section(old, "<!-- execute -->")
    versus_part = executor_bench.tables(versus) if versus else _section(old, "<!-- executor -->")
    measure_part = measure_bench.tables(measured) if measured else _section(old, "<!-- measure -->")
    statement_part = statement_bench.tables(small) if small else _section(old, "<!-- statement -->")
    chat_part = chat_bench.tables(chatted) if chatted else _section(old, "<!-- chat -->")
    scale_part = scale_bench.tables(scaled) if scaled else _section(old, "<!-- scale -->")
    latency_part = latency_bench.tables(latency) if latency else _section(old, "<!-- latency -->")
    shared_part = shared_bench.tables(shared) if shared else _section(old, "<!-- shared -->")
    prompt_part = prompt_bench.tables(prompts) if prompts else _section(old, "<!-- prompts -->")
    gemma_part = gemma_bench.tables(gemma) if gemma else _section(old, "<!-- gemma -->")
    precision_part = precision_bench.tables(precise) if precise else _section(old, "<!-- precision -->")
    if args.gpu_json:
        gpu_part = gpu_bench.tables(json.loads(Path(args.gpu_json).read_text()))
    else:
        gpu_part = _section(old, "<!-- gpu -->")
    now = setting()
    header = {"date": now.date, "machine": now.machine, "versions": now.versions}
    if args.only and old:  # one part measured again: the header stays the other parts'
        header = {k: _header(old, k) or v for k, v in header.items()}
        if args.only != "precision" and (header["machine"], header["versions"]) != (now.machine, now.versions):
            stamp = f"Measured on {now.date}. Machine: {now.machine}; {now.versions}.\n\n"
            compile_part = stamp + compile_part if rows else compile_part
            execute_part = stamp + execute_part if executed else execute_part
            versus_part = stamp + versus_part if versus else versus_part
            measure_part = stamp + measure_part if measured else measure_part
            statement_part = stamp + statement_part if small else statement_part
            chat_part = stamp + chat_part if chatted else chat_part
            scale_part = stamp + scale_part if scaled else scale_part
            latency_part = stamp + latency_part if latency else latency_part
            shared_part = stamp + shared_part if shared else shared_part
            prompt_part = stamp + prompt_part if prompts else prompt_part
            gemma_part = stamp + gemma_part if gemma else gemma_part
    text = (text.replace("{{date}}", header["date"])
                .replace("{{machine}}", header["machine"])
                .replace("{{versions}}", header["versions"])
                .replace("{{compile_table}}", _mark("<!-- compile -->", compile_part))
                .replace("{{compile_reading}}", _mark("<!-- compile reading -->", reading))
                .replace("{{execute_tables}}", _mark("<!-- execute -->", execute_part))
                .replace("{{executor_tables}}", _mark("<!-- executor -->", versus_part))
                .replace("{{measure_tables}}", _mark("<!-- measure -->", measure_part))
                .replace("{{statement_tables}}", _mark("<!-- statement -->", statement_part))
                .replace("{{chat_tables}}", _mark("<!-- chat -->", chat_part))
                .replace("{{scale_tables}}", _mark("<!-- scale -->", scale_part))
                .replace("{{latency_tables}}", _mark("<!-- latency -->", latency_part))
                .replace("{{shared_tables}}", _mark("<!-- shared -->", shared_part))
                .replace("{{prompt_tables}}", _mark("<!-- prompts -->", prompt_part))
                .replace("{{gemma_tables}}", _mark("<!-- gemma -->", gemma_part))
                .replace("{{precision_tables}}", _mark("<!-- precision -->", precision_part))
                .replace("{{gpu_tables}}", _mark("<!-- gpu -->", gpu_part))
                .replace("{{gpu_runs_tables}}", gpu_bench.tables(json.loads(GPU_RUNS.read_text()))))
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
