"""A script of small statements on the embedded model (SmolLM2-135M, float32, CPU): what one
statement of a few strings costs once the model is loaded, and where the time goes (parse and
plan, compile, the automaton's arcs, the model's forward passes, the rest), against the earlier
executor in the same run: a model call per level of the prefix's token tree and every call on
the session's threads. Alone, and beside two busy processes (a machine shared with other work).

    python -m benchmarks.statement_bench [--statements 40] [--json FILE]
"""

from __future__ import annotations

import collections
import contextlib
import random
import subprocess
import sys
import time
from typing import Dict, List

from .setting import command

NOUNS = "cat dog cow pig owl ant bee elk fox hen man woman king queen car boat tree house river city".split()
VERBS = "sat ran ate hid sang slept jumped fell stood waited".split()


def statements(n: int, seed: int = 0) -> List[str]:
    """``n`` statements of the issue's shape: two strings, a prefix of two, the best row."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.sample(NOUNS, 2)
        start, verb = rng.choice(["The", "A", "My", "Her"]), rng.choice(VERBS)
        out.append(f"SELECT text, prob MATCHING '{start} ({a}|{b}) {verb}' PREFIX '{start} ({a}|{b})' LIMIT 1")
    return out


@contextlib.contextmanager
def busy(processes: int):
    """``processes`` processes that keep a core each busy, as other work on the machine does."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@contextlib.contextmanager
def earlier_executor():
    """The executor before the small-statement work: the prefix tree read level by level, and
    every model call on the session's threads."""
    from relmql.execute import shortest
    from relmql.models import passes as hf
    chains, threads = shortest.prefix_chains, hf.threads_for
    shortest.prefix_chains = lambda *a, **k: None
    hf.threads_for = lambda device, tokens: contextlib.nullcontext()
    try:
        yield
    finally:
        shortest.prefix_chains, hf.threads_for = chains, threads


class _Parts:
    """Seconds spent in the stages of a statement, by wrapping their entry points."""

    def __init__(self):
        self.seconds: Dict[str, float] = collections.Counter()
        self._undo = []

    def wrap(self, owner, name: str, part: str):
        f = getattr(owner, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - t
        setattr(owner, name, timed)
        self._undo.append((owner, name, f))

    def undo(self):
        for owner, name, f in reversed(self._undo):
            setattr(owner, name, f)


def measure(con, queries: List[str]) -> Dict[str, float]:
    """Milliseconds per statement: the whole and its parts, and model calls per statement."""
    from relmql import api, engine
    from relmql.automata.tokens import TokenAutomaton
    parts = _Parts()
    parts.wrap(api, "parse", "parse and plan")
    parts.wrap(api, "plan", "parse and plan")
    parts.wrap(engine, "compile", "compile")
    parts.wrap(TokenAutomaton, "arcs", "arcs")
    parts.wrap(TokenAutomaton, "arcs_of", "arcs")
    model = con.model()
    calls, seconds = model.stats.calls, model.stats.seconds
    t0 = time.perf_counter()
    try:
        for q in queries:
            con.sql(q).fetchall()
    finally:
        parts.undo()
    n = len(queries)
    wall = (time.perf_counter() - t0) / n * 1000
    out = {"statement": wall, "model": (model.stats.seconds - seconds) / n * 1000,
           "calls": (model.stats.calls - calls) / n}
    out.update({k: v / n * 1000 for k, v in parts.seconds.items()})
    out["rest"] = wall - sum(out[k] for k in ("model", "parse and plan", "compile", "arcs") if k in out)
    return out


def run(n: int = 40) -> dict:
    import relmql
    con = relmql.connect()
    con.sql(statements(1, seed=99)[0]).fetchall()  # the model loaded, its tables warm
    queries = statements(n)
    results = {}
    for load in (0, 2):
        with busy(load):
            for label, ctx in (("earlier", earlier_executor), ("now", contextlib.nullcontext)):
                with ctx():
                    con.sql(queries[0]).fetchall()  # a warm start for each
                    results[f"{label}, {load} busy"] = measure(con, queries)
    return {"statements": n, "results": results}


PARTS = ("statement", "calls", "model", "parse and plan", "compile", "arcs", "rest")


def tables(data: dict) -> str:
    """The Markdown table of ``run``'s results."""
    lines = [f"{data['statements']} statements of two strings (`SELECT text, prob MATCHING 'The (cat|dog) sat' "
             "PREFIX 'The (cat|dog)' LIMIT 1` and the like), milliseconds per statement once the model is loaded:",
             "", "| executor | beside | " + " | ".join(PARTS) + " |", "|---|---|" + "---:|" * len(PARTS)]
    for key, r in data["results"].items():
        label, load = key.split(", ")
        row = [f"{r.get(p, 0.0):.1f}" if p != "calls" else f"{r[p]:.1f}" for p in PARTS]
        lines.append(f"| {label} | {load} processes | " + " | ".join(row) + " |")
    res = data["results"]
    lines += ["", f"Ratio earlier / now: {res['earlier, 0 busy']['statement'] / res['now, 0 busy']['statement']:.2f} "
                  f"alone, {res['earlier, 2 busy']['statement'] / res['now, 2 busy']['statement']:.2f} beside two "
                  f"busy processes."]
    return "\n".join(lines)


def main(argv=None):
    command(__doc__, run, tables, argv, options=[("--statements", {"type": int, "default": 40, "dest": "n"})])


if __name__ == "__main__":
    main()
