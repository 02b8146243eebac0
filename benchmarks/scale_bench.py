"""Scale-out: the LAMBADA baseline query's data rows per second in-process and on the Ray engine.

    python -m benchmarks.scale_bench [--rows 60] [--json out.json]

Each configuration runs in a fresh process (compiled automata are cached within a process), on
the same first ``--rows`` rows of the paper's LAMBADA baseline statement
(benchmarks/paper/lambada.rql): in-process with 1 torch thread and with one per CPU, then a
local Ray instance with 1 worker (one thread per CPU) and with one worker per CPU (1 thread
each). Start-up (Ray, the workers, their model loads) is timed apart from the query.
The predictions of each configuration are compared with in-process, 1 thread: a worker with the
same thread count gives bit-identical rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Dict, List

from .paper.common import statements

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RQL = HERE / "paper" / "lambada.rql"


def statement(rows: int) -> str:
    """The baseline statement of lambada.rql on its first ``rows`` data rows."""
    text = dict(statements(RQL))["baseline"]
    head, sep, tail = text.rpartition("LIMIT ")
    return f"{head}{sep}{rows}"


def cpu_busy():
    """A reader of how busy the machine's CPUs were since the last call (0–1)."""
    import psutil
    psutil.cpu_percent(None)
    return lambda: psutil.cpu_percent(None) / 100


def measure(con, sql: str) -> Dict:
    busy = cpu_busy()
    start = time.perf_counter()
    rows = con.sql(sql).fetchall()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rows": len(rows), "rows_per_s": len(rows) / seconds, "cpu_busy": busy(),
            "result": [list(r) for r in rows]}


CONFIGS = {  # name: (engine, workers, threads per process); "all": every CPU
    "local-1": ("local", 0, 1), "local-all": ("local", 0, "all"),
    "ray-1": ("ray", 1, "all"), "ray-all": ("ray", "all", 1),
}
SCRIPT_CONFIGS = ("local-all", "ray-all")
BIAS = HERE / "paper" / "bias.rql"


def script(draws: int) -> str:
    """The sampled statements of bias.rql that have the prefix (8 independent queries), with
    ``draws`` draws each instead of 5000."""
    chosen = [text for name, text in statements(BIAS) if name.startswith("sampled") and name.endswith(("man", "woman"))]
    return "".join(text.replace("SAMPLE 5000", f"SAMPLE {draws}") + ";\n" for text in chosen)


def session(name: str, model: str, dtype: str):
    """``(connection, engine, workers, threads)`` of configuration ``name``, its model loaded
    (with Ray: Ray, the workers and their models up)."""
    import relmql
    cpus = os.cpu_count() or 1
    engine, workers, threads = (cpus if v == "all" else v for v in CONFIGS[name])
    if engine == "local":
        con = relmql.connect(model=model, dtype=dtype, threads=threads)
        con.model()
    else:
        import ray
        ray.init(num_cpus=cpus, include_dashboard=False, logging_level="WARNING")
        con = relmql.connect(model=model, dtype=dtype, engine="ray", workers=workers, threads=threads)
        con.sql("SELECT text MATCHING 'a' LIMIT 1").fetchall()
    return con, engine, workers, threads


def one_script(name: str, draws: int, model: str, dtype: str) -> Dict:
    """The bias script in this (fresh) process, through the command line's script runner."""
    import io

    from relmql.cli import run_script
    con, engine, _, _ = session(name, model, dtype)
    if engine == "local":  # as the workers were, by session()
        con.sql("SELECT text MATCHING 'a' LIMIT 1").fetchall()
    text = script(draws)
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    code = run_script(con, text, "bias", {}, "jsonl", out, err)
    seconds = time.perf_counter() - start
    con.close()
    if code:
        raise SystemExit(err.getvalue())
    return {"name": name, "seconds": seconds, "statements": text.count(";"), "output": out.getvalue()}


def one(name: str, n_rows: int, model: str, dtype: str) -> Dict:
    """One configuration, in this (fresh) process: its start-up, its query and its rows."""
    os.chdir(ROOT)  # the statement's data path is relative to the repository root
    sql = statement(n_rows)
    start = time.perf_counter()
    con, engine, workers, threads = session(name, model, dtype)
    startup = time.perf_counter() - start
    r = measure(con, sql)
    con.close()
    plural = "s" if threads > 1 else ""
    r.update(name=(f"in-process, {threads} thread{plural}" if engine == "local" else
                   f"Ray, {workers} worker{'s' if workers > 1 else ''} × {threads} thread{plural}"),
             engine=engine, workers=workers, threads=threads, startup_s=startup)
    return r


