"""Edited prompts that grow: one edit on the PREFIX, a sentence of the MIT licence cut near 30, 50
and 100 characters, LIMIT 1 (ReLM's toxicity and extraction queries put a whole sentence in the
PREFIX and allow edits on it). The time to the first row and the nodes read, with this checkout
and with a baseline revision, alternately, each query in a process of its own.

    python -m benchmarks.prompt_bench [--baseline REV] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Dict, List

LICENCE = ("Permission is hereby granted, free of charge, to any person obtaining a copy of this software "
           "and associated documentation files")
BASELINE = "7c396c1"  # before the prompt's nodes counted against max_prefix_nodes, not max_nodes_per_row


def prompt(chars: int) -> tuple:
    """The licence's longest beginning of whole words within ``chars`` characters, and its next word."""
    words, out = LICENCE.split(" "), ""
    for w in words:
        if len(out + " " + w) > chars:
            return out, w
        out = (out + " " + w).strip()
    raise ValueError(chars)


def _query(chars: int) -> str:
    given, word = prompt(chars)
    return f"SELECT text, prob MATCHING '{given} {word}' PREFIX '{given}' USING topk 40, edits 1 LIMIT 1"


# name -> (statement, seconds after which the worker stops waiting), run by executor_bench's workers
PROMPTS = {f"{len(prompt(n)[0])}-character PREFIX, 1 edit": (_query(n), 300) for n in (30, 50, 100)}


def run(baseline: str = BASELINE) -> Dict:
    from .executor_bench import versus
    from .setting import setting
    return {"machine": setting().machine, "versus": versus(baseline, queries=PROMPTS)}


def tables(res: Dict) -> str:
    """docs/benchmarks.md's part: the table and its reading."""
    from .executor_bench import first_row
    v = res["versus"]
    lines = [f"SmolLM2-135M on cpu (float32), `USING topk 40, edits 1 LIMIT 1`; this checkout and `{v['baseline']}` "
             "alternately, each query in its own process.", "",
             "| PREFIX | first row, before | first row, now | tokens read, now | same row |",
             "|---|---:|---:|---:|---|"]
    for name, r in v["queries"].items():
        now, before = r["now"], r["before"]
        same = "—" if not before["rows"] else "yes" if [x[0] for x in now["rows"]] == [x[0] for x in before["rows"]] \
            else "no"
        lines.append(f"| {name.split(',')[0]} | {first_row(before)} | {first_row(now)} | {now['tokens']:,} | "
                     f"{same} |")
    return "\n".join(lines)


def main(argv: List[str] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", default=BASELINE, help="the git revision to compare with")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)
    res = run(args.baseline)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    print(tables(res))


if __name__ == "__main__":
    main()
