"""Gender bias over fields of study: the paper's Figures 7, 13 and 14 and their χ² tests.

Runs the statements of bias.rql: for each configuration (canonical / all tokenizations, with
or without one character edit, with or without the prefix), ReLM-style sampled counts per
gender and field with the χ² test of independence, and the exact (or, for the edit languages,
unbiasedly estimated) probability of each field given the gender.

    python -m benchmarks.paper.bias [--model gpt2] [--smoke]
"""

from __future__ import annotations

import json
import time
from typing import Dict, List

from . import common

CONFIGS = ("canonical", "all", "canonical, edits", "all, edits")
PREFIXES = ("prefix", "no prefix")
PAPER_P = {  # the paper's reported p-values (GPT-2 XL), where it gives them
    ("all", "no prefix"): "~1e-18", ("canonical", "prefix"): "1e-229", ("canonical, edits", "prefix"): "1e-54",
}


def measure(con, args) -> Dict[str, List[dict]]:
    """Rows of every statement of bias.rql, by name. Each statement's rows are kept in
    bias.cache.json as soon as it ends, and a statement whose text is there is not run again:
    an interrupted run goes on where it stopped (delete the file to start afresh)."""
    cache_path = common.out_dir(args) / "bias.cache.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() and not args.smoke else {}
    key = f"{args.model} {args.dtype}"
    out = {}
    for name, text in common.statements(common.HERE / "bias.rql"):
        if args.smoke:  # few draws; languages of more than 200 sequences estimated from 40 draws
            text = text.replace("SAMPLE 5000", "SAMPLE 40").replace("SAMPLE 10000", "SAMPLE 80")
            text = text.replace("SAMPLE 1000", "SAMPLE 40")
            if name.startswith("exact"):
                text = text.replace("estimate_samples 10000, ", "")
                text = text.replace("seed 0", "seed 0, exact_limit 200, estimate_samples 40")
        if f"{key} {text}" in cache:
            rows = cache[f"{key} {text}"]
        else:
            t0 = time.perf_counter()
            rows = con.sql(text).to_dicts()
            for r in rows:  # an Estimate's interval, kept through JSON
                if "p" in r:
                    r["p_low"], r["p_high"] = getattr(r["p"], "low", r["p"]), getattr(r["p"], "high", r["p"])
                    r["p_exact"] = bool(getattr(r["p"], "exact", True))
                    r["p"] = float(r["p"])
            print(f"bias {name}: {len(rows)} rows in {time.perf_counter() - t0:.0f} s", flush=True)
            if not args.smoke:
                cache[f"{key} {text}"] = rows
                cache_path.write_text(json.dumps(cache))
        if rows:
            out[name] = rows
    return out


def sampled(out, config: str, prefix: str) -> List[dict]:
    """The sampled counts of a configuration: both genders' statements together."""
    if prefix == "prefix":
        return out.get(f"sampled | {config} | prefix | man", []) + out.get(f"sampled | {config} | prefix | woman", [])
    return out.get(f"sampled | {config} | no prefix", [])


def conditional(rows: List[dict], value: str) -> Dict[tuple, float]:
    """P(field | gender) from rows of gender, field and ``value`` (counts or probabilities);
    rows of the same cell add up (an edited prefix can land in the other gender's cell)."""
    from relmql.stats import contingency
    if not rows:
        return {}
    genders, fields, table = contingency(rows, "gender", "field", value)
    return {(g, f): table[i, j] / table[i].sum() for i, g in enumerate(genders) for j, f in enumerate(fields)
            if table[i].sum() > 0}


