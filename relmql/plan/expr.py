"""Expressions: the language's operators, aggregates and row functions, their evaluation over an
environment, and the checks of calls before a query runs (docs/architecture.md, "Planning"; the
scalar functions are ``relmql.plan.functions``)."""

from __future__ import annotations

import math
import operator
import re
from typing import Any, List, Optional

from ..errors import RegexError
from ..records import COLUMN_KINDS, COMPUTED_KINDS
from ..syntax import ast as A
from ..syntax.regexes import compiled, escape
from ..syntax.source import string_offsets
from ..syntax.unparse import quote
from .functions import FUNCTIONS, Function
from .options import PlanError, shown, whole_number

__all__ = ["AGGREGATES", "FUNCTIONS", "Function", "ROW_FUNCTIONS", "OTHER_NAMES", "Env", "evaluate", "truth",
           "kind", "is_aggregate", "weighs_cells", "is_probability", "check_calls", "escape"]


def _regex_error(e: re.error, node: A.Node, what: str = "") -> RegexError:
    """A regex that ``re`` refuses, reported as one in MATCHING is: under the construct where the
    regex is a string literal, else under the expression that gave it, the place in words."""
    pos = e.pos if e.pos is not None else 0
    raw = quote(node.value) if isinstance(node, A.Literal) and isinstance(node.value, str) \
        else None  # its source text, where the literal was written as such (its span says so)
    if raw is not None and len(raw) == node.span[1] - node.span[0]:
        offsets = string_offsets(raw, node.span[0])
        at = offsets[min(pos, len(offsets) - 1)]
        return RegexError(what + e.msg, (at, at + 1))
    return RegexError(f"{what}{e.msg}, at character {pos + 1} of the regex", node.span)


def _mod(a, b):
    """SQL's remainder: the sign of the dividend (-7 % 3 is -1, as in DuckDB and PostgreSQL)."""
    if isinstance(a, int) and isinstance(b, int):
        r = abs(a) % abs(b)
        return -r if a < 0 else r
    return math.fmod(a, b)


AGGREGATES = {"count": "the number of rows (or of non-NULL values)", "sum": "the sum of the values",
              "avg": "the mean of the values (true counts as 1)", "min": "the least value",
              "max": "the greatest value",
              "probability": "the probability the model gives to the group's strings after the prefix (the "
                             "mean over the prefix's token paths that fix the same GROUP BY keys): exact (summed "
                             "over the language) or, for languages too large to enumerate, estimated by "
                             "sampling with an interval"}
# what other languages call some of the functions (``len`` is nearer ``ln`` than ``length`` by spelling)
OTHER_NAMES = {"len": "length", "char_length": "length", "character_length": "length", "strlen": "length",
               "strip": "trim", "mean": "avg", "average": "avg", "log": "ln"}
NUMBER_AGGREGATES = ("count", "sum", "avg", "probability")  # the others' values are of any kind
NULLARY_AGGREGATES = ("probability",)
ROW_FUNCTIONS = {"group": "a capture group of MATCHING in the row's text: group(1), group('name')",
                 "coalesce": "the first argument that is not NULL",
                 "logprob_under": "the log-probability another model gives the row's completion after the same "
                                  "PROMPT and PREFIX: logprob_under('gemma3-270m')",
                 "prob_under": "the probability another model gives the row's completion: exp(logprob_under(m))"}


def kind(node: A.Node) -> str:
    """The kind (``relmql.records.KINDS``) of the values of ``node``: from its column, function or
    operator; "text" where nothing declares one (a parameter, a capture group)."""
    if isinstance(node, A.Literal):
        v = node.value
        return "bool" if isinstance(v, bool) else "number" if isinstance(v, (int, float)) else "text"
    if isinstance(node, A.Column):
        return COLUMN_KINDS.get(node.name, COMPUTED_KINDS.get(node.name, "text"))
    if isinstance(node, A.Unary):
        return "bool" if node.op == "NOT" else "number"
    if isinstance(node, A.Binary):
        return "text" if node.op == "||" else "number" if node.op in _ARITH else "bool"
    if isinstance(node, (A.InList, A.Matches, A.IsNull)):
        return "bool"
    if isinstance(node, A.Call):
        if node.name in FUNCTIONS:
            return FUNCTIONS[node.name].kind
        if node.name in NUMBER_AGGREGATES or node.name in ("logprob_under", "prob_under"):
            return "number"
        if node.name in ("min", "max", "coalesce") and node.args:
            kinds = {kind(a) for a in node.args if not (isinstance(a, A.Literal) and a.value is None)}
            return kinds.pop() if len(kinds) == 1 else "text"
    return "text"


