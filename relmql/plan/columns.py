"""The output columns, GROUP BY and TEST of a query, checked against the columns a row has
(docs/architecture.md, "Planning")."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Collection, Dict, List, Optional, Sequence, Tuple

from ..errors import closest
from ..records import COLUMNS, COMPUTED_COLUMNS
from ..syntax import ast as A
from ..syntax import unparse
from ..syntax.regexes import compiled
from .expr import check_calls, is_aggregate, is_probability, kind, weighs_cells
from .options import PlanError
from .plans import TESTS, Output, TestPlan

DEFAULT_COLUMNS = ("rank", "text", "prob")
_NAMED_GROUP = re.compile(r"\(\?P<([^\W\d]\w*)>")
READ_WHOLE = 100_000  # re compiles about 250,000 characters of a pattern a second


def output(name: str, expr: A.Node) -> Output:
    """The output column ``name`` computed by ``expr``."""
    return Output(name=name, expr=expr, kind=kind(expr))


def group_names(matching: str) -> Tuple[str, ...]:
    """The named groups of the regex ``matching`` (each one a column of its rows)."""
    if "(?P<" not in matching:
        return ()  # Python's only syntax for a named group
    if len(matching) > READ_WHOLE:  # the names as written: the compiler reads the pattern, and refuses it if too large
        return tuple(dict.fromkeys(_NAMED_GROUP.findall(matching)))
    try:
        return tuple(compiled(matching).groupindex)
    except (re.error, RecursionError, OverflowError, ValueError):
        return ()  # the compiler reports the pattern's error with its position


def check_columns(node: A.Node, source: str, known, extra=()) -> None:
    """Refuse a column of ``node`` that is not among ``known`` and ``extra``."""
    names = list(known) + list(extra)
    for n in node.walk():
        if isinstance(n, A.Column) and n.name not in names:
            near = closest(n.name, names)
            hint = None if near else f"columns: {', '.join(names)}" if names else \
                "the dataset's WHERE chooses data rows before any query runs: it reads their fields (:name)"
            raise PlanError(f"unknown column {n.name!r}" + (f"; did you mean {near}?" if near else ""), n.span, source,
                            hint=hint)


def select(query: A.Query, source: str, groups, several: bool = False
            ) -> Tuple[Tuple[Output, ...], bool, Tuple[A.Node, ...]]:
    """The output columns, whether they aggregate, and GROUP BY's expressions; ``several``: FROM
    names several models (the default columns and ``*`` include ``model``)."""
    known = tuple(COLUMNS) + COMPUTED_COLUMNS + tuple(groups)
    items: List[Output] = []
    for item in query.select:
        if isinstance(item.expr, A.Star):
            items.extend(output(c, A.Column(c)) for c in ("model",) * several + COLUMNS
                         + ("prompt",) * (query.prompt is not None))
            continue
        check_calls(item.expr, source, allow_aggregates=True, allow_rows=True)
        check_columns(item.expr, source, known)
        items.append(output(item.alias or (item.expr.name if isinstance(item.expr, A.Column)
                                            else unparse(item.expr)), item.expr))
    if not items:
        items = [output(c, A.Column(c)) for c in ("model",) * several + DEFAULT_COLUMNS]
    aliases = {o.name: o.expr for o in items}
    group_by = []
    for g in query.group_by:
        if isinstance(g, A.Column) and g.name not in known and g.name in aliases:
            g = aliases[g.name]
        elif isinstance(g, A.Literal) and isinstance(g.value, int) and not isinstance(g.value, bool):
            if not 1 <= g.value <= len(items):  # GROUP BY 1: the first output column
                there = "is 1 output column" if len(items) == 1 else f"are {len(items)} output columns"
                raise PlanError(f"GROUP BY {g.value}: there {there}", g.span, source)
            g = items[g.value - 1].expr
        check_calls(g, source, allow_aggregates=False, allow_rows=True)
        check_columns(g, source, known)
        group_by.append(g)
    aggregate = bool(group_by) or any(is_aggregate(o.expr) for o in items)
    if aggregate:
        for o, item in zip(items, query.select or ()):
            if not is_aggregate(o.expr) and o.expr not in group_by and refers_to_row(o.expr):
                raise PlanError(f"{o.name} must be in GROUP BY or inside an aggregate such as count()",
                                item.span, source)
    return unique_names(items), aggregate, tuple(group_by)



def unique_names(items: List[Output]) -> Tuple[Output, ...]:
    """The output columns with a name given twice told apart: the first keeps it (``SELECT *,
    prob`` still has its ``prob``), the next are ``prob_2``, ``prob_3`` (past any name taken)."""
    used = {o.name for o in items}
    seen: Dict[str, int] = {}
    out = []
    for o in items:
        k = seen[o.name] = seen.get(o.name, 0) + 1
        if k > 1:
            while f"{o.name}_{k}" in used:
                k += 1
            used.add(f"{o.name}_{k}")
            o = replace(o, name=f"{o.name}_{k}")
        out.append(o)
    return tuple(out)


def plan_test(test: Optional[A.Test], outputs, aggregate: bool, source: str, draws: int) -> Optional[TestPlan]:
    """The TEST clause against the output columns."""
    if test is None:
        return None
    if test.kind not in TESTS:
        near = closest(test.kind, TESTS)
        raise PlanError(f"unknown test {test.kind!r}; relmql tests: {', '.join(t.upper() for t in TESTS)}",
                        test.kind_span, source, hint=f"did you mean TEST {near.upper()}?" if near else None)

    def column(node) -> Output:
        for o in outputs:
            if o.expr == node or (isinstance(node, A.Column) and node.name == o.name):
                return o
        raise PlanError(f"TEST compares output columns; {unparse(node)} is not one", node.span, source,
                        hint=f"output columns: {', '.join(o.name for o in outputs)}")

    if len(test.columns) != 2:
        cols = test.columns
        raise PlanError(f"TEST {test.kind.upper()} compares two columns (OF a, b), not {len(cols)}",
                        (cols[0].span[0], cols[-1].span[1]), source)
    a, b = column(test.columns[0]), column(test.columns[1])
    if a.name == b.name:
        raise PlanError("a test of independence needs two different columns", test.columns[1].span, source)

    tested = next((o for o in (a, b) if is_aggregate(o.expr)), None)
    if tested is not None:  # OF g, n with n a count(*) or probability() column: each value is no category
        raise PlanError(f"TEST compares two category columns; {tested.name} is an aggregate: it weighs the "
                        f"cells, it is not a category", test.columns[(a, b).index(tested)].span, source,
                        hint="name a second GROUP BY column: SELECT g, h, count(*) AS n ... GROUP BY g, h "
                             "TEST INDEPENDENCE OF g, h")
    name = cell_weight(a.name, b.name, [o.name for o in outputs if weighs_cells(o.expr)],
                       {o.name for o in outputs if is_probability(o.expr)})
    weight = next(o for o in outputs if o.name == name) if name is not None else None
    if weight is None and aggregate:
        raise PlanError("TEST over grouped rows needs a count(*), sum(...) or probability() column to weigh "
                        "the cells", test.span, source)
    return TestPlan(a=a.name, b=b.name, weight=weight.name if weight else None,
                    n_per_row=draws if weight is not None and is_probability(weight.expr) else None)


def cell_weight(a: str, b: str, aggregates: Sequence[str], probabilities: Collection[str]) -> Optional[str]:
    """The column that weighs a test's cells over grouped rows, as TEST and ``Result.chi2`` take
    it: the first probability column among ``aggregates`` (the columns that can weigh cells,
    ``expr.weighs_cells``) other than ``a`` and ``b``, else the first of them (None where there
    is none)."""
    others = [w for w in aggregates if w not in (a, b)]
    return next((w for w in others if w in probabilities), others[0] if others else None)


def refers_to_row(node: A.Node) -> bool:
    """Whether ``node`` reads a result row (a column or a capture group)."""
    return any(isinstance(n, A.Column) or (isinstance(n, A.Call) and n.name == "group") for n in node.walk())

