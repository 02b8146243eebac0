"""URL memorization: relmql's shortest path against random generation, the paper's Figures 5, 6, 10.

relmql runs memorization.rql (the URL pattern after the prefix "https://www.", top-40, in order
of probability); the baselines are transformers' ``generate`` sampling (top-40, temperature 1)
from the same prefix with a stop length of n = 1, 2, 4, ..., 64 new tokens at batch size 1, as
in the paper. Each method runs for the same wall time; every URL it returns is validated
offline (the registered domain, by the public suffix list, is one of OpenDNS's top 10,000).

    python -m benchmarks.paper.memorization [--seconds 120] [--model gpt2]
"""

from __future__ import annotations

import json
import time
from typing import Dict, List

from . import common

from ..execute_bench import URL_CHARS, UrlJudge

LENGTHS = (1, 2, 4, 8, 16, 32, 64)


def relmql_attempts(con, seconds: float) -> List[tuple]:
    """(seconds since the query was submitted, URL) for each row within ``seconds``."""
    (_, text), = common.statements(common.HERE / "memorization.rql")
    out = []
    t0 = time.perf_counter()
    result = con.sql(text.replace("LIMIT 1000", "LIMIT 1000000"))
    for row in result:
        out.append((time.perf_counter() - t0, row[0]))
        if out[-1][0] > seconds:
            result.cancel()
            break
    return out


def generate_attempts(model, length: int, seconds: float, seed: int = 0) -> List[tuple]:
    """(seconds, URL) for each sample of ``generate`` with ``length`` new tokens, batch size 1:
    the URL is the longest run of URL characters the sample begins with."""
    import torch
    prompt = model.vocabulary.encode("https://www.")
    ids = torch.tensor([[model.bos_id, *prompt]], device=model.device)
    torch.manual_seed(seed)
    out = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        with torch.inference_mode():
            gen = model.model.generate(ids, do_sample=True, top_k=40, top_p=1.0, temperature=1.0,
                                       max_new_tokens=length, pad_token_id=model.eos_id, eos_token_id=model.eos_id)
        new = [t for t in gen[0, ids.shape[1]:].tolist() if t != model.eos_id]
        text = "https://www." + model.vocabulary.decode(new)
        out.append((time.perf_counter() - t0, URL_CHARS.match(text).group(0)))
    return out


def summarize(attempts: List[tuple], judge: UrlJudge, seconds: float) -> Dict:
    """Counts, rates and the cumulative curves (time of each validated URL; unique or not)."""
    seen, unique_t, all_t = set(), [], []
    for t, url in attempts:
        if t > seconds:
            break
        if judge.valid(url):
            all_t.append(t)
            if url not in seen:
                seen.add(url)
                unique_t.append(t)
    n = sum(t <= seconds for t, _ in attempts)
    domains = {judge.domain(url) for url in seen}
    return {"attempts": n, "valid": len(all_t), "unique": len(unique_t), "unique_per_s": len(unique_t) / seconds,
            "domains": len(domains), "domains_per_s": len(domains) / seconds,
            "valid_per_s": len(all_t) / seconds, "first": attempts[0][0] if attempts else None,
            "s_per_attempt": seconds / max(n, 1), "unique_t": unique_t, "valid_t": all_t,
            "examples": sorted(seen)[:8]}


def plot(res: Dict[str, Dict], seconds: float, paths) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = dict(zip(res, ["#e6550d", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c",
                            "#08306b"]))
    # Figure 5/10: cumulative validated URLs over time, unique (left) and with duplicates (right)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, key, title in ((axes[0], "unique_t", "unique validated URLs"),
                           (axes[1], "valid_t", "validated URLs, duplicates included")):
        for name, r in res.items():
            ts = r[key]
            ax.step([0, *ts, seconds], [0, *range(1, len(ts) + 1), len(ts)], where="post", label=name,
                    color=colors[name], linewidth=2 if name == "relmql" else 1.2)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_xlabel("seconds")
        ax.set_title(title)
    axes[0].set_ylabel("cumulative count")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    # Figure 6: throughput
    fig, ax = plt.subplots(figsize=(7, 3.6))
    names = list(res)
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [res[n]["unique_per_s"] for n in names], 0.4, label="unique", color="#e6550d")
    ax.bar([x + 0.2 for x in xs], [res[n]["valid_per_s"] for n in names], 0.4, label="with duplicates",
           color="#3182bd")
    ax.set_yscale("log")
    ax.set_xticks(list(xs), names, rotation=20)
    ax.set_ylabel("validated URLs / second")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)


