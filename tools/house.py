"""How the package's rooms measure against issue 57's targets: modules over 500 lines, classes over
300, functions over 60, and the parameters of the engine's entry function.

    python tools/house.py            # the counts and the places over each limit
    python tools/house.py --check    # the same, exit status 1 while a target is missed
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parents[1] / "relmql"
MODULE_LINES, CLASS_LINES, FUNCTION_LINES, LONG_FUNCTIONS, ENTRY_PARAMS = 500, 300, 60, 6, 3
ENTRY = ("engine/query.py", "query_rows")  # the engine's entry function (issue 57: at most 3 parameters)


def _span(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def measure(root: Path = ROOT) -> Tuple[List[Tuple[str, int]], List[Tuple[str, int]], List[Tuple[str, int]], int]:
    """(modules over the limit, classes over it, functions over it, the entry function's parameters)."""
    modules, classes, functions, params = [], [], [], -1
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root.parent))
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n") + (not text.endswith("\n"))
        if lines > MODULE_LINES:
            modules.append((rel, lines))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and _span(node) > CLASS_LINES:
                classes.append((f"{rel}:{node.name}", _span(node)))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if _span(node) > FUNCTION_LINES:
                    functions.append((f"{rel}:{node.name}", _span(node)))
                if path.relative_to(root).as_posix() == ENTRY[0] and node.name == ENTRY[1]:
                    a = node.args
                    params = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    return (sorted(modules, key=lambda x: -x[1]), sorted(classes, key=lambda x: -x[1]),
            sorted(functions, key=lambda x: -x[1]), params)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 while a target is missed")
    args = p.parse_args(argv)
    modules, classes, functions, params = measure()
    missed = 0
    for what, found, limit, allowed in (("modules over %d lines" % MODULE_LINES, modules, MODULE_LINES, 0),
                                        ("classes over %d lines" % CLASS_LINES, classes, CLASS_LINES, 0),
                                        ("functions over %d lines" % FUNCTION_LINES, functions, FUNCTION_LINES,
                                         LONG_FUNCTIONS)):
        ok = len(found) <= allowed
        missed += not ok
        print(f"{what}: {len(found)} (target: at most {allowed}){'' if ok else '  MISSED'}")
        for name, n in found:
            print(f"  {n:5d}  {name}")
    ok = 0 <= params <= ENTRY_PARAMS
    missed += not ok
    print(f"{ENTRY[1]} parameters: {params} (target: at most {ENTRY_PARAMS}){'' if ok else '  MISSED'}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
