"""Precision and the speed it costs: float32 (the default) against bfloat16 and float16.

1. Log-probability error per token against a float64 copy of SmolLM2-135M, on the first 64
   tokens of LAMBADA passages: direct transformers scoring of the whole text in each dtype, and
   relmql's own reading of the same tokens one at a time (as a search does, from cached keys and
   values).
2. Rows of two ranking queries (the README's date query at top-k 40, and month and day at top-k
   5, whose 1,320 strings direct float32 scoring ranks one by one) in each dtype against the
   ranking that direct float32 scoring gives: the rows that differ, and the largest
   log-probability error.
3. The same query at batch sizes 1, 4 and 32: are the rows the same, and by how much do the
   probabilities move?
4. Speed: the README's main job (both statements, the model loaded) in each dtype, in one run.

    python -m benchmarks.precision_bench [--json out.json]
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import torch

from .setting import command, setting

DTYPES = ("float32", "bfloat16", "float16")
DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
MONTHS = "(January|February|March|April|May|June|July|August|September|October|November|December)"
GW_PREFIX = "George Washington was born on"
GW = f"{GW_PREFIX} {MONTHS} [0-9]{{1,2}}, [0-9]{{4}}"
DAYS = f"{GW_PREFIX} {MONTHS} [0-9]{{1,2}}"


def texts(n: int = 20) -> List[str]:
    lines = (DATA / "lambada_test.jsonl").read_text(encoding="utf-8").splitlines()[:n]
    return [json.loads(line)["text"] for line in lines]


def reference_logprobs(model64, bos: int, tokens: List[int]) -> np.ndarray:
    with torch.no_grad():
        logits = model64(torch.tensor([[bos, *tokens]], dtype=torch.long)).logits[0, :-1]
    lp = torch.log_softmax(logits.double(), -1)
    return lp[torch.arange(len(tokens)), torch.tensor(tokens)].numpy()


def direct_logprobs(model, tokens: List[int]) -> np.ndarray:
    with torch.no_grad():
        logits = model.model(torch.tensor([[model.bos_id, *tokens]])).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).double()
    return lp[torch.arange(len(tokens)), torch.tensor(tokens)].numpy()


def stepwise_logprobs(model, tokens: List[int]) -> np.ndarray:
    """relmql reading the tokens one at a time, each from its parent's cached keys and values."""
    state, out = model.start(), []
    for t in tokens:
        out.append(float(state.logprobs[t]))
        state = model.extend([state], [[t]])[0]
    return np.array(out)


def token_errors(models: Dict[str, object], n_texts: int = 20, n_tokens: int = 64) -> Dict[str, dict]:
    f32 = models["float32"]
    model64 = copy.deepcopy(f32.model).double()
    out = {}
    samples = [f32.vocabulary.encode(t)[:n_tokens] for t in texts(n_texts)]
    refs = [reference_logprobs(model64, f32.bos_id, s) for s in samples]
    for name, model in models.items():
        direct = np.concatenate([direct_logprobs(model, s) - r for s, r in zip(samples, refs)])
        steps = np.concatenate([stepwise_logprobs(model, s[:16]) - r[:16] for s, r in zip(samples, refs)])
        later = np.concatenate([(direct_logprobs(model, s) - r)[1:] for s, r in zip(samples, refs)])
        out[name] = {"tokens": len(direct), "direct_median": float(np.median(np.abs(direct))),
                     "direct_p99": float(np.quantile(np.abs(direct), 0.99)), "direct_max": float(np.abs(direct).max()),
                     "after_first_max": float(np.abs(later).max()),
                     "stepwise_max": float(np.abs(steps).max()), "stepwise_tokens": len(steps)}
    return out


def rule_logprob(model, toks, n: int, topk: int) -> float:
    """The completion's log-probability (tokens ``n`` on) by direct float32 transformers scoring
    of the whole sequence, with top-k applied as a sampler applies it."""
    return rule_logprobs(model, toks, n, topk)[0]


def rule_logprobs(model, toks, n: int, topk: int) -> Tuple[float, float]:
    """``rule_logprob`` and the whole sequence's (the ``n`` prefix tokens at the model's own
    probability, the rest under top-k), from one forward pass."""
    with torch.no_grad():
        logits = model.model(torch.tensor([[model.bos_id, *toks]], device=model.device)).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    pre = sum(float(lp[i, toks[i]]) for i in range(n))
    cond = 0.0
    for i in range(n, len(toks)):
        kth = torch.topk(lp[i], topk).values[-1]
        if lp[i, toks[i]] < kth:
            return -math.inf, -math.inf
        cond += float(lp[i, toks[i]] - torch.logsumexp(lp[i].masked_fill(lp[i] < kth, -math.inf), -1))
    return cond, pre + cond


def expected_ranking(model, pattern, prefix, topk):
    """Every path of a finite language scored by ``rule_logprob``, best first: (tokens, logprob)."""
    from relmql.automata import compile
    ta = compile(pattern, model.vocabulary, prefix)
    rows = [(tuple(toks), rule_logprob(model, toks, n, topk)) for toks, n in ta.paths()]
    return sorted([r for r in rows if r[1] > -math.inf], key=lambda r: -r[1])


