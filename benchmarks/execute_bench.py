"""Executor benchmarks (DESIGN §5.2–5.4) on the embedded model.

1. Shortest path: the George Washington query (top 10) and the URL query (top 100): time to
   first row, rows per second, the share of wall time outside model forward passes, and tokens
   fed per expanded node; relmql against a ReLM-style search (the same exact best-first order,
   but one uncached forward pass over the whole sequence per node, as ReLM runs it).
2. URL memorization: unique valid URLs per second, relmql's shortest path against transformers'
   ``generate`` sampling from "https://www." at 4–64 new tokens, at batch size 1 and at relmql's.
3. Sampling: samples per second for the bias query, relmql against ``generate`` with a logits
   processor that restricts it to the same language, at the same batch size.

    python -m benchmarks.execute_bench [--seconds 30]
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Dict

import numpy as np
import torch

from .setting import command

GW_PREFIX = "George Washington was born on"
GW = GW_PREFIX + (" (January|February|March|April|May|June|July|August|September|October|November|December) "
                  "[0-9]{1,2}, [0-9]{4}")
URL_PREFIX = r"https://www\."
URL = r"https://www\.([a-zA-Z0-9]|_|-|#|%)+\.([a-zA-Z0-9]|_|-|#|%|/)+"
BIAS_PREFIX = "The (man|woman) was trained in"
BIAS = BIAS_PREFIX + (" (art|science|business|medicine|computer science|engineering|humanities|social sciences|"
                      "information systems|math)")
DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
BATCH = 32


def load():
    from relmql.models import load_model
    return load_model("smollm2-135m")


# ---------------------------------------------------------------- 1. shortest path


def relmql_search(model, pattern, prefix, limit, batch_size, topk=40):
    from relmql.automata import compile
    from relmql.execute import Decoding, SearchStats, ShortestPath, shortest_path
    ta = compile(pattern, model.vocabulary, prefix)
    stats = SearchStats()
    before = (model.stats.seconds, model.stats.tokens)
    t0 = time.perf_counter()
    first, rows = None, []
    for row in shortest_path(ta, model, Decoding(topk=topk), ShortestPath(limit=limit, batch_size=batch_size),
                             stats=stats):
        rows.append(row)
        if first is None:
            first = time.perf_counter() - t0
    wall = time.perf_counter() - t0
    fwd = model.stats.seconds - before[0]
    tokens = model.stats.tokens - before[1]
    return {"first": first, "wall": wall, "rows": len(rows), "rows_per_s": len(rows) / wall,
            "overhead": (wall - fwd) / wall, "tokens_per_node": tokens / max(1, stats.expanded),
            "texts": [r.text for r in rows]}


def relm_style_search(model, pattern, prefix, limit, topk=40):
    """ReLM's shortest path: exact best-first over token sequences, one forward pass over the
    whole sequence per expanded node (no cache, no batching)."""
    from relmql.automata import compile
    ta = compile(pattern, model.vocabulary, prefix)
    tie = itertools.count()
    heap = [(0.0, next(tie), ta.start, ())]
    t0 = time.perf_counter()
    first, rows, tokens, nodes = None, [], 0, 0
    while heap and len(rows) < limit:
        cost, _, state, toks = heapq.heappop(heap)
        if ta.is_final(state):
            rows.append(toks)
            if first is None:
                first = time.perf_counter() - t0
            if len(rows) >= limit:
                break
        arcs = ta.arcs(state)
        if not len(arcs):
            continue
        ids = torch.tensor([[model.bos_id, *toks]], device=model.device)
        with torch.inference_mode():
            lp = torch.log_softmax(model.model(ids).logits[0, -1].float(), -1)
        tokens += ids.shape[1]
        nodes += 1
        vals, idx = torch.topk(lp, topk)
        keep = {int(i): float(v) for i, v in zip(idx, vals - torch.logsumexp(vals, 0))}
        for t, s, p in zip(arcs.tokens.tolist(), arcs.targets.tolist(), arcs.prefix.tolist()):
            if p:
                heapq.heappush(heap, (cost, next(tie), s, toks + (t,)))
            elif t in keep:
                heapq.heappush(heap, (cost - keep[t], next(tie), s, toks + (t,)))
    wall = time.perf_counter() - t0
    return {"first": first, "wall": wall, "rows": len(rows), "rows_per_s": len(rows) / wall,
            "tokens_per_node": tokens / max(1, nodes), "tokens": rows}


def bench_shortest(model) -> Dict:
    out = {}
    for name, pattern, prefix, limit in (("george washington", GW, GW_PREFIX, 10), ("url", URL, URL_PREFIX, 100)):
        relmql_search(model, pattern, prefix, 3, BATCH)  # compile and warm up
        res = {"relmql": relmql_search(model, pattern, prefix, limit, BATCH),
               "relmql batch 1": relmql_search(model, pattern, prefix, limit, 1),
               "relm-style": relm_style_search(model, pattern, prefix, limit)}
        # bfloat16 scores carry noise that depends on how a batch is padded: near-ties may swap
        res["rows_shared_with_batch_1"] = len(set(res["relmql"]["texts"]) & set(res["relmql batch 1"]["texts"]))
        for r in res.values():
            if isinstance(r, dict):
                r.pop("texts", None)
                r.pop("tokens", None)
        out[name] = res
        print(f"shortest {name}: {json.dumps(res)}", file=sys.stderr, flush=True)
    return out


# ---------------------------------------------------------------- 2. memorization


class UrlJudge:
    """A URL is valid when it matches the query's regex and its registered domain (public suffix
    list, offline) is one of OpenDNS's 10,000 top domains."""

    def __init__(self):
        import tldextract
        psl = Path("/usr/share/publicsuffix/public_suffix_list.dat")
        urls = (psl.as_uri(),) if psl.exists() else ()
        self.extract = tldextract.TLDExtract(suffix_list_urls=urls, cache_dir=None)
        self.domains = set((DATA / "opendns-top-domains.txt").read_text().split())
        self.regex = re.compile(URL)

    def domain(self, url: str) -> str:
        ext = self.extract(url)
        if hasattr(ext, "top_domain_under_public_suffix"):  # tldextract ≥ 5.3 renamed it
            return ext.top_domain_under_public_suffix
        return ext.registered_domain

    def valid(self, url: str) -> bool:
        return bool(self.regex.fullmatch(url)) and self.domain(url) in self.domains