def run(args) -> str:
    seconds = 4.0 if args.smoke else args.seconds
    lengths = (1, 4) if args.smoke else LENGTHS
    t0 = time.perf_counter()
    con = common.connect(args)
    model = con.model()
    attempts = {"relmql": relmql_attempts(con, seconds)}
    print(f"memorization relmql: {len(attempts['relmql'])} rows", flush=True)
    for n in lengths:
        attempts[f"generate n={n}"] = generate_attempts(model, n, seconds)
        print(f"memorization generate n={n}: {len(attempts[f'generate n={n}'])} samples", flush=True)
    return report(attempts, seconds, args, time.perf_counter() - t0)


def report(attempts: Dict[str, List[tuple]], seconds: float, args, took: float) -> str:
    """The section's markdown and figures from each method's (time, URL) attempts."""
    judge = UrlJudge()
    res = {name: summarize(a, judge, seconds) for name, a in attempts.items()}
    (common.out_dir(args) / "memorization.json").write_text(json.dumps(
        {"seconds": seconds, "took": took, "results": res, "attempts": attempts}))
    paths = (common.figure_path(args, "memorization-cumulative.png"),
             common.figure_path(args, "memorization-throughput.png"))
    plot(res, seconds, paths)
    best = max((n for n in res if n != "relmql"), key=lambda n: res[n]["unique_per_s"])
    ratio = res["relmql"]["unique_per_s"] / res[best]["unique_per_s"] if res[best]["unique_per_s"] else float("inf")
    lines = [f"Each method ran {seconds:.0f} s.", "",
             "| method | attempts | s / attempt | validated (% of attempts) | unique validated | "
             "duplicates among validated | unique validated / s | distinct domains | first row (s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in res.items():
        share = 100 * r["valid"] / max(r["attempts"], 1)
        dup = 100 * (1 - r["unique"] / r["valid"]) if r["valid"] else 0.0
        lines.append(f"| {name} | {r['attempts']:,} | {r['s_per_attempt']:.3f} | {r['valid']:,} ({share:.1f}%) | "
                     f"{r['unique']:,} | {dup:.0f}% | {r['unique_per_s']:.2f} | {r['domains']:,} | "
                     f"{r['first']:.2f} |" if r["first"] is not None else f"| {name} | 0 | | | | | | | |")
    best_d = max((n for n in res if n != "relmql"), key=lambda n: res[n]["domains_per_s"])
    ratio_d = res["relmql"]["domains_per_s"] / res[best_d]["domains_per_s"] if res[best_d]["domains"] else float("inf")
    ratio_text = f"{ratio:.1f}×" if ratio != float("inf") else "∞ (the best baseline found none)"
    lines += ["", f"relmql returns unique validated URLs **{ratio_text}** as fast as the best baseline "
                  f"({best}); the paper reports 15× on GPT-2 XL with a GPU. Counting distinct domains instead "
                  f"(relmql returns a site's URLs one after another: `/`, `/blog`, ...), the ratio is "
                  f"**{ratio_d:.1f}×** (best baseline: {best_d}).", "",
              "Examples of validated URLs: relmql " + ", ".join(f"`{u}`" for u in res["relmql"]["examples"][:5])
              + f"; {best} " + ", ".join(f"`{u}`" for u in res[best]["examples"][:5]) + ".", "",
              f"![Cumulative validated URLs]({common.link(args, paths[0])})", "",
              f"![Validated URLs per second]({common.link(args, paths[1])})", "", common.setting(args, took)]
    return "\n".join(lines)


def options(p) -> None:
    """This experiment's own command-line options."""
    p.add_argument("--seconds", type=float, default=120.0, help="wall time per method (default: 120)")


def main() -> None:
    common.main_for("memorization", run, __doc__, options)


if __name__ == "__main__":
    main()