def is_aggregate(node) -> bool:
    """Whether ``node`` contains an aggregate call."""
    return any(isinstance(n, A.Call) and n.name in AGGREGATES for n in node.walk())


def weighs_cells(node) -> bool:
    """Whether an output column can weigh a test's cells: an aggregate of a group's count(*),
    sum(...) or probability() (``100 * sum(prob)`` too), with no mean, least or greatest value in
    it (those are no amount of the cell)."""
    return is_aggregate(node) and not any(isinstance(n, A.Call) and n.name in ("avg", "min", "max")
                                          for n in node.walk())


def is_probability(node) -> bool:
    """Whether ``node`` reads a probability (probability(), prob, total_prob): as a test's weight
    it carries no sample size of its own."""
    return any((isinstance(n, A.Call) and n.name == "probability") or
               (isinstance(n, A.Column) and n.name in ("prob", "total_prob")) for n in node.walk())


class Env:
    """What an expression can see: columns, parameters, capture groups; ``rows`` under GROUP BY
    (and ``probability()``, the group's measured probability)."""

    def column(self, node: A.Column):
        raise PlanError(f"{node.name} is not known here", node.span)

    def param(self, node: A.Param):
        raise PlanError(f"parameter :{node.name} has no value", node.span)

    def group(self, key, node: A.Node):
        raise PlanError("group() needs a result row", node.span)

    def probability(self):
        """probability() of this group (``relmql.engine`` works it out from the measurements)."""
        raise PlanError("probability() needs the rows of a query")

    def under(self, node: A.Call):
        """``logprob_under(model)`` of this row (``relmql.engine`` scores it with that model)."""
        raise PlanError(f"{node.name}() refers to a result row; it cannot be used here", node.span)

    rows: Optional[List["Env"]] = None


def _type_ok(kind: str, value) -> bool:
    if kind == "any":
        return True
    if kind == "text":
        return isinstance(value, str)
    if kind == "list":
        return isinstance(value, (list, tuple))
    if kind == "sized":
        return isinstance(value, (str, list, tuple))
    if kind == "int":  # 2.0 and a parameter's text too
        return whole_number(value) is not None
    return _number_of(value) is not None  # "number": a parameter's text too


_TYPE_WORDS = {"text": "text", "list": "a list", "sized": "text or a list", "int": "a whole number",
               "number": "a number"}


_COMPARE = {"=": operator.eq, "<>": operator.ne, "<": operator.lt, ">": operator.gt, "<=": operator.le,
            ">=": operator.ge}
_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "%": _mod}


def evaluate(node: A.Node, env: Env) -> Any:
    """The value of ``node`` in ``env``."""
    step = _EVALUATE.get(type(node))
    if step is None:
        return _other(node, env)
    return step(node, env)


def _other(node: A.Node, env: Env) -> Any:
    """``evaluate`` of a node whose type is not in ``_EVALUATE`` (a subclass of one, or none)."""
    for node_type, step in _EVALUATE.items():
        if isinstance(node, node_type):
            return step(node, env)
    if isinstance(node, A.Star):
        raise PlanError("* is only allowed in SELECT * and count(*)", node.span)
    raise PlanError(f"cannot evaluate {type(node).__name__}", getattr(node, "span", None))


def _unary(node: A.Unary, env: Env) -> Any:
    v = evaluate(node.operand, env)
    if node.op == "NOT":
        return not truth(v, node.operand)
    if v is None:
        return None
    return -_need_number(v, node.operand)


def _binary(node: A.Binary, env: Env) -> Any:
    if node.op == "AND":
        return truth(evaluate(node.left, env), node.left) and truth(evaluate(node.right, env), node.right)
    if node.op == "OR":
        return truth(evaluate(node.left, env), node.left) or truth(evaluate(node.right, env), node.right)
    a, b = evaluate(node.left, env), evaluate(node.right, env)
    if node.op == "||":
        if a is None or b is None:
            return None
        return _text(a, node.left) + _text(b, node.right)
    if node.op in _COMPARE:
        return _compare(node, a, b)
    if a is None or b is None:
        return None
    a, b = _need_number(a, node.left), _need_number(b, node.right)
    if node.op in "/%" and b == 0:
        return None
    return _ARITH[node.op](a, b)