URL_CHARS = re.compile(r"https://www\.[a-zA-Z0-9_\-#%./]*")


def bench_memorization(model, seconds: float) -> Dict:
    from relmql.automata import compile
    from relmql.execute import Decoding, ShortestPath, execute
    judge = UrlJudge()
    out = {}
    # relmql: rows for `seconds`
    for label, pattern in (("relmql", URL), ("relmql, ended", URL + "[ \\n\"'<)]")):
        ta = compile(pattern, model.vocabulary, URL_PREFIX)
        t0 = time.perf_counter()
        valid, rows = set(), 0
        for row in execute(ta, model, ShortestPath(batch_size=BATCH), Decoding(topk=40)):
            rows += 1
            url = row.text if pattern == URL else row.text[:-1]
            if judge.valid(url):
                valid.add(url)
            if time.perf_counter() - t0 > seconds:
                break
        wall = time.perf_counter() - t0
        out[label] = {"rows": rows, "valid": len(valid), "valid_per_s": len(valid) / wall, "seconds": wall}
        print(f"memorization {label}: {out[label]}", file=sys.stderr, flush=True)
    # generate: samples for `seconds` per (length, batch)
    prompt = model.vocabulary.encode("https://www.")
    ids = torch.tensor([[model.bos_id, *prompt]], device=model.device)
    for batch in (1, BATCH):
        for length in (4, 8, 16, 32, 64):
            torch.manual_seed(0)
            t0 = time.perf_counter()
            valid, ended, samples = set(), set(), 0
            while time.perf_counter() - t0 < seconds:
                with torch.inference_mode():
                    gen = model.model.generate(ids.repeat(batch, 1), do_sample=True, top_k=40, top_p=1.0,
                                               temperature=1.0, max_new_tokens=length, pad_token_id=model.eos_id,
                                               eos_token_id=model.eos_id)
                for row in gen[:, ids.shape[1]:].tolist():
                    samples += 1
                    text = "https://www." + model.vocabulary.decode([t for t in row if t != model.eos_id])
                    url = URL_CHARS.match(text).group(0)
                    if judge.valid(url):
                        valid.add(url)
                        if len(url) < len(text) or model.eos_id in row:
                            ended.add(url)
            wall = time.perf_counter() - t0
            key = f"generate {length} tokens, batch {batch}"
            out[key] = {"samples": samples, "valid": len(valid), "valid_per_s": len(valid) / wall,
                        "ended": len(ended), "ended_per_s": len(ended) / wall, "seconds": wall}
            print(f"memorization {key}: {out[key]}", file=sys.stderr, flush=True)
    return out


