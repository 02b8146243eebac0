"""The executor against an earlier one, in the same run (issue 17's queries, SmolLM2, float32).

Each query runs in its own process through the public API, once with this checkout's relmql and
once with the relmql of ``--baseline`` (a git revision, extracted with ``git archive``): time to
the first row, wall time, the time inside the model's forward passes and the rows themselves.
Then the executor alone: expanded nodes per second of the URL search driving a model whose forward
pass costs next to nothing (``StubModel``) at batch 32 and 256, this checkout's executor and the
baseline's alternately, each search in a process of its own.

    python -m benchmarks.executor_bench [--baseline 0cd00b1] [--json out.json]
    python -m benchmarks.executor_bench --stub-only --baseline HEAD~3 --runs 9
    python -m benchmarks.executor_bench --calls --baseline 0be7d2c
    python -m benchmarks.executor_bench --query "long PREFIX, max_memory 64MiB" --baseline HEAD~1

This file is also the worker: ``python benchmarks/executor_bench.py --worker NAME`` with the
relmql to measure first on PYTHONPATH and this repository after it (for ``benchmarks``).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "0cd00b1"  # the executor before issue 17 (padded copies of every node's keys and values)
LAMBADA = "../shared/data/lambada_test.jsonl"
TOXIC = ("SELECT text, prob MATCHING 'Shut up, you stupid bitch' PREFIX 'Shut up, you stupid' "
         "USING topk 40, edits 1{order} LIMIT 10")
PHONE = ("SELECT text, prob MATCHING 'My phone number is ([0-9]{{3}}) ([0-9]{{3}}) ([0-9]{{4}})' "
         "PREFIX 'My phone number is' USING topk 40, tokenization {tok} LIMIT 10")
LAMBADA_SQL = ("SELECT :row_number AS row, last_word(:text) AS answer, group(1) AS prediction, prob "
               "MATCHING escape(drop_last_word(:text)) || ' ([a-zA-Z]+)(\\.|!|\\?)?(\")?{tail}' "
               "PREFIX escape(drop_last_word(:text)) "
               "USING topk 1000, tokenization all, prefix_tokenization canonical, {extra}max_nodes 2000 "
               "LIMIT 1 FOR EACH ROW IN '" + LAMBADA + "' WHERE :row_number <> 183 LIMIT {n}")


def _long_prefix_sql(passages: int = 15, memory: str = "64MiB") -> str:
    """A 1,222-token PREFIX (the first LAMBADA passages, one after another) and a two-word
    completion, under a max_memory whose share for keys and values (half) cannot hold the
    prompt's (46 KB a token on SmolLM2): every call finds it evicted."""
    path = ROOT / LAMBADA
    if not path.exists():
        return ""
    with open(path, encoding="utf-8") as f:
        text = " ".join(json.loads(next(f))["text"] for _ in range(passages)).replace("'", "''")
    return (f"SELECT text, prob MATCHING escape('{text}') || '[.,]? [a-zA-Z]{{1,8}} [a-zA-Z]{{1,8}}' "
            f"PREFIX escape('{text}') USING topk 40, max_memory '{memory}', max_prefix_tokens 4000 LIMIT 10")


def _url_sql(batch: int) -> str:
    """The URL search (top-k 40) at ``batch`` nodes a call, stopped after 3,000 nodes: its calls
    read 32 or 256 sequences of about a dozen tokens each, mostly as padded copies."""
    from benchmarks.execute_bench import URL, URL_PREFIX
    return (f"SELECT text, prob MATCHING '{URL}' PREFIX '{URL_PREFIX}' USING topk 40, batch_size {batch}, "
            "max_nodes 3000")


# name -> (statement, seconds after which the worker stops waiting)
QUERIES = {
    "toxicity, default order": (TOXIC.format(order=""), 90),
    "toxicity, ORDER BY total_prob": (TOXIC.format(order=" ORDER BY total_prob DESC"), 120),
    "phone, canonical": (PHONE.format(tok="canonical"), 120),
    "phone, all tokenizations": (PHONE.format(tok="all"), 180),
    "LAMBADA line break, 10 passages": (LAMBADA_SQL.format(tail="\\n", extra="", n=10), 300),
    "LAMBADA end of text, 2 passages": (LAMBADA_SQL.format(tail="", extra="eos, ", n=2), 240),
    "long PREFIX, max_memory 64MiB": (_long_prefix_sql(), 900),
    "long PREFIX, max_memory 2GiB": (_long_prefix_sql(memory="2GiB"), 120),
    "URL, batch 32, 3,000 nodes": (_url_sql(32), 180),
    "URL, batch 256, 3,000 nodes": (_url_sql(256), 180),
}


