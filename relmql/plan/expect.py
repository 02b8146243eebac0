"""``EXPECT condition [AS 'name']`` → a checked ``ExpectPlan``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from ..errors import closest
from ..syntax import ast as A
from ..syntax import unparse
from .expr import check_calls, kind
from .options import PlanError

TEST_COLUMNS = ("p_value", "chi2", "dof", "cramers_v")  # what TEST INDEPENDENCE gives EXPECT to read


@dataclass(frozen=True)
class ExpectPlan:
    """A condition every result row must meet: ``condition`` reads the query's output columns by
    name (and the TEST's ``p_value``, ``chi2``, ``dof`` and ``cramers_v``); ``name`` is the one
    given with AS, else the condition's text."""

    condition: A.Node
    name: str
    span: Tuple[int, int] = (0, 0)
    confidence: float = 0.95  # the stated level of the intervals a verdict rests on (USING confidence)

    @property
    def text(self) -> str:
        return unparse(self.condition)


def plan_expect(expect: Optional[A.Expect], columns: Sequence[str], has_test: bool,
                source: str, confidence: float = 0.95) -> Optional[ExpectPlan]:
    """The ``ExpectPlan`` of EXPECT (None without one), its columns checked against the query's."""
    if expect is None:
        return None
    cond = expect.condition
    check_calls(cond, source, allow_aggregates=False, allow_rows=False)
    known = list(columns) + (list(TEST_COLUMNS) if has_test else [])
    for n in cond.walk():
        if isinstance(n, A.Column) and n.name not in known:
            near = closest(n.name, known)
            test = " (p_value and the like come with TEST INDEPENDENCE)" if n.name in TEST_COLUMNS else ""
            raise PlanError(f"EXPECT reads {n.name!r}, which the query does not give{test}"
                            + (f"; did you mean {near}?" if near else ""), n.span, source,
                            hint=f"EXPECT reads the query's columns: {', '.join(known)}")
    if kind(cond) != "bool":
        raise PlanError("EXPECT takes a condition that is true or false, such as p < 0.001 or text = 'Paris'",
                        cond.span, source)
    if expect.name is not None and not expect.name.strip():
        raise PlanError("EXPECT ... AS names the expectation: the name is empty", expect.span, source)
    return ExpectPlan(cond, expect.name if expect.name is not None else unparse(cond), expect.span, confidence)


__all__ = ["ExpectPlan", "plan_expect", "TEST_COLUMNS"]
