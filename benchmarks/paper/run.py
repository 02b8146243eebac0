"""Run the paper's four evaluations and write docs/paper-results.md with their tables and figures.

    python benchmarks/paper/run.py                    # all four (about 1.5 h on two CPU cores)
    python benchmarks/paper/run.py --only lambada     # one; the others' sections stay as they are
    python benchmarks/paper/run.py --model gpt2       # GPT-2 from the local Hugging Face cache

Each experiment also runs alone (``python benchmarks/paper/lambada.py --help``) and writes its
section into docs/paper/NAME.md; this script puts the sections into docs/paper-results.md,
which is built from docs/paper-results.template.md.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import common

EXPERIMENTS = ("memorization", "bias", "extraction", "lambada")


def _mark(tag: str, body: str) -> str:
    return f"<!-- {tag} -->\n{body}\n<!-- {tag} -->"


def _old(text: str, tag: str) -> str:
    parts = text.split(f"<!-- {tag} -->")
    return parts[1].strip("\n") if len(parts) >= 3 else "(not run yet)"


def assemble(sections: dict, target: Path) -> None:
    """Fill the template with the given sections, keeping the old text of the others."""
    text = (common.DOCS / "paper-results.template.md").read_text(encoding="utf-8")
    old = target.read_text(encoding="utf-8") if target.exists() else ""
    for name in EXPERIMENTS:
        body = sections.get(name) or _old(old, name)
        text = text.replace("{{" + name + "}}", _mark(name, body))
    target.write_text(text, encoding="utf-8")


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--only", choices=EXPERIMENTS, action="append", help="run this experiment (repeatable)")
    modules = {name: importlib.import_module(name) for name in EXPERIMENTS}
    for module in modules.values():  # each experiment's own options
        module.options(p)
    args = p.parse_args()
    sections = {}
    for name in args.only or EXPERIMENTS:
        t0 = time.perf_counter()
        module = modules[name]
        sections[name] = module.run(args)
        (common.out_dir(args) / f"{name}.md").write_text(sections[name] + "\n", encoding="utf-8")
        print(f"{name}: {(time.perf_counter() - t0) / 60:.1f} min", file=sys.stderr, flush=True)
    target = common.DOCS / "paper-results.md"
    if not args.smoke:
        assemble(sections, target)
        print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