def query_rows(model, pattern, prefix, topk, limit=None, batch_size=32):
    """(tokens, logprob, prefix tokens) of relmql's rows."""
    from relmql.automata import compile
    from relmql.execute import Decoding, ShortestPath, shortest_path
    ta = compile(pattern, model.vocabulary, prefix)
    return [(r.tokens, r.logprob, r.prefix_tokens) for r in
            shortest_path(ta, model, Decoding(topk=topk), ShortestPath(limit=limit, batch_size=batch_size))]


def compare(rows, expected) -> dict:
    rows = [(t, lp) for t, lp, _ in rows]
    want = dict(expected)
    same_order = [t for t, _ in rows] == [t for t, _ in expected[:len(rows)]]
    missing = len({t for t, _ in expected[:len(rows)]} - {t for t, _ in rows})
    extra = len({t for t, _ in rows} - set(want))
    err = max((abs(lp - want[t]) for t, lp in rows if t in want), default=float("nan"))
    return {"rows": len(rows), "expected": len(expected[:len(rows)]) if rows else len(expected),
            "same_order": same_order, "missing": missing, "extra": extra, "max_logprob_error": err}


def ranking(models) -> Dict[str, dict]:
    f32 = models["float32"]
    out = {}
    days_expected = expected_ranking(f32, DAYS, GW_PREFIX, 5)
    for name, model in models.items():
        gw = query_rows(model, GW, GW_PREFIX, 40, limit=10)
        gw_f32 = query_rows(f32, GW, GW_PREFIX, 40, limit=10) if name != "float32" else gw
        # the date language has 13 million strings: its reference is float32 relmql's, whose
        # rows are checked against direct scoring one by one
        gw_direct = sorted(((t, rule_logprob(f32, list(t), n, 40)) for t, _, n in gw_f32), key=lambda r: -r[1])
        days = query_rows(model, DAYS, GW_PREFIX, 5)
        out[name] = {"gw": compare(gw, gw_direct), "days_top5": compare(days, days_expected),
                     "days_top5_expected": len(days_expected)}
    return out


def batch_invariance(models) -> Dict[str, dict]:
    out = {}
    for name, model in models.items():
        runs = {b: query_rows(model, DAYS, GW_PREFIX, 5, batch_size=b) for b in (1, 4, 32)}
        ref = {t: lp for t, lp, _ in runs[32]}
        same = all([t for t, _, _ in r] == [t for t, _, _ in runs[32]] for r in runs.values())
        moved = max(abs(math.exp(lp - ref[t]) - 1) for r in runs.values() for t, lp, _ in r if t in ref)
        out[name] = {"same_rows": same, "rows": {b: len(r) for b, r in runs.items()}, "max_relative_change": moved}
    return out


def main_job_seconds(models, repeats: int = 2) -> Dict[str, float]:
    import relmql
    script = (Path(__file__).resolve().parent.parent / "examples" / "birthdays.rql").read_text()
    out = {}
    for name, model in models.items():
        con = relmql.connect(model="smollm2-135m", dtype=name)
        con.models.put("smollm2-135m", "cpu", name, model)
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            for st in [s for s in script.split(";") if "SELECT" in s]:
                con.sql(st).fetchall()
            best = min(best, time.perf_counter() - t0)
        out[name] = best
    return out


def run() -> dict:
    from relmql.models import load_model
    models = {name: load_model("smollm2-135m", dtype=name) for name in DTYPES}
    # the setting too: this section may be measured apart from the others
    return {"tokens": token_errors(models), "ranking": ranking(models), "batch": batch_invariance(models),
            "seconds": main_job_seconds(models), **asdict(setting())}


def tables(r: dict) -> str:
    out = ["| dtype | tokens | median error | 99th percentile | largest | largest after the first token | "
           "largest, read one token at a time |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, e in r["tokens"].items():
        out.append(f"| {name} | {e['tokens']:,} | {e['direct_median']:.1e} | {e['direct_p99']:.1e} | "
                   f"{e['direct_max']:.1e} | {e['after_first_max']:.1e} | {e['stepwise_max']:.1e} |")
    out += ["", "| dtype | query | rows | in the order of float32 scoring | rows missing / extra | "
                "largest log-probability error |", "|---|---|---:|---|---:|---:|"]
    for name, q in r["ranking"].items():
        for key, label in (("gw", "dates, top-k 40, LIMIT 10"), ("days_top5", "month and day, top-k 5, all rows")):
            c = q[key]
            out.append(f"| {name} | {label} | {c['rows']} "
                       f"(of {c['expected'] if key == 'gw' else q['days_top5_expected']}) "
                       f"| {'yes' if c['same_order'] else 'no'} | {c['missing']} / {c['extra']} | "
                       f"{c['max_logprob_error']:.1e} |")
    out += ["", "| dtype | rows at batch 1 / 4 / 32 | the same rows | largest relative change of a probability |",
            "|---|---|---|---:|"]
    for name, b in r["batch"].items():
        rows = " / ".join(str(b["rows"][k]) for k in sorted(b["rows"], key=int))
        out.append(f"| {name} | {rows} | {'yes' if b['same_rows'] else 'no'} | {b['max_relative_change']:.1e} |")
    base = r["seconds"]["float32"]
    out += ["", f"| dtype | README main job (s, model loaded; {r['threads']} threads, CPU {r['cpu']}) | "
                "speed against float32 |", "|---|---:|---:|"]
    for name, s in r["seconds"].items():
        out.append(f"| {name} | {s:.2f} | {base / s:.2f}x |")
    return "\n".join(out)


def main(argv=None):
    command(__doc__, run, tables, argv)


if __name__ == "__main__":
    main()
