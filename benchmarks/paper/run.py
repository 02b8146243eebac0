"""Run the paper's four evaluations and write docs/paper-results.md with their tables and figures.

    python -m benchmarks.paper.run                    # all four (about 1.5 h on two CPU cores)
    python -m benchmarks.paper.run --only lambada     # one; the others' sections stay as they are
    python -m benchmarks.paper.run --model gpt2       # GPT-2 from the local Hugging Face cache

Each experiment also runs alone (``python -m benchmarks.paper.lambada --help``) and writes its
section into docs/paper/NAME.md; this script then puts every section into
docs/paper-results.md, built from docs/paper-results.template.md (``--assemble``: only that).
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

from . import common

EXPERIMENTS = ("memorization", "bias", "extraction", "lambada")


def assemble(folder: Path, target: Path) -> None:
    """Fill the template with each experiment's last section (``folder/NAME.md``)."""
    text = (common.DOCS / "paper-results.template.md").read_text(encoding="utf-8")
    for name in EXPERIMENTS:
        path = folder / f"{name}.md"
        body = path.read_text(encoding="utf-8").strip("\n") if path.exists() else "(not run yet)"
        text = text.replace("{{" + name + "}}", f"<!-- {name}: written by benchmarks/paper/run.py -->\n{body}\n"
                                                f"<!-- end of {name} -->")
    target.write_text(text, encoding="utf-8")


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--only", choices=EXPERIMENTS, action="append", help="run this experiment (repeatable)")
    p.add_argument("--assemble", action="store_true",
                   help="run nothing: rebuild docs/paper-results.md from the sections in --out")
    modules = {name: importlib.import_module(f".{name}", __package__) for name in EXPERIMENTS}
    for module in modules.values():  # each experiment's own options
        module.options(p)
    args = p.parse_args()
    for name in [] if args.assemble else args.only or EXPERIMENTS:
        t0 = time.perf_counter()
        section = modules[name].run(args)
        (common.out_dir(args) / f"{name}.md").write_text(section + "\n", encoding="utf-8")
        print(f"{name}: {(time.perf_counter() - t0) / 60:.1f} min", file=sys.stderr, flush=True)
    if not args.smoke:
        target = common.DOCS / "paper-results.md"
        assemble(common.out_dir(args), target)
        print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
