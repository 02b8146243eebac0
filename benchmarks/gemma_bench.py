"""The README's language examples and the cookbook's knowledge queries on Gemma 3 270M (a
SentencePiece-style tokenizer, 262,144 tokens), with canonical and with all tokenizations.

Each statement runs as a user runs it (``Connection.sql``), timed; then every row of a ranking
is scored again by one direct float32 transformers forward pass over its token sequence (top-k
applied as a sampler applies it), and every exact ``probability()`` is summed again over the
language's token sequences (``measure_bench.score``). The README's LAMBADA statement runs on
its first 20 data rows (100 in the README) to keep the run short.

    python -m benchmarks.gemma_bench [--json out.json]
"""

from __future__ import annotations

import math
import sys
import time
from typing import Dict, List

from .execute_bench import BIAS_PREFIX, DATA, GW, GW_PREFIX, URL_PREFIX
from .measure_bench import score, sequences
from .precision_bench import rule_logprobs
from .setting import command

MODEL = "gemma3-270m"
URL_QUERY = (f"SELECT rank, text, prob, tokens MATCHING 'https://www\\.([a-zA-Z0-9]|_|-)+\\.(com|org|net)' "
             f"PREFIX '{URL_PREFIX}' USING topk 40<tok> LIMIT 20")
FIELDS = "(?P<field>art|science|medicine|engineering)"
BIAS4 = "The (?P<gender>man|woman) was trained in " + FIELDS
SAMPLE_QUERY = (f"SELECT gender, field, count(*) AS n MATCHING '{BIAS4}' PREFIX '{BIAS_PREFIX}' "
                "USING seed 0<tok> SAMPLE 1000 GROUP BY gender, field TEST INDEPENDENCE OF gender, field")
PROB_QUERY = (f"SELECT gender, field, probability() AS p MATCHING '{BIAS4}' PREFIX '{BIAS_PREFIX}'<using> "
              "GROUP BY gender, field")
LAMBADA_ROWS = 20
LAMBADA_QUERY = ("SELECT avg(group(1) = last_word(:text)) AS accuracy "
                 "MATCHING escape(drop_last_word(:text)) || ' ([a-zA-Z]+)(\\.|!|\\?)?(\")?' "
                 "PREFIX escape(drop_last_word(:text)) USING topk 1000<tok> LIMIT 1 "
                 f"FOR EACH ROW IN '{DATA / 'lambada_test.jsonl'}' LIMIT {LAMBADA_ROWS}")
MONTHS = GW_PREFIX + (" (?P<month>January|February|March|April|May|June|July|August|September|October|November|"
                      "December)")
MONTHS_QUERY = f"SELECT month, probability() AS p MATCHING '{MONTHS}' PREFIX '{GW_PREFIX}'<using> GROUP BY month"
DATES_QUERY = (f"SELECT rank, text, prob, total_prob, tokens MATCHING '{GW}' PREFIX '{GW_PREFIX}' "
               "USING topk 40<tok> ORDER BY <order> DESC LIMIT 10")
ESTIMATE_QUERY = (f"SELECT probability() AS p MATCHING '{GW}' PREFIX '{GW_PREFIX}' "
                  "USING estimate_samples 500<tok>")
TRUE_DATE = GW_PREFIX + " February 22, 1732"
TRUE_QUERY = f"SELECT probability() AS p MATCHING '{TRUE_DATE}' PREFIX '{GW_PREFIX}' USING <mode>"

MODES = {"canonical": "", "all": ", tokenization all"}
FLOAT_TOLERANCE = 1e-5  # relative: float32 sums of probabilities against direct scoring (as the exact sums agree)


def fill(template: str, **parts: str) -> str:
    """``template`` with each ``<name>`` replaced (the regexes hold braces of their own)."""
    for k, v in parts.items():
        template = template.replace(f"<{k}>", v)
    return template


def _prefix_tokens(vocab, tokens, prefix: str) -> int:
    """How many of ``tokens`` spell ``prefix`` (tokens never cross the prefix's end)."""
    want = prefix.encode("utf-8")
    for k in range(len(tokens) + 1):
        if vocab.decode(tokens[:k]).encode("utf-8") == want:
            return k
    raise AssertionError(f"no token boundary after the prefix {prefix!r}")


def _check_ranking(model, rows: List[dict], topk: int, order: str = "prob") -> dict:
    """Each row's log-probability against direct scoring, and whether the rows come in order."""
    worst, inf = 0.0, 0
    values = []
    for r in rows:
        toks = list(r["tokens"])
        n = _prefix_tokens(model.vocabulary, toks, r["prefix"])
        cond, total = rule_logprobs(model, toks, n, topk)
        got = math.log(r["prob"]) if order == "prob" else math.log(r["total_prob"])
        want = cond if order == "prob" else total
        if want == -math.inf:
            inf += 1
            continue
        worst = max(worst, abs(got - want))
        values.append(got)
    return {"rows": len(rows), "max_logprob_error": worst, "in_order": values == sorted(values, reverse=True),
            "outside_topk": inf}


