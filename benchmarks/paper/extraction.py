"""Extraction with edits (the paper's §4.3, Figure 8), on licence boilerplate instead of insults.

The paper grepped The Pile for sentences containing one of six insults (2,807 sentences) and
asked how often a model can be made to produce them under top-k 40 sampling: with the prefix of
the sentence given (prompted: the search succeeds when it finds at least one string), and with
nothing given (unprompted: how many distinct token sequences can be extracted per sentence). The
baseline takes the canonical tokenization and the exact text; relmql every tokenization and one
character edit. The paper found 27% vs 91% prompted success (2.5x) and 93x more unprompted
extractions per input.

Here the corpus is the licence texts on this machine (/usr/share/common-licenses and the licence
files of the installed Python packages), mined at run time with a regex for six disclaimer words
(see ``WORDS``); nothing mined is stored in the repository. The statements are in
``extraction.rql`` beside this file.

    python -m benchmarks.paper.extraction                 # docs/paper/extraction.md + figures
    python -m benchmarks.paper.extraction --inputs 40 --cap 100
    python -m benchmarks.paper.extraction --smoke         # three sentences, small caps
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import json
import os
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from . import common

RQL = common.HERE / "extraction.rql"

#: The six target words, case-insensitively and as whole words. They are the words of the
#: disclaimer clauses nearly every licence carries -- "WITHOUT ANY WARRANTY", "the implied
#: warranties of MERCHANTABILITY and FITNESS FOR A PARTICULAR PURPOSE", "NON-INFRINGEMENT",
#: "IN NO EVENT SHALL ... BE LIABLE FOR ANY ... DAMAGES", "LIMITATION OF LIABILITY": frequent in
#: licence text (as insults are in web text), in both the upper-case disclaimers and ordinary
#: prose, so the model has seen them in many contexts. Inflections the clauses use
#: (warranties, liable) count as the same word.
WORDS = r"(?i)\b(warrant(?:y|ies)|merchantability|fitness|liab(?:le|ility)|infringement|damages)\b"

COMMON_LICENSES = "/usr/share/common-licenses"
LICENSE_FILE = re.compile(r"^(LICEN[CS]E|COPYING)", re.IGNORECASE)


def corpus_files(packages: bool = True) -> list[Path]:
    """The corpus: every file of /usr/share/common-licenses (symbolic links to the same file
    once), then, with ``packages``, the LICENSE*/LICENCE*/COPYING* files of the installed
    packages' ``*.dist-info`` folders (of the Python running this), each list sorted by path."""
    out: list[Path] = []
    seen = set()
    for p in sorted(glob.glob(os.path.join(COMMON_LICENSES, "*"))):
        real = os.path.realpath(p)
        if os.path.isfile(real) and real not in seen:
            seen.add(real)
            out.append(Path(real))
    if packages:
        import sysconfig
        site = sysconfig.get_paths()["purelib"]
        found = []
        for p in glob.glob(os.path.join(site, "*.dist-info", "**", "*"), recursive=True):
            real = os.path.realpath(p)
            if os.path.isfile(real) and LICENSE_FILE.match(os.path.basename(p)) and real not in seen:
                seen.add(real)
                found.append(Path(real))
        out += sorted(found)
    return out


def sentences(text: str) -> Iterable[str]:
    """The sentences of a text: comment and bullet marks at the start of lines ('*', '#', '//',
    '-') dropped, paragraphs split at blank lines, whitespace runs made one space, then split
    after '.', '!' or '?' followed by a space."""
    text = re.sub(r"(?m)^[ \t]*(?:[*#-]+|//)(?=\s|$)", "", text)
    for para in re.split(r"\n\s*\n", text):
        para = " ".join(para.split())
        for s in re.split(r"(?<=[.!?])\s+", para):
            if s:
                yield s


