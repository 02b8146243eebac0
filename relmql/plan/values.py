"""Values the planner works out before any row exists: parameters, constants, counts (docs/architecture.md,
"Planning")."""

from __future__ import annotations

from typing import Any, Mapping

from ..errors import Error, closest
from ..syntax import ast as A
from .expr import Env, check_calls, evaluate
from .options import PlanError, shown, whole_number
from .plans import QueryPlan


class ConstEnv(Env):
    """What an expression sees before any result row: the parameters only (``where`` names the
    clause, for messages)."""

    def __init__(self, params: Mapping[str, Any], source: str, where: str):
        self.params, self.source, self.where = params, source, where

    def column(self, node):
        raise PlanError(f"{self.where} cannot refer to the result column {node.name!r}", node.span, self.source,
                        hint="use a :parameter or a string")

    def param(self, node):
        if node.name not in self.params:
            near = closest(node.name, self.params)
            raise PlanError(f"parameter :{node.name} has no value" + (f"; did you mean :{near}?" if near else ""),
                            node.span, self.source,
                            hint=f"bind it with params={{...}} in Python, --param name=value on the command line, "
                                 f"a dataset field, or SET :{node.name} = value (a script's default)")
        return self.params[node.name]

    def group(self, key, node):
        raise PlanError(f"{self.where} cannot use group(): there is no result row yet", node.span, self.source)


def check_params(plan: QueryPlan) -> None:
    """Refuse a parameter without a value in the columns, WHERE or GROUP BY before the query
    runs (else it is found at the first row, after the model has loaded and the search run;
    EXPLAIN shows such a plan)."""
    env = ConstEnv(plan.param_dict(), plan.source, "")
    for expr in [o.expr for o in plan.outputs] + [plan.where] * (plan.where is not None) + list(plan.group_by):
        for node in expr.walk():
            if isinstance(node, A.Param):
                env.param(node)


def constant(node: A.Node, params, source, where):
    """The value of an expression that refers to no result row (params and functions only)."""
    check_calls(node, source, allow_aggregates=False, allow_rows=False)
    try:
        return evaluate(node, ConstEnv(params, source, where))
    except Error as e:
        raise sourced(e, source) from None


def sourced(e: Error, source: str) -> Error:
    """``e`` placed in the query's text ``source`` where it has a span and no text yet."""
    if e.source is None and e.span is not None:
        e.source = source
    return e


def text_of(node, params, source, where, what: str = "a regex") -> str:
    """The text a clause's expression gives (``where`` names the clause, ``what`` the text's use)."""
    value = constant(node, params, source, where)
    if not isinstance(value, str):
        raise PlanError(f"{where} must be text ({what}), not {shown(value)}", node.span, source)
    return value


def count_of(node, params, source, what) -> int:
    """The whole number of zero or more a clause's expression gives (LIMIT, SAMPLE)."""
    value = constant(node, params, source, what)
    n = whole_number(value)  # 1e3 and a parameter's text too
    if n is None or n < 0:
        raise PlanError(f"{what} must be a whole number of zero or more, not {shown(value)}", node.span, source)
    return n