def _timed(con, query: str):
    t0 = time.perf_counter()
    result = con.sql(query)
    rows = result.to_dicts()
    secs = time.perf_counter() - t0
    print(f"{secs:7.1f} s  {query[:150]}", file=sys.stderr, flush=True)
    return rows, secs, result


def _exact_reference(model, pattern: str, prefix: str, tokenization: str, by: tuple) -> Dict[tuple, float]:
    """probability() summed again over the token sequences, per value of the groups ``by`` (each
    group's mean over its prefix's token paths, as probability() defines it)."""
    import re

    from relmql.automata import CompileOptions, compile
    seqs = sequences(compile(pattern, model.vocabulary, prefix, CompileOptions(tokenization=tokenization)))
    rx = re.compile(pattern)
    groups: Dict[tuple, list] = {}
    for toks, n in seqs:
        m = rx.fullmatch(model.vocabulary.decode(toks))
        groups.setdefault(tuple(m.group(k) for k in by), []).append((toks, n))
    return {g: score(model, part, 32) for g, part in sorted(groups.items())}


def _check_probabilities(rows: List[dict], by: tuple, reference: Dict[tuple, float]) -> dict:
    """relmql's probability() per group against ``reference``: the largest relative difference
    of exact sums, and how many estimates' intervals hold the exact value."""
    got = {tuple(r[k] for k in by): r["p"] for r in rows}
    exact = [abs(got[g] - v) / v for g, v in reference.items() if got[g].exact]
    # an estimate whose canonical part is summed exactly carries float32's rounding in that sum (as
    # the exact sums do), which an interval of the draws alone does not: it holds the value within it
    estimated = [got[g].low * (1 - FLOAT_TOLERANCE) <= v <= got[g].high * (1 + FLOAT_TOLERANCE)
                 for g, v in reference.items() if not got[g].exact]
    return {"checked": len(reference), "groups": len(rows), "max_rel_error": max(exact) if exact else None,
            "estimates": len(estimated), "covered": sum(estimated)}



def run() -> Dict:
    import relmql
    from relmql.errors import Error
    from relmql.models import load_model

    t0 = time.perf_counter()
    model = load_model(MODEL, dtype="float32")
    load_s = time.perf_counter() - t0
    con = relmql.connect(model=MODEL, dtype="float32")
    con.models.put(MODEL, "cpu", "float32", model)
    out: Dict[str, dict] = {"load_s": load_s}
    first = time.perf_counter()
    con.sql("SELECT text MATCHING 'a b' LIMIT 1").fetchall()  # the per-vocabulary tables, built once
    out["first_compile_s"] = time.perf_counter() - first
    for mode, tok in MODES.items():
        res: Dict[str, dict] = {}
        rows, secs, _ = _timed(con, fill(URL_QUERY, tok=tok))
        for r in rows:
            r["prefix"] = "https://www."
        res["url top 20"] = {"seconds": secs, "first": rows[0]["text"], "first_p": rows[0]["prob"],
                             **_check_ranking(model, rows, 40)}
        rows, secs, result = _timed(con, fill(SAMPLE_QUERY, tok=tok))
        res["bias sample 1000"] = {"seconds": secs, "groups": len(rows), "test": f"χ² p = {result.test.p_value:.3g}"}
        using = f" USING tokenization {mode}"
        rows, secs, _ = _timed(con, fill(PROB_QUERY, using=using))
        # over every tokenization the template has 139,602 token sequences (relmql estimates), too
        # many to score one by one: the check sums the field "art" alone
        checked = BIAS4 if mode == "canonical" else BIAS4.replace(FIELDS, "(?P<field>art)")
        ref = _exact_reference(model, checked, BIAS_PREFIX, mode, by=("gender", "field"))
        res["bias probability()"] = {"seconds": secs, **_check_probabilities(rows, ("gender", "field"), ref)}
        rows, secs, _ = _timed(con, fill(LAMBADA_QUERY, tok=tok))
        res[f"lambada {LAMBADA_ROWS} rows"] = {"seconds": secs, "accuracy": float(rows[0]["accuracy"])}
        rows, secs, _ = _timed(con, fill(MONTHS_QUERY, using=using))
        # over every tokenization the months make 24,571 token sequences (relmql estimates): the
        # check sums May, June and July (212)
        checked = MONTHS if mode == "canonical" else MONTHS.replace(MONTHS[MONTHS.index("(?P"):],
                                                                     "(?P<month>May|June|July)")
        ref = _exact_reference(model, checked, GW_PREFIX, mode, by=("month",))
        top = max(rows, key=lambda r: r["p"])
        res["months probability()"] = {"seconds": secs, "first": top["month"], "first_p": float(top["p"]),
                                       **_check_probabilities(rows, ("month",), ref)}
        rows, secs, _ = _timed(con, fill(DATES_QUERY, tok=tok, order="prob"))
        for r in rows:
            r["prefix"] = GW_PREFIX
        res["dates top 10"] = {"seconds": secs, "first": rows[0]["text"], "first_p": rows[0]["prob"],
                               **_check_ranking(model, rows, 40)}
        rows, secs, _ = _timed(con, fill(ESTIMATE_QUERY, tok=tok))
        p = rows[0]["p"]
        res["any date, estimated"] = {"seconds": secs, "p": float(p), "low": p.low, "high": p.high}
        out[mode] = res
    # the true date over every tokenization (1,777,664 token sequences on Gemma: estimated), beside
    # its one canonical tokenization (exact), which it must exceed
    rows, secs, _ = _timed(con, fill(TRUE_QUERY, mode="tokenization all"))
    canon, _, _ = _timed(con, fill(TRUE_QUERY, mode="tokenization canonical"))
    p = rows[0]["p"]
    out["true date"] = {"seconds": secs, "p": float(p), "low": p.low, "high": p.high,
                        "canonical_p": float(canon[0]["p"])}
    # prefix_tokenization all: ORDER BY prob is refused at once (every prefix path first), and
    # ORDER BY total_prob reads only the likely tokenizations of the prefix
    t0 = time.perf_counter()
    try:
        con.sql(fill(DATES_QUERY, tok=", tokenization all, prefix_tokenization all", order="prob")).fetchall()
        refusal = "(ran)"
    except Error as e:
        refusal = e.message
    out["prefix all, prob"] = {"seconds": time.perf_counter() - t0, "message": refusal}
    rows, secs, _ = _timed(con, fill(DATES_QUERY, tok=", tokenization all, prefix_tokenization all",
                                                   order="total_prob"))
    for r in rows:
        r["prefix"] = GW_PREFIX
    out["prefix all, total_prob"] = {"seconds": secs, "first": rows[0]["text"], "first_p": rows[0]["total_prob"],
                                     **_check_ranking(model, rows, 40, order="total_prob")}
    return out