def plot(out, path) -> None:
    """Figure 7's panels: per configuration, sampled and exact P(field | gender) by gender."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fields = sorted({r["field"] for rows in out.values() for r in rows if r.get("field")})
    fig, axes = plt.subplots(2, 4, figsize=(16, 7), sharex=True)
    x = np.arange(len(fields))
    approx = estimated(out)
    for i, prefix in enumerate(PREFIXES):
        for j, config in enumerate(CONFIGS):
            ax = axes[i][j]
            counts = conditional(sampled(out, config, prefix), "n")
            name = f"exact | {config} | {prefix}"
            exact = conditional(out.get(name, []), "p")
            style = "k_" if name not in approx else "kx"
            for k, (gender, color) in enumerate((("man", "#3182bd"), ("woman", "#e6550d"))):
                ax.bar(x + (k - 0.5) * 0.4, [counts.get((gender, f), 0) for f in fields], 0.4, color=color,
                       alpha=0.8, label=f"{gender}, sampled")
                ax.plot(x + (k - 0.5) * 0.4, [exact.get((gender, f), np.nan) for f in fields], style,
                        markersize=9 if style == "k_" else 5,
                        label=("exact" if style == "k_" else "estimated") if k == 0 else None)
            ax.set_title(f"{config}, {prefix}", fontsize=10)
            ax.set_yscale("log")
            ax.set_ylim(1e-4, 1)
            ax.set_xticks(x, fields, rotation=70, fontsize=8)
            if j == 0:
                ax.set_ylabel("P(field | gender)")
    axes[0][0].legend(fontsize=8)
    axes[0][1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args) -> str:
    t0 = time.perf_counter()
    con = common.connect(args)
    out = measure(con, args)
    seconds = time.perf_counter() - t0
    figure = common.figure_path(args, "bias.png")
    plot(out, figure)
    (common.out_dir(args) / "bias.json").write_text(json.dumps(out, default=float))
    return report(out, args, figure, seconds)


def estimated(out: Dict[str, List[dict]]) -> List[str]:
    """The probability statements whose language was too large to sum: estimated from draws."""
    return [n for n, rows in out.items() if n.startswith("exact") and not all(r["p_exact"] for r in rows)]


def report(out: Dict[str, List[dict]], args, figure, seconds: float) -> str:
    """The section's markdown from the statements' rows."""
    from relmql.stats import chi2_independence, format_p
    approx = estimated(out)
    table = ["| configuration | prefix | draws (man / woman) | χ² p-value, sampled | Cramér's V | "
             "p-value, exact probabilities (5,000 per gender) | paper (GPT-2 XL) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for prefix in PREFIXES:
        for config in CONFIGS:
            rows = sampled(out, config, prefix)
            if not rows:
                continue
            per = {g: sum(r["n"] for r in rows if r["gender"] == g) for g in ("man", "woman")}
            test = chi2_independence(rows, "gender", "field", weight="n")
            exact = out.get(f"exact | {config} | {prefix}")
            if exact and f"exact | {config} | {prefix}" in approx:
                ex_p = "(estimated)"
            elif exact:
                weights = conditional(exact, "p")
                ex_rows = [{"gender": g, "field": f, "w": w} for (g, f), w in weights.items()]
                ex = chi2_independence(ex_rows, "gender", "field", weight="w", n_per_row=5000)
                ex_p = format_p(ex.p_value)
            else:
                ex_p = ""
            table.append(f"| {config} | {prefix} | {per['man']:,} / {per['woman']:,} | {format_p(test.p_value)} | "
                         f"{test.cramers_v:.3f} | {ex_p} | {PAPER_P.get((config, prefix), '')} |")

    fields = sorted({r["field"] for rows in out.values() for r in rows if r.get("field")})
    detail = ["", "P(field | gender) in % — sampled (ReLM-style draws) / exact, per configuration:", ""]
    for prefix in PREFIXES:
        head = "| field | " + " | ".join(f"{c}: man | {c}: woman" for c in CONFIGS) + " |"
        detail += [f"**{prefix}**", "", head, "|---|" + "---:|" * (2 * len(CONFIGS))]
        columns = []  # per configuration: sampled and exact P(field | gender), and the estimate mark
        for config in CONFIGS:
            name = f"exact | {config} | {prefix}"
            columns.append((conditional(sampled(out, config, prefix), "n"), conditional(out.get(name, []), "p"),
                            "≈" if name in approx else ""))
        for f in fields:
            cells = []
            for counts, exact, mark in columns:
                for g in ("man", "woman"):
                    e = exact.get((g, f))
                    cells.append(f"{100 * counts.get((g, f), 0):.1f} / " + (f"{mark}{100 * e:.1f}" if e is not None
                                                                          else "–"))
            detail.append(f"| {f} | " + " | ".join(cells) + " |")
        detail.append("")
    note = ("Exact probabilities are sums over every token sequence of the configuration's language. "
            + (f"The languages of {'; '.join(n.split(' | ', 1)[1] for n in approx)} have more token sequences "
               "than `exact_limit` (10,000): their values (marked ≈) are estimated from 10,000 draws of the "
               "model's own distribution (rejection), with Wilson intervals in docs/paper/bias.json; – means "
               "no draw fell in that cell. Their p-value column is left empty: a χ² test on estimates would "
               "test the estimates' noise as well." if approx else "None was estimated.")
            + " Without the prefix only the canonical language is summed: the others have too many token "
              "sequences to sum, and from the start of text the strings are too improbable for rejection.")
    return "\n".join([*table, *detail, note, "", f"![Bias]({common.link(args, figure)})", "",
                      common.setting(args, seconds)])


def options(p) -> None:
    """This experiment's own command-line options (none)."""


def main() -> None:
    common.main_for("bias", run, __doc__, options)


if __name__ == "__main__":
    main()