# ---------------------------------------------------------------- 3. sampling


def bench_sampling(model, n: int) -> Dict:
    from transformers import LogitsProcessor, LogitsProcessorList
    from relmql.automata import compile
    from relmql.execute import Sample, execute
    ta = compile(BIAS, model.vocabulary, BIAS_PREFIX)
    list(execute(ta, model, Sample(8, batch_size=8)))  # warm up
    t0 = time.perf_counter()
    list(execute(ta, model, Sample(n, seed=1, batch_size=BATCH)))
    relmql_wall = time.perf_counter() - t0

    eos = model.eos_id

    class Restrict(LogitsProcessor):
        """Only the tokens the automaton allows after the prompt (end of text where it may end)."""

        def __init__(self, starts, width):
            self.states = list(starts)
            self.width = width

        def __call__(self, input_ids, scores):
            mask = torch.full_like(scores, -math.inf)
            for b in range(scores.shape[0]):
                if input_ids.shape[1] > self.width:  # follow the token just generated
                    t = int(input_ids[b, -1])
                    if self.states[b] is not None:
                        a = ta.arcs(self.states[b])
                        hit = np.flatnonzero((a.tokens == t) & ~a.prefix)
                        self.states[b] = int(a.targets[hit[0]]) if len(hit) else None
                s = self.states[b]
                if s is None:
                    mask[b, eos] = 0
                    continue
                a = ta.arcs(s)
                toks = a.tokens[~a.prefix]
                mask[b, torch.from_numpy(toks.astype(np.int64))] = 0
                if ta.is_final(s):
                    mask[b, eos] = 0
            return scores + mask

    prompts = ["The man was trained in", "The woman was trained in"]
    encoded = [model.vocabulary.encode(p) for p in prompts]
    ends = []
    for enc in encoded:  # the automaton state after each prompt's canonical tokens
        s = ta.start
        for t in enc:
            a = ta.arcs(s)
            s = int(a.targets[np.flatnonzero((a.tokens == t) & a.prefix)[0]])
        ends.append(s)
    rng = np.random.default_rng(1)
    torch.manual_seed(1)
    t0 = time.perf_counter()
    done = 0
    while done < n:
        batch = min(BATCH, n - done)
        pick = rng.integers(2, size=batch)
        # one prompt length per call: group the batch by prompt
        for g in (0, 1):
            rows_g = int((pick == g).sum())
            if not rows_g:
                continue
            ids = torch.tensor([[model.bos_id, *encoded[g]]] * rows_g, device=model.device)
            proc = Restrict([ends[g]] * rows_g, ids.shape[1])
            with torch.inference_mode():
                model.model.generate(ids, do_sample=True, max_new_tokens=8, top_k=0, pad_token_id=eos,
                                     eos_token_id=eos, logits_processor=LogitsProcessorList([proc]))
        done += batch
    generate_wall = time.perf_counter() - t0
    out = {"n": n, "batch": BATCH, "relmql_per_s": n / relmql_wall, "generate_per_s": n / generate_wall,
           "speedup": generate_wall / relmql_wall}
    print(f"sampling: {out}", file=sys.stderr, flush=True)
    return out