def _compare(node: A.Binary, a, b) -> bool:
    """``a`` and ``b`` compared by ``node``'s operator: NULL equals only NULL, and is less than nothing."""
    if a is None or b is None:
        return (a is None and b is None) if node.op == "=" else \
            (not (a is None and b is None)) if node.op == "<>" else False
    if isinstance(a, str) != isinstance(b, str) and _number_of(a) is not None and \
            _number_of(b) is not None:  # '2' = 2: a parameter's or a CSV field's text
        a, b = _number_of(a), _number_of(b)
    try:
        return _COMPARE[node.op](a, b)
    except TypeError:
        raise PlanError(f"cannot compare {_kind(a)} with {_kind(b)}", node.span) from None


def _in_list(node: A.InList, env: Env) -> bool:
    v = evaluate(node.operand, env)
    items = []
    for item in node.items:
        value = evaluate(item, env)
        if len(node.items) == 1 and isinstance(item, A.Call) and isinstance(value, (list, tuple)):
            items.extend(value)
        else:
            items.append(value)
    return (v in items) != node.negated


def _matches(node: A.Matches, env: Env) -> bool:
    v = evaluate(node.operand, env)
    pattern = _text(evaluate(node.pattern, env), node.pattern)
    if v is None:
        return node.negated
    try:
        found = compiled(pattern).fullmatch(_text(v, node.operand)) is not None
    except re.error as e:
        raise _regex_error(e, node.pattern) from None
    except (OverflowError, RecursionError) as e:
        raise RegexError(f"pattern too complex for Python's re: {e}", node.pattern.span) from None
    return found != node.negated


_EVALUATE = {  # how each kind of node is evaluated (``evaluate``)
    A.Literal: lambda node, env: node.value,
    A.Param: lambda node, env: env.param(node),
    A.Column: lambda node, env: env.column(node),
    A.Unary: _unary,
    A.Binary: _binary,
    A.InList: _in_list,
    A.Matches: _matches,
    A.IsNull: lambda node, env: (evaluate(node.operand, env) is None) != node.negated,
    A.Call: lambda node, env: _call(node, env),
}


def truth(v, node: A.Node) -> bool:
    """A condition's value (NULL: false). Numbers are conditions (0 is false), as in SQL engines
    that cast them, and so is the text 'true' or 'false' (a parameter's value, a CSV field);
    other text, lists and objects are not."""
    if v is None:
        return False
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    if isinstance(v, (str, list, tuple, dict)):
        raise PlanError(f"a condition is true or false, not {_kind(v)} ({shown(v)})", node.span,
                        hint="compare it: x = 'yes', x IS NOT NULL, length(x) > 0")
    return bool(v)


