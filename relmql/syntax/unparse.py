"""Syntax tree → text that parses back to an equal tree."""

from __future__ import annotations

import math
import re

from . import ast as A

_PRECEDENCE = {"OR": 1, "AND": 2, "NOT": 3, "=": 4, "<>": 4, "<": 4, ">": 4, "<=": 4, ">=": 4, "IN": 4,
               "MATCHES": 4, "IS": 4, "||": 5, "+": 6, "-": 6, "*": 7, "/": 7, "%": 7, "neg": 8}
_KEYWORDS = {"select", "from", "matching", "matches", "prefix", "where", "using", "order", "by", "asc", "desc",
             "sample", "group", "limit", "as", "and", "or", "not", "in", "is", "null", "true", "false", "explain",
             "set", "to", "show", "for", "each", "row", "test", "of"}


def quote(s: str) -> str:
    """``s`` as a SQL string literal."""
    return "'" + s.replace("'", "''") + "'"


def name(s: str) -> str:
    """``s`` as an identifier, quoted where it must be."""
    if re.fullmatch(r"[a-z_][a-z0-9_]*", s) and s not in _KEYWORDS:
        return s
    if s in ("prefix", "sample"):
        return s
    return '"' + s.replace('"', '""') + '"'


def _prec(node) -> int:
    if isinstance(node, A.Binary):
        return _PRECEDENCE[node.op]
    if isinstance(node, A.Unary):
        return _PRECEDENCE["NOT" if node.op == "NOT" else "neg"]
    if isinstance(node, (A.InList, A.Matches, A.IsNull)):
        return 4
    return 9


def _wrap(node, least: int) -> str:
    text = unparse(node)
    return f"({text})" if _prec(node) < least else text


def unparse(node) -> str:
    """Text for a statement, clause or expression."""
    if isinstance(node, list):
        return "\n".join(unparse(s) + ";" for s in node)
    if isinstance(node, A.Literal):
        v = node.value
        if v is None:
            return "NULL"
        if isinstance(v, bool):
            return "TRUE" if v else "FALSE"
        if isinstance(v, str):
            return quote(v)
        if isinstance(v, float):
            text = _float(v)
            return text if math.copysign(1.0, v) > 0 else f"({text})"
        return str(v) if v >= 0 else f"({v})"
    if isinstance(node, A.Param):
        return ":" + node.name
    if isinstance(node, A.Column):
        return name(node.name)
    if isinstance(node, A.Star):
        return "*"
    if isinstance(node, A.Call):
        return f"{node.name}({', '.join(unparse(a) for a in node.args)})"
    if isinstance(node, A.Unary):
        if node.op == "NOT":
            return "NOT " + _wrap(node.operand, 3)
        return "-" + _wrap(node.operand, 9)
    if isinstance(node, A.Binary):
        p = _PRECEDENCE[node.op]
        # comparisons do not chain; the right side of a left-associative operator needs a tighter bind
        left = _wrap(node.left, p + 1 if p == 4 else p)
        right = _wrap(node.right, p + 1)
        return f"{left} {node.op} {right}"
    if isinstance(node, A.InList):
        neg = "NOT " if node.negated else ""
        if len(node.items) == 1 and isinstance(node.items[0], A.Call):
            return f"{_wrap(node.operand, 5)} {neg}IN {unparse(node.items[0])}"
        return f"{_wrap(node.operand, 5)} {neg}IN ({', '.join(unparse(i) for i in node.items)})"
    if isinstance(node, A.Matches):
        op = "NOT MATCHING" if node.negated else "MATCHES"
        return f"{_wrap(node.operand, 5)} {op} {_wrap(node.pattern, 5)}"
    if isinstance(node, A.IsNull):
        return f"{_wrap(node.operand, 5)} IS {'NOT ' if node.negated else ''}NULL"
    if isinstance(node, A.SelectItem):
        text = unparse(node.expr)
        return text + (f" AS {name(node.alias)}" if node.alias is not None else "")
    if isinstance(node, A.Option):
        return node.name + ("" if node.value is None else " " + _option_value(node.value))
    if isinstance(node, A.Test):
        return f"TEST {node.kind.upper()} OF {unparse(node.a)}, {unparse(node.b)}"
    if isinstance(node, A.OrderKey):
        return f"{node.column}{'' if node.descending else ' ASC'}"
    if isinstance(node, A.Query):
        parts = []
        if node.select:
            parts.append("SELECT " + ", ".join(unparse(s) for s in node.select))
        if node.model is not None:
            m = node.model
            parts.append("FROM " + (unparse(m) if not (isinstance(m, A.Literal) and re.fullmatch(
                r"[A-Za-z0-9_][A-Za-z0-9_.\-/]*", m.value) and m.value.lower() not in _KEYWORDS) else m.value))
        for word, value in (("MATCHING", node.matching), ("PREFIX", node.prefix), ("WHERE", node.where)):
            if value is not None:
                parts.append(f"{word} {unparse(value)}")
        if node.using:
            parts.append("USING " + ", ".join(unparse(o) for o in node.using))
        if node.order:
            parts.append("ORDER BY " + ", ".join(unparse(k) + (" DESC" if k.descending else "") for k in node.order))
        if node.sample is not None:
            parts.append("SAMPLE " + unparse(node.sample))
        if node.group_by:
            parts.append("GROUP BY " + ", ".join(unparse(g) for g in node.group_by))
        if node.limit is not None:
            parts.append("LIMIT " + unparse(node.limit))
        if node.test is not None:
            parts.append(unparse(node.test))
        if node.dataset is not None:
            d = node.dataset
            text = "FOR EACH ROW IN " + unparse(d.source)
            if d.where is not None:
                text += " WHERE " + unparse(d.where)
            if d.limit is not None:
                text += " LIMIT " + unparse(d.limit)
            parts.append(text)
        return "\n".join(parts)
    if isinstance(node, A.Explain):
        return "EXPLAIN " + unparse(node.query)
    if isinstance(node, A.Set):
        return f"SET {node.name} = {unparse(node.value)}"
    if isinstance(node, A.Show):
        return f"SHOW {node.what.upper()}"
    raise TypeError(f"cannot unparse {node!r}")


def _float(v: float) -> str:
    """A float as a NUMBER token (an overflowing literal such as 1e999 reads back as infinity)."""
    if math.isinf(v):
        return "1e999" if v > 0 else "-1e999"
    return repr(v)


def _option_value(value) -> str:
    if isinstance(value, A.Literal) and isinstance(value.value, str) \
            and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value.value) and value.value.lower() not in _KEYWORDS:
        return value.value
    if isinstance(value, A.Literal) and isinstance(value.value, (int, float)) and not isinstance(value.value, bool):
        return _float(value.value) if isinstance(value.value, float) else str(value.value)
    return unparse(value)