def _fresh(args: List[str], model: str, dtype: str) -> Dict:
    """This script run with ``args`` in a fresh process: its JSON result."""
    import subprocess
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([sys.executable, "-m", "benchmarks.scale_bench", *args, "--model", model, "--dtype", dtype,
                        "--json", f.name], check=True, cwd=ROOT)
        return json.loads(Path(f.name).read_text())


def run(n_rows: int = 60, model: str = "smollm2-135m", dtype: str = "float32", draws: int = 300) -> Dict:
    """Every configuration, each in a fresh process (no compile cache carried from one to the
    next), on the same rows; their rows compared with in-process, 1 thread. Then the bias
    script, in-process and on one 1-thread worker per CPU."""
    out: Dict = {"rows": n_rows, "model": model, "dtype": dtype, "cpus": os.cpu_count() or 1, "configs": [],
                 "draws": draws, "script": []}
    for name in CONFIGS:
        out["configs"].append(_fresh(["--one", name, "--rows", str(n_rows)], model, dtype))
    for name in SCRIPT_CONFIGS:
        out["script"].append(_fresh(["--one-script", name, "--draws", str(draws)], model, dtype))
    same = out["script"][0]["output"]
    for c in out["script"]:
        c["same_output"] = c.pop("output") == same
    base = out["configs"][0]["result"]
    for c in out["configs"]:
        c["same_rows"] = sum(a == b for a, b in zip(c["result"], base))
        c["same_predictions"] = sum(a[:3] == b[:3] for a, b in zip(c["result"], base))
        del c["result"]
    return out


def tables(res: Dict) -> str:
    """The markdown table of ``run()``'s results."""
    base = res["configs"][1]  # in-process with every thread: what a user gets without Ray
    lines = [f"LAMBADA baseline (benchmarks/paper/lambada.rql), first {res['rows']} data rows, "
             f"{res['model']} ({res['dtype']}), {res['cpus']} CPUs.", "",
             "| configuration | start-up | query | data rows/s | vs in-process | CPUs busy | "
             "rows as in-process, 1 thread (bit-identical / same prediction) |", "|---|---|---|---|---|---|---|"]
    for c in res["configs"]:
        lines.append(f"| {c['name']} | {c['startup_s']:.1f} s | {c['seconds']:.1f} s | {c['rows_per_s']:.2f} | "
                     f"**{c['rows_per_s'] / base['rows_per_s']:.2f}×** | {c['cpu_busy']:.0%} | "
                     f"{c['same_rows']} / {c['same_predictions']} of {c['rows']} |")
    if res.get("script"):
        local, remote = res["script"]
        lines += ["", f"A script of {local['statements']} independent queries: the sampled statements of "
                      f"benchmarks/paper/bias.rql that have the prefix, {res['draws']} draws each.", "",
                  "| configuration | script | vs in-process | output as in-process |", "|---|---|---|---|"]
        for c in res["script"]:
            lines.append(f"| {'in-process' if c is local else 'Ray, one 1-thread worker per CPU'} | "
                         f"{c['seconds']:.1f} s | **{local['seconds'] / c['seconds']:.2f}×** | "
                         f"{'identical' if c['same_output'] else 'differs'} |")
    return "\n".join(lines)


def main(argv: List[str] = None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=60, help="LAMBADA data rows per configuration (default: 60)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--draws", type=int, default=300, help="draws per query of the bias script (default: 300)")
    p.add_argument("--one", choices=CONFIGS, help=argparse.SUPPRESS)  # one configuration, in this process
    p.add_argument("--one-script", choices=SCRIPT_CONFIGS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        Path(args.json).write_text(json.dumps(one(args.one, args.rows, args.model, args.dtype)))
        return
    if args.one_script:
        Path(args.json).write_text(json.dumps(one_script(args.one_script, args.draws, args.model, args.dtype)))
        return
    res = run(args.rows, args.model, args.dtype, args.draws)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    print(tables(res))


if __name__ == "__main__":
    main()
