"""LAMBADA zero-shot accuracy with four (plus two) query structures: the paper's Table 1.

Runs the statements of lambada.rql over the first rows of ../shared/data/lambada_test.jsonl
(row 183 skipped, as the paper did) and scores each row's first match against the passage's
true last word. Also measures, without searching, how often the model would let the passage end
at the true answer at all: the rank of the end-of-text token (and of a line break) right after
it, which bounds what the terminated variants can reach under top-1000 decoding.

    python -m benchmarks.paper.lambada                         # the documented run
    python -m benchmarks.paper.lambada --rows 500 --slow-rows 500 --eos-rows 500 --model gpt2
"""

from __future__ import annotations

import collections
import json
import time
from typing import Dict, List

from . import common

PAPER = {  # Table 1 of the paper: accuracy (%) on 500 examples
    "GPT-2 (paper)": {"baseline": 27.0, "words": 43.0, "terminated": 46.4, "no stop": 52.2},
    "GPT-2 XL (paper)": {"baseline": 41.6, "words": 56.6, "terminated": 65.0, "no stop": 71.0},
}
TAILS = ("", ".", '"', '."')  # the completions' optional punctuation and quote


def rows_for(name: str, args) -> int:
    """How many rows a variant runs: the searches that need a terminator are slower."""
    if args.smoke:
        return 2
    if name in ("terminated", "no stop"):
        return args.eos_rows
    if "newline" in name:
        return args.slow_rows
    return args.rows


def evaluate(con, args) -> Dict[str, Dict]:
    """Every variant's rows, accuracy and time. Each variant's results are kept in
    lambada.cache.json as soon as it ends, and one whose statement is there is not run again:
    an interrupted run goes on where it stopped (delete the file to start afresh)."""
    cache_path = common.out_dir(args) / "lambada.cache.json"
    cache = json.loads(cache_path.read_text()) if cache_path.exists() and not args.smoke else {}
    out = {}
    for name, text in common.statements(common.HERE / "lambada.rql"):
        n = rows_for(name, args)
        if n <= 0 or (getattr(args, "variants", None) and name not in args.variants.split(",")):
            continue
        assert text.rstrip(";").endswith("LIMIT 500"), "the dataset clause ends each statement"
        text = text.rstrip(";")[:-len("LIMIT 500")] + f"LIMIT {n}"
        if args.smoke:
            text = text.replace("max_nodes 2000", "max_nodes 100")
        key = f"{args.model} {args.dtype} {text}"
        if key not in cache:
            t0 = time.perf_counter()
            rows = con.sql(text).fetchall()
            cache[key] = {"rows": [{"row": r[0], "answer": r[1], "prediction": r[2], "prob": r[3]} for r in rows],
                          "seconds": time.perf_counter() - t0}
            if not args.smoke:
                cache_path.write_text(json.dumps(cache))
        out[name] = cache[key]
        hits = sum(r["answer"] == r["prediction"] for r in out[name]["rows"])
        print(f"lambada {name}: {hits}/{len(out[name]['rows'])} in {out[name]['seconds']:.0f} s", flush=True)
    return out


def terminator_ranks(con, args) -> Dict[str, List[int]]:
    """Per row: the best rank, over the completion's four punctuation tails, of the end-of-text
    token and of a line break right after the true answer (0 = the most probable token)."""
    import torch
    model = con.model()
    newline = model.vocabulary.encode("\n")[-1]
    ranks: Dict[str, List[int]] = {"end of text": [], "line break": []}
    n = 3 if args.smoke else args.rows
    path = common.DATA / "lambada_test.jsonl"
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for i, line in zip(range(n + 1), f) if i != 182][:n]
    for text in texts:
        context, answer = text.rsplit(" ", 1)
        best = {"end of text": 10**9, "line break": 10**9}
        for tail in TAILS:
            ids = [model.bos_id, *model.vocabulary.encode(context + " " + answer + tail)]
            with torch.inference_mode():
                logits = model.model(torch.tensor([ids], device=model.device)).logits[0, -1].float()
            for key, tok in (("end of text", model.eos_id), ("line break", newline)):
                best[key] = min(best[key], int((logits > logits[tok]).sum()))
        for key in ranks:
            ranks[key].append(best[key])
    return ranks


def _accuracy(rows) -> tuple:
    from relmql.stats import wilson
    hits = sum(r["answer"] == r["prediction"] for r in rows)
    lo, hi = wilson(hits, len(rows))
    return 100 * hits / len(rows), 100 * lo, 100 * hi


