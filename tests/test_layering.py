"""The house's one direction of flow (docs/architecture.md): every import of a relmql module, at
module level or inside a function, goes to a lower layer; modules of one layer do not import each
other (the faces on the top layer excepted); and planning a query loads neither torch, pynini,
the compiler nor the executor."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "relmql"

# lowest first; a unit is a top-level module or subpackage of relmql
LAYERS = [
    ["errors", "version"],
    ["cache", "memory", "stats"],
    ["records", "syntax", "output"],
    ["models"],
    ["plan", "automata"],
    ["execute", "rowcontext"],
    ["engine"],
    ["explain", "cluster", "verdict"],
    ["api"],
    ["repl", "cli", "runner", "__init__", "__main__"],  # the faces: these may import each other
]
LAYER = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def _unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    name = parts[1]
    return name if (PACKAGE / name).is_dir() or (PACKAGE / f"{name}.py").is_file() else "__init__"


def imports():
    """(importing file, line, importing unit, imported unit) for every relmql import in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts[:-1] if path.name == "__init__.py" else rel.parts)
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[:len(package) - node.level + 1]
                    targets = [".".join(base + [node.module])] if node.module else \
                        [".".join(base + [a.name]) for a in node.names]
                else:
                    targets = [node.module or ""]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target == "relmql" or target.startswith("relmql."):
                    yield path.relative_to(ROOT), node.lineno, _unit(module), _unit(target)


def test_every_unit_has_a_layer():
    units = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    assert units == set(LAYER), "give each new module or package a layer in LAYERS and docs/architecture.md"


def violations(found):
    """The imports of ``found`` that go up, or sideways below the faces."""
    top = len(LAYERS) - 1
    return [f"{path}:{line}: {src} (layer {LAYER[src]}) imports {dst} (layer {LAYER[dst]})"
            for path, line, src, dst in found
            if src != dst and (LAYER[dst] > LAYER[src] or (LAYER[dst] == LAYER[src] != top))]


def test_imports_run_downward():
    found = list(imports())
    assert len(found) > 100  # the walk is real: relmql's modules import each other this often
    wrong = violations(found)
    assert not wrong, "\n".join(wrong)


def test_no_cycle_between_units():
    graph = {}
    for _, _, src, dst in imports():
        if src != dst:
            graph.setdefault(src, set()).add(dst)
    state = {}

    def visit(unit, trail):
        state[unit] = "open"
        for nxt in sorted(graph.get(unit, ())):
            assert state.get(nxt) != "open", " -> ".join(trail + [unit, nxt])
            if nxt not in state:
                visit(nxt, trail + [unit])
        state[unit] = "done"

    for unit in sorted(graph):
        if unit not in state:
            visit(unit, [])


def test_the_check_catches_a_back_edge():
    # the planner importing the executor or the compiler, the cluster importing the api: reported;
    # the engine importing the planner, the shell importing the command line: allowed
    found = [("a.py", 1, "plan", "execute"), ("b.py", 2, "plan", "automata"), ("c.py", 3, "cluster", "api"),
             ("d.py", 4, "engine", "plan"), ("e.py", 5, "repl", "cli")]
    assert [v.split(":")[0] for v in violations(found)] == ["a.py", "b.py", "c.py"]


def test_planning_loads_neither_torch_nor_the_compiler_nor_the_executor():
    code = ("import sys, relmql.plan as P, relmql.syntax as S\n"
            "q = \"SELECT text, prob MATCHING 'The (cat|dog) sat' PREFIX 'The' USING topk 5, edits 1 LIMIT 3;\"\n"
            "[st] = S.parse(q)\n"
            "p = P.plan(st, q, P.defaults())\n"
            "assert type(p).__name__ == 'QueryPlan', p\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'pynini')\n"
            "      or m.startswith(('relmql.execute', 'relmql.automata', 'relmql.engine'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