def _number_of(v):
    """``v`` as a number where one is needed: numbers as they are, text that spells one (a
    parameter's value, a CSV field) converted; None otherwise."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            pass
        try:
            f = float(v)
        except ValueError:
            return None
        return f if math.isfinite(f) else None  # 'nan' and 'inf' stay words
    return None


def _kind(v) -> str:
    return {str: "text", bool: "a boolean", type(None): "NULL", tuple: "tokens", list: "a list"}.get(
        type(v), "a number")


def _text(v, node) -> str:
    if not isinstance(v, str):
        raise PlanError(f"expected text, got {_kind(v)} ({v!r})", node.span)
    return v


def _need_number(v, node):
    n = _number_of(v)
    if n is None:
        raise PlanError(f"expected a number, got {_kind(v)} ({shown(v)})", node.span)
    return n


def _call(node: A.Call, env: Env):
    name = node.name
    if name in AGGREGATES:
        if env.rows is None:
            raise PlanError(f"{name}() is an aggregate: it is allowed in SELECT only", node.span)
        if name == "probability":
            return env.probability()
        return _aggregate(node, env.rows)
    if name == "group":
        key = evaluate(node.args[0], env)
        return env.group(key, node)
    if name in ("logprob_under", "prob_under"):
        value = env.under(node)
        return None if value is None else math.exp(value) if name == "prob_under" else value
    if name == "coalesce":
        for a in node.args:
            v = evaluate(a, env)
            if v is not None:
                return v
        return None
    fn = FUNCTIONS[name]
    args = [evaluate(a, env) for a in node.args]
    if any(v is None for v in args):
        return None
    for a, v, kind in zip(node.args, args, fn.types):
        if not _type_ok(kind, v):
            raise PlanError(f"{name}() expects {_TYPE_WORDS.get(kind, kind)} here, "
                            f"got {_kind(v)} ({v!r})", a.span)
    args = [whole_number(v) if kind == "int" else _number_of(v) if kind == "number" else v
            for v, kind in zip(args, fn.types)]
    try:
        return fn.impl(*args)
    except re.error as e:  # under the argument that holds the regex
        arg = next((a for a, v in zip(node.args, args) if isinstance(v, str) and v == e.pattern), node)
        raise _regex_error(e, arg, f"{name}(): ") from None
    except (ValueError, IndexError, OverflowError) as e:
        raise PlanError(f"{name}(): {e}", node.span) from None


def _aggregate(node: A.Call, rows: List[Env]):
    name = node.name
    if node.args and isinstance(node.args[0], A.Star):
        return len(rows)
    values = [evaluate(node.args[0], r) for r in rows]
    values = [v for v in values if v is not None]
    if name == "count":
        return len(values)
    if not values:
        return None
    if name in ("min", "max"):
        try:
            return (min if name == "min" else max)(values)
        except TypeError:
            raise PlanError(f"{name}() over values that do not compare", node.span) from None
    for v in values:
        if not isinstance(v, (int, float)):
            raise PlanError(f"{name}() needs numbers or booleans, got {_kind(v)} ({v!r})", node.args[0].span)
    total = math.fsum(float(v) for v in values) if any(isinstance(v, float) for v in values) else sum(
        int(v) for v in values)
    return total / len(values) if name == "avg" else total


def check_calls(node: A.Node, source: str, allow_aggregates: bool, allow_rows: bool) -> None:
    """Unknown functions, wrong numbers of arguments and misplaced aggregates, before running."""
    for n in node.walk():
        if not isinstance(n, A.Call):
            continue
        known = {**{k: None for k in FUNCTIONS}, **AGGREGATES, **ROW_FUNCTIONS}
        if n.name == "chat":
            raise PlanError("chat() writes a conversation: it is the value of PROMPT, as in PROMPT chat('user', "
                            "'a question')", n.span, source)
        if n.name not in known:
            from ..errors import closest
            near = OTHER_NAMES.get(n.name.lower()) or closest(n.name, known)
            raise PlanError(f"unknown function {n.name}()" + (f"; did you mean {near}()?" if near else ""),
                            n.name_span, source)
        nargs = len(n.args)
        if n.name in AGGREGATES:
            if not allow_aggregates:
                raise PlanError(f"{n.name}() is an aggregate: it is allowed in SELECT only", n.span, source)
            star = nargs == 1 and isinstance(n.args[0], A.Star)
            if n.name in NULLARY_AGGREGATES:
                if nargs:
                    raise PlanError(f"{n.name}() takes no arguments: it measures each group's strings", n.span,
                                    source)
                continue
            if nargs != 1 or (star and n.name != "count"):
                raise PlanError(f"{n.name}() takes one argument" + (", or * for count(*)" if n.name == "count"
                                                                     else ""), n.span, source)
            if any(isinstance(m, A.Call) and m.name in AGGREGATES for a in n.args for m in a.walk()):
                raise PlanError("aggregates cannot be nested", n.span, source)
            continue
        if any(isinstance(a, A.Star) for a in n.args):
            raise PlanError(f"* is not an argument of {n.name}()", n.span, source)
        if n.name == "group":
            if not allow_rows:
                raise PlanError("group() refers to a result row; it cannot be used here", n.span, source)
            if nargs != 1:
                raise PlanError("group() takes one argument: a group number or name", n.span, source)
            continue
        if n.name in ("logprob_under", "prob_under"):
            if not allow_rows:
                raise PlanError(f"{n.name}() refers to a result row; it cannot be used here", n.span, source)
            if nargs != 1:
                raise PlanError(f"{n.name}() takes one argument: a model's name", n.span, source)
            continue
        if n.name == "coalesce":
            if nargs < 1:
                raise PlanError("coalesce() takes one or more arguments", n.span, source)
            continue
        fn = FUNCTIONS[n.name]
        most, least = len(fn.types), len(fn.types) - fn.optional
        if not least <= nargs <= most:
            want = f"{least}" if least == most else f"{least} to {most}"
            raise PlanError(f"{n.name}() takes {want} argument{'s' if most != 1 else ''}, not {nargs}", n.span,
                            source)