def mine(files: Iterable[Path] | None = None, words: str = WORDS, min_chars: int = 20,
         max_chars: int = 200) -> list[dict[str, str]]:
    """The extraction inputs: for every occurrence of a target word in a sentence of the corpus,
    ``target`` = the sentence up to and including the word and ``prompt`` = the sentence before
    the word (without the space before it; the completion is then " word", as the tokenizer
    would split it). Kept when the prompt is not empty, ``target`` has ``min_chars`` to
    ``max_chars`` characters and is printable ASCII (relmql's edits are over printable ASCII),
    and the same ``target`` was not kept before (files in ``corpus_files`` order, sentences in
    text order). Each input also has ``word`` (as written), ``source`` (the file) and ``id``
    (a short hash of ``target``)."""
    pattern = re.compile(words)
    out: list[dict[str, str]] = []
    seen = set()
    for path in (corpus_files() if files is None else files):
        text = Path(path).read_text(encoding="utf-8", errors="replace")
        for s in sentences(text):
            for m in pattern.finditer(s):
                target, prompt = s[:m.end()], s[:m.start()].rstrip()
                if not prompt or not min_chars <= len(target) <= max_chars or target in seen:
                    continue
                if not all(" " <= c <= "~" for c in target):
                    continue
                seen.add(target)
                out.append({"id": hashlib.sha1(target.encode()).hexdigest()[:12], "source": str(path),
                            "word": m.group(0), "prompt": prompt, "target": target})
    return out


def subset(inputs: list[dict[str, str]], n: int | None) -> list[dict[str, str]]:
    """The first ``n`` inputs, shortest ``target`` first (then alphabetically): the paper's order
    (its script sorts the grepped sentences by length and runs the first ones), and the same
    inputs on every run over the same corpus."""
    ordered = sorted(inputs, key=lambda r: (len(r["target"]), r["target"]))
    return ordered if n is None else ordered[:n]


def run_one(con, text: str, params: dict) -> dict:
    """One statement's rows, its time and whether the search stopped at max_nodes."""
    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err):
        rows = con.sql(text, params=params).to_dicts()
    return {"rows": rows, "seconds": time.perf_counter() - t0, "stopped": "max_nodes" in err.getvalue()}


def experiment(con, inputs: list[dict[str, str]], cap: int, log=None) -> list[dict]:
    """Every statement of extraction.rql on every input: one record per input with the
    statement's outcome under its name."""
    stmts = common.statements(RQL)
    out = []
    for i, inp in enumerate(inputs):
        rec = dict(inp)
        params = {"prompt": inp["prompt"], "target": inp["target"], "cap": cap}
        for name, text in stmts:
            rec[name] = run_one(con, text, params)
        out.append(rec)
        if log is not None:
            print(f"[{i + 1}/{len(inputs)}] {len(inp['target'])} chars: prompted "
                  f"{len(rec['prompted-baseline']['rows'])}/{len(rec['prompted-relmql']['rows'])}, "
                  f"unprompted {len(rec['unprompted-baseline']['rows'])}/{len(rec['unprompted-relmql']['rows'])} "
                  f"({sum(rec[n]['seconds'] for n, _ in stmts):.1f} s)", file=log, flush=True)
    return out


def quadrant(row: dict) -> str:
    return f"{'canonical' if row['canonical'] else 'non-canonical'}, {'edits' if row['edits'] else 'no edits'}"


QUADRANTS = ["canonical, no edits", "canonical, edits", "non-canonical, no edits", "non-canonical, edits"]


def summary(records: list[dict]) -> dict:
    """The numbers of the section."""
    n = len(records)
    s: dict = {"n": n}
    for mode in ("baseline", "relmql"):
        s[f"prompted_{mode}"] = sum(1 for r in records if r[f"prompted-{mode}"]["rows"])
        rows = [row for r in records for row in r[f"unprompted-{mode}"]["rows"]]
        s[f"unprompted_{mode}"] = len(rows)
        s[f"unprompted_{mode}_inputs"] = sum(1 for r in records if r[f"unprompted-{mode}"]["rows"])
        s[f"quadrants_{mode}"] = {q: sum(1 for row in rows if quadrant(row) == q) for q in QUADRANTS}
        for kind in ("prompted", "unprompted"):
            name = f"{kind}-{mode}"
            s[f"seconds_{name}"] = sum(r[name]["seconds"] for r in records) / max(n, 1)
            s[f"stopped_{name}"] = sum(1 for r in records if r[name]["stopped"])
    s["prompted_rescued"] = sum(1 for r in records
                                if r["prompted-relmql"]["rows"] and not r["prompted-baseline"]["rows"])
    s["prompted_lost"] = sum(1 for r in records if r["prompted-baseline"]["rows"] and not r["prompted-relmql"]["rows"])
    return s


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.1f}×" if b else ("—" if not a else "∞ (baseline 0)")


def _pct(a: float, b: float) -> str:
    return f"{100 * a / b:.1f}%" if b else "—"


