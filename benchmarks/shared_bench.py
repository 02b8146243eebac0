"""relmql beside itself on a shared CPU: the README's main job and the phone query run alone,
then as two and three copies at once, each copy a process of its own; each copy's wall against
the job's wall alone, in the same run, under each OpenMP wait policy.

    python -m benchmarks.shared_bench [--copies 2 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
RELMQL = [sys.executable, "-m", "relmql", "--no-progress"]
JOBS = {
    "README main job": RELMQL + [str(ROOT / "examples" / "birthdays.rql")],
    "phone query": RELMQL + ["-c", "SELECT text, prob MATCHING 'My phone number is ([0-9]{3}) ([0-9]{3}) ([0-9]{4})' "
                                   "PREFIX 'My phone number is' USING topk 40 LIMIT 10"],
}
POLICIES = {"relmql's default (PASSIVE)": {}, "OMP_WAIT_POLICY=ACTIVE (spinning)": {"OMP_WAIT_POLICY": "ACTIVE"}}


def together(cmd: List[str], copies: int, env: Dict[str, str]) -> List[float]:
    """The wall of each of ``copies`` copies of ``cmd`` started at once."""
    t0 = time.perf_counter()
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(copies)]
    walls = [0.0] * copies
    left = set(range(copies))
    while left:
        for i in list(left):
            if procs[i].poll() is not None:
                walls[i] = time.perf_counter() - t0
                left.discard(i)
        time.sleep(0.05)
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{cmd} failed")
    return walls


def run(copies: List[int]) -> List[Dict]:
    """Each job, each policy: the wall alone (median of two) and each count of copies at once."""
    out = []
    for job, cmd in JOBS.items():
        for policy, extra in POLICIES.items():
            env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
            env.update(extra)
            together(cmd, 1, env)  # warm the caches
            alone = statistics.median(together(cmd, 1, env)[0] for _ in range(2))
            row = {"job": job, "policy": policy, "alone": alone}
            for n in copies:
                row[str(n)] = together(cmd, n, env)
            out.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return out


def table(rows: List[Dict], copies: List[int]) -> str:
    """Each copy's slowdown against the job alone (the number of copies is what sharing explains)."""
    head = " | ".join(f"{n} at once: slowest / alone (target ≤ {n})" for n in copies)
    lines = [f"| job | OpenMP waits | alone | {head} |", "|---|---|---:|" + "---:|" * len(copies)]
    for r in rows:
        cells = " | ".join(f"{max(r[str(n)]) / r['alone']:.2f}×" for n in copies)
        lines.append(f"| {r['job']} | {r['policy']} | {r['alone']:.1f} s | {cells} |")
    return "\n".join(lines)


def tables(rows: List[Dict]) -> str:
    """docs/benchmarks.md's part: the table and its reading."""
    copies = sorted(int(k) for k in rows[0] if k.isdigit())
    worst = {r["policy"]: max(max(r[str(n)]) / r["alone"] / n for n in copies) for r in rows}
    mine = [v for k, v in worst.items() if "default" in k]
    return (table(rows, copies) + "\n\n"
            f"- With relmql's default, n copies at once each take at most {max(mine):.2f} × n their time alone; "
            "with OpenMP threads that spin while they wait, up to "
            f"{max(v for k, v in worst.items() if 'default' not in k):.2f} × n (the idle threads of one "
            "process take the cores the other needs).\n"
            "- The `relmql` command sets `OMP_WAIT_POLICY=PASSIVE` before torch starts, unless it is set "
            "already (from Python, set it before importing torch). Alone it costs: " + ", ".join(
                f"the {job} took {r['alone'] / s['alone']:.2f}× its time with spinning threads"
                for job in dict.fromkeys(r["job"] for r in rows)
                for r in rows if r["job"] == job and "default" in r["policy"]
                for s in rows if s["job"] == job and "default" not in s["policy"]) +
            "; a machine that runs one query at a time may set `OMP_WAIT_POLICY=ACTIVE` before starting relmql.")


def main(argv: List[str] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--copies", type=int, nargs="+", default=[2, 3])
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    rows = run(args.copies)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(table(rows, args.copies))


if __name__ == "__main__":
    main()
