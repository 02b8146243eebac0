"""The cookbook's scripts (docs/cookbook.md, examples/cookbook/) stay valid: every statement
parses, plans and compiles on the embedded model's vocabulary (EXPLAIN runs nothing on the model)."""

from __future__ import annotations

from pathlib import Path

import pytest

import relmql
from relmql.syntax import ast as A
from relmql.syntax import parse, unparse

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "examples" / "cookbook").glob("*.rql"))


@pytest.fixture(scope="module")
def smol_con(smol):
    session = relmql.connect(dtype="float32")
    session.models.put("smollm2-135m", "cpu", "float32", smol)
    return session


def test_there_are_scripts_for_each_cookbook_section():
    assert {p.stem for p in SCRIPTS} >= {"knowledge", "memorization", "bias", "bias_configurations", "extraction"}
    doc = (ROOT / "docs" / "cookbook.md").read_text(encoding="utf-8")
    for p in SCRIPTS:
        assert f"examples/cookbook/{p.name}" in doc, p.name


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.stem)
def test_every_statement_plans_and_compiles(smol_con, path):
    text = path.read_text(encoding="utf-8")
    smol_con.param_defaults.clear()  # each script sets the parameters it uses
    statements = parse(text)
    assert statements
    for st in statements:
        if isinstance(st, A.Set):  # settings: checked on a session of their own
            relmql.connect().sql(unparse(st))
            continue
        if isinstance(st, A.SetParam):  # a parameter's default, for the statements after it
            smol_con.sql(unparse(st))
            continue
        plan = "\n".join(line for line, in smol_con.sql("EXPLAIN " + unparse(st)))
        assert "automaton" in plan and "strings" in plan