def tables(r: Dict) -> str:
    lines = [f"Model loaded in {r['load_s']:.1f} s; the first canonical compile (BPE pair table over 262,144 tokens "
             f"and 514,906 merges) {r['first_compile_s']:.1f} s, once per process.", "",
             "| statement | tokenization | time | result | check against direct float32 scoring |",
             "|---|---|---|---|---|"]

    def check(v):
        if "max_logprob_error" in v:
            order = "in order" if v["in_order"] else "**out of order**"
            return f"{v['rows']} rows, {order}, max log-prob difference {v['max_logprob_error']:.1e}"
        if "checked" in v:
            parts = []
            if v["max_rel_error"] is not None:
                parts.append(f"exact sums: max relative difference {v['max_rel_error']:.1e}")
            if v["estimates"]:
                parts.append(f"estimated: {v['covered']} of {v['estimates']} 95% intervals hold the exact sum "
                             f"(within {FLOAT_TOLERANCE:.0e})")
            some = "" if v["checked"] == v["groups"] else f" ({v['checked']} of {v['groups']} groups checked)"
            return "; ".join(parts) + some
        if "canonical_p" in v:
            return f"the canonical tokenization alone: {v['canonical_p']:.4g} (exact)"
        return ""

    def result(v):
        if "first" in v:
            return f"{v['first']!r} ({v['first_p']:.4g})"
        if "accuracy" in v:
            return f"accuracy {v['accuracy']:.2f}"
        if "low" in v:
            return f"{v['p']:.4g} [{v['low']:.4g}, {v['high']:.4g}]"
        if "test" in v:
            return f"{v['groups']} groups; {v['test']}"
        if "groups" in v:
            return f"{v['groups']} groups"
        return ""

    for mode in MODES:
        for name, v in r[mode].items():
            lines.append(f"| {name} | {mode} | {v['seconds']:.1f} s | {result(v)} | {check(v)} |")
    v = r["true date"]
    lines.append(f"| true date probability() | all | {v['seconds']:.1f} s | {result(v)} | {check(v)} |")
    v = r["prefix all, prob"]
    lines.append(f"| dates top 10, ORDER BY prob | all, prefix all | {v['seconds']:.2f} s | refused: "
                 f"{v['message']} | |")
    v = r["prefix all, total_prob"]
    lines.append(f"| dates top 10, ORDER BY total_prob | all, prefix all | {v['seconds']:.1f} s | {result(v)} | "
                 f"{check(v)} |")
    return "\n".join(lines)


def main(argv=None):
    command(__doc__, run, tables, argv)


if __name__ == "__main__":
    main()
