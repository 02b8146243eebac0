"""What the paper's experiments share: their command line, their statements, where they write.

Each experiment is a module of this folder with ``run(args) -> str`` (the markdown of its
section of docs/paper-results.md) and a ``main()`` that runs it alone. Statements come from
the ``.rql`` file beside the driver, so the file a user runs with ``relmql FILE`` and the one
the driver measures are the same.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import List, Optional, Tuple

from ..setting import setting as current_setting

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DATA = ROOT.parent / "shared" / "data"
DOCS = ROOT / "docs"


def parser(description: str) -> argparse.ArgumentParser:
    """The options every experiment takes."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m",
                   help="a built-in model, gpt2 / gpt2-xl (where their weights are in the Hugging Face "
                        "cache), a local directory or a hub id (default: smollm2-135m)")
    p.add_argument("--dtype", default="float32", help="model weights (default: float32, for exact values)")
    p.add_argument("--smoke", action="store_true", help="a few examples only: checks that it runs")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's own; give 1 when experiments share the cores, "
                        "where two threads each are many times slower)")
    p.add_argument("--out", default=str(DOCS / "paper"),
                   help="folder for the figures and the section's markdown (default: docs/paper)")
    return p


def statements(rql: Path) -> List[Tuple[str, str]]:
    """``(name, text)`` of each query of a ``.rql`` file; the name is the ``-- name:`` comment
    line before the statement (or its position)."""
    from relmql.syntax import parse
    text = rql.read_text(encoding="utf-8")
    out = []
    for i, st in enumerate(parse(text)):
        body = text[st.span[0]:st.span[1]]
        before = text[:st.span[0]].rstrip().splitlines()
        name = str(i + 1)
        for line in reversed(before):
            if line.strip().startswith("-- name:"):
                name = line.split(":", 1)[1].strip()
                break
            if not line.strip().startswith("--"):
                break
        out.append((name, body))
    return out


def connect(args):
    """A relmql session on the experiment's model, run from the repository root (the ``.rql``
    files name the data as ``../shared/data/...``)."""
    import relmql
    os.chdir(ROOT)
    return relmql.connect(model=args.model, dtype=args.dtype, threads=getattr(args, "threads", None))


def out_dir(args) -> Path:
    path = Path(args.out)
    path.mkdir(parents=True, exist_ok=True)
    return path


def setting(args, seconds: Optional[float] = None) -> str:
    """One line: model, dtype, machine, versions, run time."""
    took = f"; ran {seconds / 60:.1f} min" if seconds is not None else ""
    now = current_setting()
    return f"Model `{args.model}` ({args.dtype}) on {now.machine}; {now.versions}; {now.date}{took}."


def figure_path(args, name: str) -> Path:
    """Where a figure goes, and the path the markdown links (relative to docs/)."""
    return out_dir(args) / name


def link(args, path: Path) -> str:
    try:
        return str(path.resolve().relative_to(DOCS.resolve()))
    except ValueError:
        return str(path)


def main_for(name: str, run, description: str, extra=None) -> None:
    """``python -m benchmarks.paper.X [options]``: run one experiment, print its section."""
    p = parser(description)
    if extra:
        extra(p)
    args = p.parse_args()
    t0 = time.perf_counter()
    section = run(args)
    path = out_dir(args) / f"{name}.md"
    path.write_text(section + "\n", encoding="utf-8")
    print(section)
    print(f"\nwrote {path} ({(time.perf_counter() - t0) / 60:.1f} min)", file=sys.stderr)