def plot(results: Dict[str, Dict], path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paper_names = ["baseline", "words", "terminated", "no stop"]
    ours = {"baseline": "baseline", "words": "words", "terminated": "terminated (newline)",
            "no stop": "no stop (newline)"}
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    width = 0.27
    xs = range(len(paper_names))
    for i, (label, table) in enumerate(PAPER.items()):
        ax.bar([x + (i - 1) * width for x in xs], [table[v] for v in paper_names], width, label=label,
               color=["#9ecae1", "#3182bd"][i])
    acc = [(_accuracy(results[ours[v]]["rows"]) if ours[v] in results else (0, 0, 0)) for v in paper_names]
    ax.bar([x + width for x in xs], [a[0] for a in acc], width, color="#e6550d",
           yerr=[[a[0] - a[1] for a in acc], [a[2] - a[0] for a in acc]], capsize=3,
           label="SmolLM2-135M (relmql; terminator: line break)")
    ax.set_xticks(list(xs), paper_names)
    ax.set_ylabel("accuracy (%)")
    rows = "/".join(str(len(results[ours[v]]["rows"])) if ours[v] in results else "0" for v in paper_names)
    ax.set_title(f"LAMBADA, zero-shot (paper: 500 rows each; SmolLM2: {rows} rows)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> str:
    con = common.connect(args)
    results = evaluate(con, args)
    t0 = time.perf_counter()
    ranks = terminator_ranks(con, args)
    # run time: each variant's own (cached ones included) and the ranks'
    seconds = sum(r["seconds"] for r in results.values()) + time.perf_counter() - t0
    (common.out_dir(args) / "lambada.json").write_text(json.dumps(
        {"results": results, "ranks": ranks, "seconds": seconds}))
    return report(results, ranks, args, seconds)


def report(results: Dict[str, Dict], ranks: Dict[str, List[int]], args, seconds: float) -> str:
    """The section's markdown and figure from the variants' rows and the terminator ranks."""
    figure = common.figure_path(args, "lambada.png")
    plot(results, figure)

    lines = ["| variant | rows | accuracy (%) | 95% interval | s / row | paper GPT-2 | paper GPT-2 XL |",
             "|---|---:|---:|---|---:|---:|---:|"]
    for name, res in results.items():
        acc, lo, hi = _accuracy(res["rows"])
        base = name.replace(" (newline)", "")
        paper = [f"{t[base]:.1f}" if base in t and "newline" not in name else "" for t in PAPER.values()]
        lines.append(f"| {name} | {len(res['rows'])} | {acc:.1f} | {lo:.1f}–{hi:.1f} | "
                     f"{res['seconds'] / len(res['rows']):.2f} | {paper[0]} | {paper[1]} |")
    # the largest number of first rows that all but the two slowest variants ran
    sizes = [len(r["rows"]) for r in results.values()]
    common_rows = max(n for n in sizes if sum(x >= n for x in sizes) >= len(sizes) - 2)
    same = ["", f"On the first {common_rows} rows, which these variants ran:", "",
            "| variant | accuracy (%) | stopped at max_nodes (no answer) |", "|---|---:|---:|"]
    for name, res in results.items():
        if len(res["rows"]) < common_rows:
            continue
        rows = res["rows"][:common_rows]
        misses = sum(r["prediction"] is None for r in rows)
        same.append(f"| {name} | {_accuracy(rows)[0]:.1f} | {misses} |")
    common_preds = ["", "The most common predictions (share of rows):", "",
                    "| variant | most common predictions |", "|---|---|"]
    for name, res in results.items():
        count = collections.Counter(r["prediction"] for r in res["rows"] if r["prediction"])
        top = ", ".join(f"{w} ({100 * c / len(res['rows']):.0f}%)" for w, c in count.most_common(5))
        common_preds.append(f"| {name} | {top} |")
    n = len(next(iter(ranks.values())))
    bound = ["", f"How often the passage may end at the true answer under top-1000 decoding ({n} rows; best "
             "rank over the four punctuation tails):", "",
             "| terminator after the true answer | in the top 1000 | in the top 10 | median rank |",
             "|---|---:|---:|---:|"]
    for key, rs in ranks.items():
        srt = sorted(rs)
        bound.append(f"| {key} | {100 * sum(r < 1000 for r in rs) / n:.1f}% | "
                     f"{100 * sum(r < 10 for r in rs) / n:.1f}% | {srt[n // 2]} |")
    return "\n".join([*lines, *same, *common_preds, *bound, "",
                      f"![LAMBADA accuracy]({common.link(args, figure)})", "", common.setting(args, seconds)])


def options(p) -> None:
    """This experiment's own command-line options."""
    p.add_argument("--rows", type=int, default=500, help="rows of baseline and words (default: 500)")
    p.add_argument("--slow-rows", type=int, default=100,
                   help="rows of the line-break-terminated variants (default: 100)")
    p.add_argument("--variants", help="run only these variants (names of lambada.rql, comma-separated)")
    p.add_argument("--eos-rows", type=int, default=10,
                   help="rows of the end-of-text-terminated variants (default: 10)")


def main() -> None:
    common.main_for("lambada", run, __doc__, options)


if __name__ == "__main__":
    main()
