"""A fixed set of real queries whose results must not change when the code is reorganized (issue 57):
each query's columns, rows (floats to the last bit), notes, verdict and error, one JSON line each.

    python tools/reference.py --out before.jsonl           # at the commit before the change
    python tools/reference.py --out after.jsonl            # after it
    python tools/reference.py --compare before.jsonl after.jsonl

Every query runs on tiny-gpt2 and SmolLM2-135M (float32, CPU), one connection each.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from typing import Any, Dict, Iterator, List, Tuple

MODELS = ("tiny-gpt2", "smollm2-135m")
LANG = "(?P<det>The|A) (?P<animal>cat|dog|bird) (?P<verb>sat|ran)"
BIAS = "The (?P<gender>man|woman) was trained in (?P<field>art|science|math)"


def queries() -> Iterator[str]:
    """The reference queries: rankings, samples, probabilities, groups, tests, verdicts, errors."""
    prefixes = ("", " PREFIX 'The'", " PREFIX 'The (cat|dog)'")
    usings = ("", " USING topk 5", " USING eos", " USING tokenization all", " USING edits 1",
              " USING temperature 0.7, topp 0.9")
    for prefix, using in itertools.product(prefixes, usings):  # 18 rankings
        yield f"SELECT text, prob, total_prob, tokens MATCHING '{LANG}'{prefix}{using} LIMIT 5"
    for prefix, using in itertools.product(prefixes[:2], usings):  # 12 probabilities
        yield f"SELECT probability() MATCHING '{LANG}'{prefix}{using}"
    for using in usings[:1] + usings[3:]:  # 4 sampled (tiny-gpt2 never draws a string under top-k 5 or eos)
        yield (f"SELECT text, prob, weight MATCHING '{LANG}' PREFIX 'The'"
               f"{using + ',' if using else ' USING'} seed 3 SAMPLE 8")
    for keys in ("animal", "det, verb", "animal, verb"):  # 3 groups
        yield f"SELECT {keys}, probability(), count(*) MATCHING '{LANG}' PREFIX '(The|A)' GROUP BY {keys}"
    for pattern in (" [0-9]{1,3}", " [a-z]+", " (yes|no)+", " [A-Z][a-z]{2,5}", " https?://[a-z]{2,6}\\.com"):
        for prefix in ("Once upon a time", "The number is"):  # 10 open languages, ranked and measured
            yield f"SELECT text, prob MATCHING '{pattern}' PROMPT '{prefix}' LIMIT 4"
            yield f"SELECT probability() AS p MATCHING '{pattern}' PROMPT '{prefix}' USING estimate_samples 50"
    yield (f"SELECT gender, field, count(*) AS n MATCHING '{BIAS}' PREFIX 'The (man|woman) was trained in' "
           "USING seed 1 SAMPLE 60 GROUP BY gender, field TEST INDEPENDENCE OF gender, field")
    yield (f"SELECT gender, field, probability() AS p MATCHING '{BIAS}' PREFIX 'The (man|woman) was trained in' "
           "GROUP BY gender, field TEST INDEPENDENCE OF gender, field")
    for cond in ("text = 'The cat sat'", "prob > 0.5", "text <> ''"):  # 3 verdicts
        yield f"SELECT text, prob MATCHING '{LANG}' PREFIX 'The' LIMIT 1 EXPECT {cond}"
    yield f"SELECT probability() AS p MATCHING '{LANG}' PREFIX 'The' EXPECT p < 0.5"
    for where in ("prob > 0.01", "verb = 'sat'", "text <> 'The dog ran'"):  # 3 filters
        yield f"SELECT text, prob MATCHING '{LANG}' WHERE {where} LIMIT 3"
    for order in ("prob DESC", "total_prob DESC"):
        yield f"SELECT text, prob MATCHING '{LANG}' ORDER BY {order} LIMIT 4"
    yield f"SELECT text, prob MATCHING '{LANG}' USING max_nodes 3 LIMIT 12"  # a stop
    yield "SELECT text MATCHING ' [a-z]{200}' USING max_tokens 5 LIMIT 1"  # no row, said why
    yield "EXPLAIN SELECT probability() MATCHING ' [a-z]+' PROMPT 'Hello'"
    yield "SELECT text, prob MATCHING '(Paris|London)' PROMPT chat('user', 'The capital of France?') USING eos LIMIT 2"
    yield "SELECT model, text, prob FROM tiny-gpt2, smollm2-135m MATCHING ' (cat|dog)' PROMPT 'The' LIMIT 2"
    for bad in ("SELECT text MATCHING '(' LIMIT 1", "SELECT nosuch MATCHING 'a'",
                "SELECT text MATCHING 'a' USING topk 0",
                "SELECT text MATCHING 'abc' PREFIX 'x'", "SELECT probability() MATCHING 'a' LIMIT 3"):
        yield bad  # 5 errors


def _plain(v: Any) -> Any:
    """A value as JSON holds it to the last bit: floats as hex, estimates with their interval."""
    from relmql.stats import Estimate
    if isinstance(v, Estimate):
        return {"value": float(v).hex(), "low": v.low.hex(), "high": v.high.hex(), "exact": v.exact, "draws": v.draws}
    if isinstance(v, float):
        return v.hex()
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v if isinstance(v, (str, int, bool)) or v is None else repr(v)


def run(con, model: str, sql: str) -> Dict[str, Any]:
    import relmql
    out: Dict[str, Any] = {"model": model, "query": sql}
    try:
        r = con.sql(sql)
        out["columns"] = list(r.columns)
        out["rows"] = [_plain(list(row)) for row in r.fetchall()]
        if getattr(r, "test_plan", None) is not None:
            t = r.test
            out["test"] = [t.statistic.hex(), t.p_value.hex(), t.dof]
        if getattr(r, "expects", None):
            v = r.verdict
            out["verdict"] = [v.status, v.kind, v.value, v.draws]
        out["notes"] = list(r.notes)
    except relmql.Error as e:
        out["error"] = e.render()
    return out


def compare(before: str, after: str) -> int:
    a = [json.loads(line) for line in open(before, encoding="utf-8")]
    b = [json.loads(line) for line in open(after, encoding="utf-8")]
    if len(a) != len(b):
        print(f"{len(a)} results before, {len(b)} after")
        return 1
    differ: List[Tuple[str, str]] = [(x["model"], x["query"]) for x, y in zip(a, b) if x != y]
    for model, q in differ:
        print(f"differs [{model}]: {q}")
    print(f"{len(a) - len(differ)} of {len(a)} results identical")
    return 1 if differ else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="write the results here, one JSON line each")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = p.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        p.error("give --out FILE or --compare BEFORE AFTER")
    started = time.perf_counter()
    items = list(queries())
    with open(args.out, "w", encoding="utf-8") as f:
        for model in MODELS:
            import relmql
            con = relmql.connect(model=model, dtype="float32", progress=False)  # no query SETs: one serves all
            for q in items:
                f.write(json.dumps(run(con, model, q)) + "\n")
    print(f"{len(items)} queries × {len(MODELS)} models in {time.perf_counter() - started:.0f} s → {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