def _more() -> Dict:
    """Queries that other benchmarks run through this one's workers (``versus(queries=...)``)."""
    from benchmarks.prompt_bench import PROMPTS
    return PROMPTS


# ---------------------------------------------------------------- the worker (one query, one process)


def worker(name: str) -> Dict:
    import relmql
    from relmql.records import Cancelled
    sql, budget = {**QUERIES, **_more()}[name]
    con = relmql.connect()
    model = con.model()
    con.sql("SELECT text MATCHING 'The (cat|dog)' LIMIT 1").fetchall()  # the first compile's tables
    f0, k0, t0 = model.stats.seconds, model.stats.tokens, time.perf_counter()
    first, rows, cut = None, [], False
    result = con.sql(sql)
    timer = threading.Timer(budget, result.cancel)  # a search with no row yet is stopped too
    timer.start()
    try:
        for row in result:
            rows.append([v if isinstance(v, (int, float, str)) or v is None else str(v) for v in row])
            first = first if first is not None else time.perf_counter() - t0
    except Cancelled:
        cut = True
    timer.cancel()
    wall = time.perf_counter() - t0
    stop = None if cut else getattr(result, "stopped", None)  # a cancelled result raises again when read
    return {"first": first, "wall": wall, "rows": rows, "forward": model.stats.seconds - f0, "cut": cut,
            "stop": str(stop) if stop else None, "attention": getattr(model, "attention", None),
            "tokens": model.stats.tokens - k0}