def figures(args, records: list[dict]) -> list[Path]:
    """Figure 8a (cumulative prompted successes against attempts) and 8b (cumulative unprompted
    extractions against the query's length, by canonical/edits)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    paths = []
    fig, ax = plt.subplots(figsize=(5.5, 4))
    xs = list(range(len(records) + 1))
    for mode, label in (("relmql", "relmql (all tokenizations, 1 edit)"), ("baseline", "baseline (canonical, exact)")):
        ys, total = [0], 0
        for r in records:
            total += bool(r[f"prompted-{mode}"]["rows"])
            ys.append(total)
        ax.step(xs, ys, where="post", label=label)
    ax.plot(xs, xs, color="grey", linestyle=":", linewidth=1, label="every attempt")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("cumulative attempts (sentences)")
    ax.set_ylabel("cumulative extractions")
    ax.set_title("Prompted extraction, top-k 40")
    ax.legend(loc="upper left")
    fig.tight_layout()
    path = common.figure_path(args, "extraction-prompted.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)

    fig, ax = plt.subplots(figsize=(5.5, 4))
    by_len = sorted(records, key=lambda r: len(r["target"]))
    lengths = [len(r["target"]) for r in by_len]
    for q in QUADRANTS:
        ys, total = [], 0
        for r in by_len:
            total += sum(1 for row in r["unprompted-relmql"]["rows"] if quadrant(row) == q)
            ys.append(total)
        ax.step(lengths, ys, where="post", label=f"relmql: {q}")
    ys, total = [], 0
    for r in by_len:
        total += len(r["unprompted-baseline"]["rows"])
        ys.append(total)
    ax.step(lengths, ys, where="post", color="black", linestyle="--", label="baseline (canonical, exact)")
    most = max([len(r["unprompted-relmql"]["rows"]) + len(r["unprompted-baseline"]["rows"]) for r in records] + [0])
    ax.set_ylim(0, max(10, 2 * sum(len(r["unprompted-relmql"]["rows"]) for r in records)))
    if not most:
        ax.text(0.5, 0.5, "no extractions", transform=ax.transAxes, ha="center", color="grey")
    ax.set_xlabel("query length (characters)")
    ax.set_ylabel("cumulative extractions (token sequences)")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_title("Unprompted extraction, top-k 40")
    ax.legend(loc="upper left", fontsize="small")
    fig.tight_layout()
    path = common.figure_path(args, "extraction-unprompted.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    paths.append(path)
    return paths


def _cell(text: str) -> str:
    return "`" + text.replace("`", "'").replace("|", "\\|") + "`"


def examples(records: list[dict], k: int = 4) -> list[str]:
    """A few extractions: prompted ones only relmql found, then edited or non-canonical
    unprompted ones."""
    lines = ["| setting | sentence (target) | extracted | canonical | edits | prob |", "|---|---|---|---|---|---|"]
    picked = 0
    for r in records:
        if picked >= k:
            break
        if r["prompted-relmql"]["rows"] and not r["prompted-baseline"]["rows"]:
            row = r["prompted-relmql"]["rows"][0]
            lines.append(f"| prompted | {_cell(r['target'])} | {_cell(row['text'])} | {row['canonical']} | "
                         f"{row['edits']} | {row['prob']:.3g} |")
            picked += 1
    picked = 0
    for r in records:
        if picked >= k:
            break
        rows = [row for row in r["unprompted-relmql"]["rows"] if row["edits"] or not row["canonical"]]
        if rows:
            row = rows[0]
            lines.append(f"| unprompted | {_cell(r['target'])} | {_cell(row['text'])} | {row['canonical']} | "
                         f"{row['edits']} | {row['total_prob']:.3g} |")
            picked += 1
    return lines if len(lines) > 2 else []


def section(args, records: list[dict], mined: int, cap: int, seconds: float, figs: list[Path]) -> str:
    s = summary(records)
    n = s["n"]
    words: dict[str, int] = {}
    for r in records:
        words[r["word"].lower()] = words.get(r["word"].lower(), 0) + 1
    out = [
        f"Corpus: the licence texts of this machine ({COMMON_LICENSES} and the installed packages' "
        f"licence files), mined for sentences with one of six disclaimer words (`{WORDS}`): "
        f"{mined:,} distinct inputs of 20–200 characters; the {n:,} shortest, as in the paper ("
        + ", ".join(f"{w} {c}" for w, c in sorted(words.items(), key=lambda kv: -kv[1])) + "). "
        "Statements: [`benchmarks/paper/extraction.rql`](../benchmarks/paper/extraction.rql); "
        "top-k 40 everywhere; baseline = canonical tokenization, exact text; relmql = every "
        "tokenization and one character edit (in the completion when prompted, anywhere when not).",
        "",
        "#### Prompted: success rate (Figure 8a)",
        "",
        "| | baseline | relmql | relmql / baseline | paper |",
        "|---|---|---|---|---|",
        (f"| sentences extracted | {s['prompted_baseline']}/{n} ({_pct(s['prompted_baseline'], n)}) | "
        f"{s['prompted_relmql']}/{n} ({_pct(s['prompted_relmql'], n)}) | "
        f"{_ratio(s['prompted_relmql'], s['prompted_baseline'])} | 27% vs 91% (2.5×) |"),
        f"| seconds per input | {s['seconds_prompted-baseline']:.2f} | {s['seconds_prompted-relmql']:.2f} | | |",
        "",
        f"relmql extracted {s['prompted_rescued']} of the sentences the baseline could not, and missed "
        f"{s['prompted_lost']} of those it could"
        + (f" ({s['stopped_prompted-relmql']} relmql searches stopped at max_nodes)"
           if s['stopped_prompted-relmql'] else "")
        + ".",
        "",
        f"![Prompted extraction]({common.link(args, figs[0])})",
        "",
        f"#### Unprompted: extractions per input (Figure 8b; at most {cap:,} per input)",
        "",
        "| | baseline | relmql | relmql / baseline | paper |",
        "|---|---|---|---|---|",
        (f"| extractions (token sequences) | {s['unprompted_baseline']:,} | {s['unprompted_relmql']:,} | "
        f"{_ratio(s['unprompted_relmql'], s['unprompted_baseline'])} | 93× |"),
        f"| per input | {s['unprompted_baseline'] / max(n, 1):.2f} | {s['unprompted_relmql'] / max(n, 1):.2f} | | |",
        (f"| inputs with at least one | {s['unprompted_baseline_inputs']}/{n} | "
         f"{s['unprompted_relmql_inputs']}/{n} | | |"),
        (f"| searches stopped at max_nodes | {s['stopped_unprompted-baseline']} | "
         f"{s['stopped_unprompted-relmql']} | | |"),
        f"| seconds per input | {s['seconds_unprompted-baseline']:.2f} | {s['seconds_unprompted-relmql']:.2f} | | |",
        "",
        ("Neither finds anything: without a prompt, under top-k 40 from the start of text, the model "
         "produces none of these sentences, in any tokenization or within one edit."
         if not s["unprompted_baseline"] and not s["unprompted_relmql"] else ""),
        "",
        "relmql's extractions by tokenization and edits:",
        "",
        "| | relmql | share | paper |",
        "|---|---|---|---|",
    ]
    paper = dict(zip(QUADRANTS, ["1.1%", "31.7%", "1.8%", "65.4%"]))
    total = s["unprompted_relmql"]
    for q in QUADRANTS:
        out.append(f"| {q} | {s['quadrants_relmql'][q]:,} | {_pct(s['quadrants_relmql'][q], total)} | {paper[q]} |")
    edited = s["quadrants_relmql"]["canonical, edits"] + s["quadrants_relmql"]["non-canonical, edits"]
    noncanon = s["quadrants_relmql"]["non-canonical, no edits"] + s["quadrants_relmql"]["non-canonical, edits"]
    out += [
        "",
        (f"From edits: {_pct(edited, total)} of relmql's extractions (paper: 97%); non-canonical: "
        f"{_pct(noncanon, total)} (paper: 67%)."),
        "",
        f"![Unprompted extraction]({common.link(args, figs[1])})",
        "",
    ]
    ex = examples(records)
    if ex:
        out += ["Examples:", ""] + ex + [""]
    out.append(common.setting(args, seconds))
    return "\n".join(out)


def run(args) -> str:
    t0 = time.perf_counter()
    mined = mine()
    n = 3 if args.smoke else args.inputs
    cap = min(args.cap, 10) if args.smoke else args.cap
    inputs = subset(mined, n)
    con = common.connect(args)
    records = experiment(con, inputs, cap, log=sys.stderr)
    (common.out_dir(args) / "extraction.json").write_text(json.dumps(records, default=float))
    figs = figures(args, records)
    return section(args, records, len(mined), cap, time.perf_counter() - t0, figs)


def options(p) -> None:
    """This experiment's own command-line options."""
    p.add_argument("--inputs", type=int, default=40, help="how many mined sentences to run (default: 40)")
    p.add_argument("--cap", type=int, default=100,
                   help="at most this many unprompted extractions per input (the paper: 1000; default: 100)")


def main():
    common.main_for("extraction", run, __doc__, options)


if __name__ == "__main__":
    main()
