"""probability() benchmarks on the embedded model: exact sums against scoring every token
sequence with transformers, and the cost of an estimate.

1. Exact: relmql's ``probability()`` (one traversal of the token tree: shared prefixes read
   once, batched) against scoring each token sequence of the language on its own — one forward
   pass per sequence, as a script looping over the strings would — and against the same scoring
   in padded batches of 32. Both must give the same total.
2. Estimate: the probability of any well-formed date after "George Washington was born on"
   (13.2 million strings), from 1000 draws: draws per second and the interval's relative width.

In float32: in bfloat16, scoring the same sequences padded in a batch or one by one differs by
up to 20% (the date's probability moves from 0.0039 to 0.0051), which would hide the check that
relmql's sum is the same number.

    python -m benchmarks.measure_bench [--json out.json]
"""

from __future__ import annotations

import math
import time
from typing import Dict, List, Tuple

import torch

from .setting import command
from .execute_bench import BIAS, BIAS_PREFIX, GW, GW_PREFIX

CASES = {
    "bias template, canonical (20 strings)": (BIAS, BIAS_PREFIX, "canonical"),
    "true date, all tokenizations": (GW_PREFIX + " February 22, 1732", GW_PREFIX, "all"),
}
BATCH = 32


def sequences(automaton) -> List[Tuple[Tuple[int, ...], int]]:
    """Every (tokens, number of prefix tokens) of a finite token automaton; none may begin with
    another (then every sequence counts, and summing them all is the reference)."""
    out = list(automaton.paths())
    starts = {(toks[:k], n) for toks, n in out for k in range(n, len(toks))}
    assert not starts & set(out), "a sequence begins with another: the reference would count both"
    return out


@torch.inference_mode()
def score(model, seqs, batch: int) -> float:
    """Σ P(completion | prefix) of ``seqs`` over the number of prefix token paths (a PREFIX with
    several paths gives their mean, as probability() does), scoring ``batch`` padded sequences per
    forward pass."""
    hf, total = model.model, 0.0
    for k in range(0, len(seqs), batch):
        part = seqs[k:k + batch]
        width = 1 + max(len(t) for t, _ in part)
        ids = torch.zeros((len(part), width), dtype=torch.long)
        mask = torch.zeros((len(part), width), dtype=torch.long)
        for b, (toks, _) in enumerate(part):
            ids[b, :1 + len(toks)] = torch.tensor([model.bos_id, *toks])
            mask[b, :1 + len(toks)] = 1
        lp = torch.log_softmax(hf(input_ids=ids.to(model.device), attention_mask=mask.to(model.device)).logits.float(),
                               -1)
        for b, (toks, npre) in enumerate(part):
            total += math.exp(sum(float(lp[b, i, toks[i]]) for i in range(npre, len(toks))))
    return total / len({toks[:npre] for toks, npre in seqs})


def session(model):
    import relmql
    con = relmql.connect(dtype="float32")
    con.models.put("smollm2-135m", "cpu", "float32", model)
    return con


def bench_exact(model) -> Dict:
    from relmql.automata import CompileOptions, compile
    con = session(model)
    out = {}
    for name, (pattern, prefix, tok) in CASES.items():
        seqs = sequences(compile(pattern, model.vocabulary, prefix, CompileOptions(tokenization=tok)))
        query = f"SELECT probability() MATCHING '{pattern}' PREFIX '{prefix}' USING tokenization {tok}"
        con.sql(query).fetchall()  # warm: compile caches, first-call costs
        t0 = time.perf_counter()
        p = float(con.sql(query).fetchone()[0])
        t_relmql = time.perf_counter() - t0
        t0 = time.perf_counter()
        one = score(model, seqs, 1)
        t_one = time.perf_counter() - t0
        t0 = time.perf_counter()
        batched = score(model, seqs, BATCH)
        t_batched = time.perf_counter() - t0
        out[name] = {"sequences": len(seqs), "p": p, "relmql_s": t_relmql, "one_by_one_s": t_one,
                     "batched_s": t_batched, "agreement": max(abs(p - one), abs(p - batched)) / max(p, 1e-300)}
    return out


def bench_estimate(model, draws: int = 1000) -> Dict:
    con = session(model)
    query = f"SELECT probability() MATCHING '{GW}' PREFIX '{GW_PREFIX}' USING estimate_samples {draws}"
    t0 = time.perf_counter()
    p = con.sql(query).fetchone()[0]
    seconds = time.perf_counter() - t0
    return {"draws": draws, "p": float(p), "low": p.low, "high": p.high, "seconds": seconds,
            "draws_per_s": draws / seconds}


def run() -> Dict:
    from relmql.models import load_model
    model = load_model("smollm2-135m", dtype="float32")
    return {"device": str(model.device), "dtype": str(model.dtype).split(".")[-1], "exact": bench_exact(model),
            "estimate": bench_estimate(model)}


def tables(res: Dict) -> str:
    lines = [f"Model: SmolLM2-135M on {res['device']} ({res['dtype']}).", "",
             "| language | token sequences | P (relmql) | relmql | one sequence per pass | batches of 32 | "
             "relmql vs one by one | relmql vs batched | relative difference |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in res["exact"].items():
        lines.append(f"| {name} | {r['sequences']} | {r['p']:.4g} | {r['relmql_s']:.2f} s | {r['one_by_one_s']:.2f} s"
                     f" | {r['batched_s']:.2f} s | **{r['one_by_one_s'] / r['relmql_s']:.1f}×** | "
                     f"**{r['batched_s'] / r['relmql_s']:.1f}×** | {r['agreement']:.1e} |")
    e = res["estimate"]
    lines += ["", f"Estimate of P(any well-formed date | \"{GW_PREFIX}\"), 13.2 million strings: {e['p']:.4f} "
                  f"[{e['low']:.4f}, {e['high']:.4f}] from {e['draws']} draws in {e['seconds']:.1f} s "
                  f"({e['draws_per_s']:.0f} draws/s; the interval is ±{(e['high'] - e['low']) / 2 / e['p']:.1%} of "
                  f"the value)."]
    return "\n".join(lines)


def main(argv=None):
    command(__doc__, run, tables, argv)


if __name__ == "__main__":
    main()