def _run_worker(name: str, code: Path, budget: float) -> Dict:
    env = dict(os.environ, PYTHONPATH=f"{code}{os.pathsep}{ROOT}")
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", name], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=budget + 120)
    except subprocess.TimeoutExpired:  # no row at all within the budget (a search that never yields)
        return {"first": None, "wall": time.perf_counter() - t0, "rows": [], "forward": None, "cut": True,
                "stop": None}
    if p.returncode:
        raise RuntimeError(f"{name} ({code}) failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _extract(revision: str, into: Path) -> None:
    """The relmql package (and its grammar) of a git revision, into a folder."""
    archive = subprocess.run(["git", "archive", revision, "relmql", "grammar"], cwd=ROOT, capture_output=True,
                             check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)


def versus(baseline: str = BASELINE, names: List[str] = None, queries: Dict = None) -> Dict:
    """Every query of ``queries`` (``QUERIES``; or those ``names``) with this checkout's relmql and
    with the baseline's, alternately."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        _extract(baseline, base)
        for name, (_, budget) in (queries or QUERIES).items():
            if names and name not in names:
                continue
            now = _run_worker(name, ROOT, budget)
            before = _run_worker(name, base, budget)
            out[name] = {"now": now, "before": before}
            print(f"{name}: now first {now['first']} wall {now['wall']:.1f}; before first {before['first']} "
                  f"wall {before['wall']:.1f}", file=sys.stderr, flush=True)
    return {"baseline": baseline, "queries": out}


# ---------------------------------------------------------------- the executor alone


class StubModel:
    """A model whose forward pass costs next to nothing, with a real vocabulary: each call's
    next-token log-probabilities are consecutive rows of a fixed table of random ones (skewed as
    a language model's are), a view, picked by the call's first sequence. A search driving it
    spends its time in the executor alone (what the stub spends is counted apart).

    With ``latency`` (seconds) it stands for a model on an accelerator: each sequence's row is
    picked by the sequence alone (gathered, as a forward pass writes its logits), and a call
    takes ``latency`` of wall time, waiting out what the gathering left without using the CPU
    (a sleep, which releases the GIL); ``stats.seconds`` is then the time the "device" was busy."""

    def __init__(self, vocabulary, rows: int = 1024, seed: int = 0, latency: float = None):
        from relmql.models.base import ModelStats
        gen = torch.Generator().manual_seed(seed)
        self.table = torch.log_softmax(torch.randn(rows, len(vocabulary), generator=gen) * 3, -1)
        self.numpy = self.table.numpy()
        self.latency = latency
        self.vocabulary, self.name, self.approximate = vocabulary, "stub", None
        self.device, self.dtype, self.stats = torch.device("cpu"), torch.float32, ModelStats()

    eos_id = property(lambda self: self.vocabulary.eos_id)
    bos_id = property(lambda self: self.vocabulary.bos_id)
    start_tokens = property(lambda self: (self.vocabulary.bos_id,))
    context = ()  # no prompt: texts start after the start token

    def set_cache_budget(self, nbytes: int) -> None:
        pass

    def _row(self, seq) -> int:
        """The table row a sequence's next token is read from (``latency`` set)."""
        return hash(tuple(seq)) % len(self.table)

    def extend(self, states, tokens):
        from relmql.models.base import ModelState
        t0 = time.perf_counter()
        seqs = [(st.tokens if st is not None else (self.bos_id,)) + tuple(new) for st, new in zip(states, tokens)]
        sizes = [len(new) for new in tokens]
        if self.latency is None:
            first = (seqs[0][-1] * 7919 + len(seqs[0])) % (len(self.table) - len(seqs))
            rows = self.table[first:first + len(seqs)]
            at = np.repeat((first + 1 + np.arange(len(seqs))) % len(self.table), sizes)  # the row each is read with
        else:  # by the sequence alone: the row it is read with, and that of each token's prefix before it
            rows = self.table[torch.tensor([self._row(seq) for seq in seqs])]
            at = np.array([self._row(seq[:len(seq) - n + i]) for seq, n in zip(seqs, sizes) for i in range(n)],
                          np.int64)
        lps = self.numpy[at, np.fromiter((t for new in tokens for t in new), np.int64, len(at))].astype(np.float64)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        lps[starts[[st is not None and n > 0 for st, n in zip(states, sizes)]]] = np.nan  # in the state extended
        out = [ModelState(toks, rows[b], lps[a:e]) for b, (toks, a, e) in enumerate(zip(seqs, starts.tolist(),
                                                                                        ends.tolist()))]
        if self.latency is not None:
            time.sleep(max(0.0, self.latency - (time.perf_counter() - t0)))
        self.stats.seconds += time.perf_counter() - t0
        self.stats.calls += 1
        self.stats.tokens += sum(len(n) for n in tokens)
        return out


STUB_CONFIGS = [(tok, batch) for tok in ("canonical", "all") for batch in (32, 256)]


def stub(tok: str, batch: int, nodes: int = 20_000, vocabulary=None) -> Dict:
    """Expanded nodes per second of the URL search (top-k 40) on a nearly free model (with
    SmolLM2's vocabulary, or ``vocabulary``), with the relmql found first on the path: one
    search, after one to warm the automaton."""
    from relmql.automata import CompileOptions, compile
    from relmql.execute import Decoding, SearchStats, ShortestPath, shortest_path
    from relmql.models import load_model

    from benchmarks.execute_bench import URL, URL_PREFIX
    model = StubModel(vocabulary or load_model("smollm2-135m").vocabulary)
    gc.freeze()  # as the shell does once a model is loaded (cli._freeze_collector)
    ta = compile(URL, model.vocabulary, URL_PREFIX, CompileOptions(tokenization=tok))
    list(shortest_path(ta, model, Decoding(topk=40), ShortestPath(batch_size=batch, max_nodes=2000)))
    stats = SearchStats()
    model.stats.seconds = 0.0
    t0 = time.perf_counter()
    for _ in shortest_path(ta, model, Decoding(topk=40), ShortestPath(batch_size=batch, max_nodes=nodes),
                           stats=stats):
        pass
    wall = time.perf_counter() - t0
    return {"nodes": stats.expanded, "seconds": wall, "nodes_per_s": stats.expanded / wall,
            "stub_seconds": model.stats.seconds}


def _in_process(code: Path, flag: str, *args) -> Dict:
    """This file run as ``flag`` (a worker: ``--stub-worker`` or ``--calls-worker``) with ``args``
    in a process of its own, with the relmql in ``code``: what it prints last, as JSON."""
    env = dict(os.environ, PYTHONPATH=f"{code}{os.pathsep}{ROOT}")
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), flag, ",".join(map(str, args))],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise RuntimeError(f"{flag} {args} with {code} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def stub_side_by_side(baseline: str, runs: int = 3) -> Dict:
    """``stub`` for each configuration, ``runs`` searches with this checkout's relmql and as many
    with that of the git revision ``baseline``, alternately, each search in a process of its own:
    this machine's speed drifts by a third within the hour, so the ratio is
    read off pairs of searches made one after the other (two executors in one process slow each
    other: the canonical search ran at 3,800 nodes/s beside the earlier one, 6,200 alone).
    Returns ``{"now": ..., "before": ...}``, each configuration's median search, its range and,
    for now, the ratios of the pairs."""
    out = {"now": {}, "before": {}}
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp)
        _extract(baseline, before)
        for tok, batch in STUB_CONFIGS:
            name = f"{tok}, batch {batch}"
            each = {"now": [], "before": []}
            for r in range(runs):
                for who in (("now", "before") if r % 2 == 0 else ("before", "now")):
                    each[who].append(_in_process(ROOT if who == "now" else before, "--stub-worker", tok, batch))
            for who, got in each.items():
                mid = sorted(got, key=lambda x: x["nodes_per_s"])[len(got) // 2]
                out[who][name] = dict(mid, runs=[x["nodes_per_s"] for x in got])
            out["now"][name]["ratios"] = sorted(a["nodes_per_s"] / b["nodes_per_s"]
                                                for a, b in zip(each["now"], each["before"]))
            print(f"stub {name}: now {out['now'][name]}; before {out['before'][name]}", file=sys.stderr,
                  flush=True)
    return out


# ---------------------------------------------------------------- a model call's work outside its forward pass

CALL_CONFIGS = [("url", 256, 3000), ("gw", 32, 2000)]  # search, nodes a call, nodes in all


def calls(which: str, batch: int, nodes: int) -> Dict:
    """The URL or GW search (top-k 40) on SmolLM2 at ``batch`` nodes a call, with the relmql
    found first on the path: per model call, the seconds outside the forward pass, and the torch
    operations issued outside it (counted by a ``TorchDispatchMode`` in a second search of half
    the nodes; on a GPU most of them would be launches or host work)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from relmql.automata import compile
    from relmql.execute import Decoding, SearchStats, ShortestPath, shortest_path
    from relmql.models import load_model

    from benchmarks.execute_bench import GW, GW_PREFIX, URL, URL_PREFIX
    model = load_model("smollm2-135m")
    gc.freeze()
    ta = compile(*((URL, model.vocabulary, URL_PREFIX) if which == "url" else (GW, model.vocabulary, GW_PREFIX)))

    def search(most: int) -> SearchStats:
        stats = SearchStats()
        for _ in shortest_path(ta, model, Decoding(topk=40), ShortestPath(batch_size=batch, max_nodes=most),
                               stats=stats):
            pass
        return stats
    search(300)  # warm the automaton
    f0, c0, t0 = model.stats.seconds, model.stats.calls, time.perf_counter()
    stats = search(nodes)
    wall, fwd, n = time.perf_counter() - t0, model.stats.seconds - f0, model.stats.calls - c0
    inside = [False]

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.ops += not inside[0]
            return func(*args, **(kwargs or {}))
    forward = model.model.forward

    def counted(*args, **kwargs):
        inside[0] = True
        try:
            return forward(*args, **kwargs)
        finally:
            inside[0] = False
    model.model.forward = counted
    c1 = model.stats.calls
    with Count():
        search(nodes // 2)
    return {"nodes": stats.expanded, "calls": n, "outside_ms": (wall - fwd) / n * 1e3,
            "ops": Count.ops / (model.stats.calls - c1)}


def calls_side_by_side(baseline: str) -> str:
    """``calls`` for each configuration, the baseline's relmql and this checkout's, as a table."""
    lines = [f"| search, nodes a call | outside the forward pass a call, `{baseline}` | now | "
             f"torch operations outside it a call, `{baseline}` | now |", "|---|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp)
        _extract(baseline, before)
        for which, batch, nodes in CALL_CONFIGS:
            b, a = (_in_process(code, "--calls-worker", which, batch, nodes) for code in (before, ROOT))
            lines.append(f"| {which.upper()}, {batch} | {b['outside_ms']:.1f} ms | {a['outside_ms']:.1f} ms | "
                         f"{b['ops']:,.0f} | {a['ops']:,.0f} |")
    return "\n".join(lines)


def run(baseline: str = BASELINE) -> Dict:
    from .setting import setting
    out = {"machine": setting().machine, "versus": versus(baseline)}
    both = stub_side_by_side(baseline)
    out["stub"], out["stub_before"] = both["now"], both["before"]
    return out


def _secs(x) -> str:
    return "—" if x is None else f"{x:.1f} s"


def first_row(r: Dict) -> str:
    """A worker's time to its first row, or why it had none: the bound that stopped it, or the
    budget that cancelled it."""
    if r["first"] is not None:
        return _secs(r["first"])
    bound = (r.get("stop") or "").partition("bound='")[2].partition("'")[0]
    return f"none ({bound} after {r['wall']:.0f} s)" if bound else f"none in {r['wall']:.0f} s"


def tables(res: Dict) -> str:
    v = res["versus"]
    lines = [f"SmolLM2-135M on cpu (float32), each query as written (no batch_size: `{v['baseline']}` expands 32 "
             "nodes a call, this checkout 32 growing to 128 while rows are far apart); each query in its own "
             f"process, this checkout's executor and that of `{v['baseline']}`"
             f"{' (before issue 17)' if v['baseline'] == BASELINE else ''} alternately.", "",
             "| query | rows | first row, before | first row, now | wall, before | wall, now | "
             "outside the forward passes, now | same rows |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in v["queries"].items():
        now, before = r["now"], r["before"]
        first_b = first_row(before)
        same = ("—" if not before["rows"] or before["cut"] else
                "yes" if [x[:-1] for x in now["rows"]] == [x[:-1] for x in before["rows"]] else "no")
        over = f"{1 - now['forward'] / now['wall']:.0%}" if now.get("forward") else "—"
        lines.append(f"| {name} | {len(now['rows'])} | {first_b} | {_secs(now['first'])} | "
                     f"{before['wall']:.1f} s{' (cut)' if before['cut'] else ''} | {now['wall']:.1f} s | {over} | "
                     f"{same} |")
    if res["stub"]:
        lines += stub_table(res["stub"], res.get("stub_before", {}), v["baseline"])
    return "\n".join(lines)


def stub_table(now: Dict, before: Dict, baseline: str) -> List[str]:
    """The executor alone: this checkout's nodes/s and the baseline's, searched alternately, and
    their ratio pair by pair."""
    runs = len(next(iter(now.values())).get("runs", [1]))
    lines = ["", "The executor alone (URL search, top-k 40, a model whose forward pass is a table lookup; "
             f"this checkout's executor and `{baseline}`'s alternately, {runs} searches each, each search in a "
             "process of its own):", "",
             f"| tokenization, batch | expanded nodes | nodes/s (median of {runs}) | range | "
             f"`{baseline}` (median) | now / then, search by search (median, range) | of which in the stub |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in now.items():
        span = f"{min(r['runs']):,.0f}–{max(r['runs']):,.0f}" if r.get("runs") else "—"
        b = before.get(name)
        was = f"{b['nodes_per_s']:,.0f}" if b else "—"
        ratios = r.get("ratios")
        ratio = (f"{ratios[len(ratios) // 2]:.2f}× ({ratios[0]:.2f}–{ratios[-1]:.2f})" if ratios else
                 f"{r['nodes_per_s'] / b['nodes_per_s']:.2f}×" if b else "—")
        lines.append(f"| {name} | {r['nodes']:,} | {r['nodes_per_s']:,.0f} | {span} | {was} | {ratio} | "
                     f"{r['stub_seconds'] / r['seconds']:.0%} |")
    return lines


def main(argv: List[str] = None) -> None:
    import argparse
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--stub-worker", help=argparse.SUPPRESS)
    p.add_argument("--calls-worker", help=argparse.SUPPRESS)
    p.add_argument("--calls", action="store_true",
                   help="only a model call's work outside its forward pass (URL at 256 nodes a call, GW at 32), "
                        "against --baseline")
    p.add_argument("--stub-only", action="store_true",
                   help="only the executor alone (the stub model), against --baseline side by side")
    p.add_argument("--runs", type=int, default=3, help="searches of each executor per configuration (--stub-only)")
    p.add_argument("--baseline", default=BASELINE, help="the git revision to compare with")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--query", action="append", choices=list(QUERIES),
                   help="only this query (repeatable), against --baseline; no stub")
    p.add_argument("--device-latency", metavar="TIME",
                   help="only the pipelined search against the serial one on a model whose calls take TIME of "
                        "device time (e.g. 20ms; benchmarks.latency_bench), at --batch")
    p.add_argument("--batch", type=int, default=256, help="nodes a model call (--device-latency)")
    args = p.parse_args(argv)
    if args.device_latency:
        from benchmarks import latency_bench
        latency_bench.main(["--device-latency", args.device_latency, "--batch", str(args.batch)]
                           + (["--json", args.json] if args.json else []))
        return
    if args.worker:
        print(json.dumps(worker(args.worker)))
        return
    if args.stub_worker:
        tok, batch = args.stub_worker.split(",")
        print(json.dumps(stub(tok, int(batch))))
        return
    if args.calls_worker:
        which, batch, nodes = args.calls_worker.split(",")
        print(json.dumps(calls(which, int(batch), int(nodes))))
        return
    if args.calls:
        print(calls_side_by_side(args.baseline))
        return
    if args.stub_only:  # the executor alone, against --baseline, side by side
        both = stub_side_by_side(args.baseline, args.runs)
        if args.json:
            Path(args.json).write_text(json.dumps(both, indent=1))
        print("\n".join(stub_table(both["now"], both["before"], args.baseline)))
        return
    if args.query:
        res = {"versus": versus(args.baseline, args.query), "stub": {}}
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=1))
        print(tables(res))
        return
    res = run(args.baseline)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    print(tables(res))


if __name__ == "__main__":
    main()