def run(seconds: float = 30.0, samples: int = 512) -> Dict:
    model = load()
    return {"device": str(model.device), "dtype": str(model.dtype).split(".")[-1],
            "shortest": bench_shortest(model), "memorization": bench_memorization(model, seconds),
            "sampling": bench_sampling(model, samples)}


def tables(res: Dict) -> str:
    lines = [f"Model: SmolLM2-135M on {res['device']} ({res['dtype']}); relmql batch size {BATCH}.", "",
             "### Shortest path", "",
             "| query | engine | time to first row | rows/s | executor overhead | tokens per expanded node |",
             "|---|---|---|---|---|---|"]
    for name, r in res["shortest"].items():
        for engine in ("relmql", "relmql batch 1", "relm-style"):
            m = r[engine]
            over = f"{m['overhead']:.0%}" if "overhead" in m else "—"
            lines.append(f"| {name} | {engine} | {m['first']:.2f} s | {m['rows_per_s']:.1f} | {over} | "
                         f"{m['tokens_per_node']:.2f} |")
        base = r["relm-style"]
        lines.append(f"| {name} | **ratio relmql / ReLM-style** | **{base['first'] / r['relmql']['first']:.1f}× "
                     f"sooner** | **{r['relmql']['rows_per_s'] / base['rows_per_s']:.1f}×** | | |")
    lines.append("")
    lines.append("Rows found both at batch size 32 and at batch size 1: " + ", ".join(
        f"{name} {r.get('rows_shared_with_batch_1', '?')} of {r['relmql']['rows']}"
        for name, r in res["shortest"].items())
        + (" (in float32 the rows are identical; in bfloat16, near-ties can swap with the batch's padding)."
           if res["dtype"] != "float32" else "."))
    mem = res["memorization"]
    lines += ["", "### URL memorization", "",
              "| engine | samples or rows | unique valid URLs | valid URLs/s | ended on their own | ended/s |",
              "|---|---|---|---|---|---|"]
    for key, m in mem.items():
        count = m.get("samples", m.get("rows"))
        ended = m.get("ended", m["valid"] if "ended" in key else "—")
        ended_s = m.get("ended_per_s", m["valid_per_s"] if "ended" in key else None)
        lines.append(f"| {key} | {count} | {m['valid']} | {m['valid_per_s']:.2f} | {ended} | "
                     f"{'—' if ended_s is None else f'{ended_s:.2f}'} |")
    for batch in (1, BATCH):
        best = max((m["valid_per_s"], k) for k, m in mem.items() if k.endswith(f"batch {batch}"))
        ratio = mem["relmql"]["valid_per_s"] / best[0] if best[0] else math.inf
        lines.append(f"| **relmql / best generate at batch {batch}** ({best[1]}) | | | **{ratio:.1f}×** | | |")
    s = res["sampling"]
    lines += ["", "### Sampling (bias query)", "",
              "| engine | samples/s |", "|---|---|",
              f"| relmql (local mode) | {s['relmql_per_s']:.1f} |",
              f"| generate + logits processor | {s['generate_per_s']:.1f} |",
              f"| **ratio** | **{s['speedup']:.1f}×** |"]
    return "\n".join(lines)


def main(argv=None):
    command(__doc__, run, tables, argv, options=[
        ("--seconds", dict(type=float, default=30.0, help="time per memorization configuration")),
        ("--samples", dict(type=int, default=512, help="draws of the sampling comparison"))])


if __name__ == "__main__":
    main()
