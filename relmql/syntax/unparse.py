"""Syntax tree → text that parses back to an equal tree."""

from __future__ import annotations

import math
import re

from . import ast as A

_PRECEDENCE = {"OR": 1, "AND": 2, "NOT": 3, "=": 4, "<>": 4, "<": 4, ">": 4, "<=": 4, ">=": 4, "IN": 4,
               "MATCHES": 4, "IS": 4, "||": 5, "+": 6, "-": 6, "*": 7, "/": 7, "%": 7, "neg": 8}
_KEYWORDS = {"select", "from", "matching", "matches", "prefix", "prompt", "where", "using", "order", "by", "asc",
             "desc", "sample", "group", "limit", "as", "and", "or", "not", "in", "is", "null", "true", "false",
             "explain", "set", "to", "show", "for", "each", "row", "test", "of", "expect"}


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
    prec = _PREC.get(type(node))
    return 9 if prec is None else prec(node)


_PREC = {  # how tightly an expression binds; 9 for the others
    A.Binary: lambda node: _PRECEDENCE[node.op],
    A.Unary: lambda node: _PRECEDENCE["NOT" if node.op == "NOT" else "neg"],
    A.InList: lambda node: 4,
    A.Matches: lambda node: 4,
    A.IsNull: lambda node: 4,
}


def _wrap(node, least: int) -> str:
    text = unparse(node)
    return f"({text})" if _prec(node) < least else text


def unparse(node) -> str:
    """Text for a statement, clause or expression."""
    text = _UNPARSE.get(type(node))
    if text is None:
        raise TypeError(f"cannot unparse {node!r}")
    return text(node)


def _literal(node: A.Literal) -> str:
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


def _unary(node: A.Unary) -> str:
    if node.op == "NOT":
        return "NOT " + _wrap(node.operand, 3)
    return "-" + _wrap(node.operand, 9)


def _binary(node: A.Binary) -> str:
    p = _PRECEDENCE[node.op]
    # comparisons do not chain; the right side of a left-associative operator needs a tighter bind
    left = _wrap(node.left, p + 1 if p == 4 else p)
    right = _wrap(node.right, p + 1)
    return f"{left} {node.op} {right}"


def _in_list(node: A.InList) -> str:
    neg = "NOT " if node.negated else ""
    if len(node.items) == 1 and isinstance(node.items[0], A.Call):
        return f"{_wrap(node.operand, 5)} {neg}IN {unparse(node.items[0])}"
    return f"{_wrap(node.operand, 5)} {neg}IN ({', '.join(unparse(i) for i in node.items)})"


def _matches(node: A.Matches) -> str:
    op = "NOT MATCHING" if node.negated else "MATCHES"
    return f"{_wrap(node.operand, 5)} {op} {_wrap(node.pattern, 5)}"


def _select_item(node: A.SelectItem) -> str:
    text = unparse(node.expr)
    return text + (f" AS {name(node.alias)}" if node.alias is not None else "")


def _query(node: A.Query) -> str:
    parts = []
    if node.select:
        parts.append("SELECT " + ", ".join(unparse(s) for s in node.select))
    if node.model is not None:
        refs = node.model.items if isinstance(node.model, A.Models) else (node.model,)
        parts.append("FROM " + ", ".join(unparse(m) if not (isinstance(m, A.Literal) and re.fullmatch(
            r"[A-Za-z0-9_][A-Za-z0-9_.\-/]*", m.value) and m.value.lower() not in _KEYWORDS) else m.value
            for m in refs))
    for word, value in (("MATCHING", node.matching), ("PREFIX", node.prefix), ("PROMPT", node.prompt),
                        ("WHERE", node.where)):
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
    if node.expect is not None:
        e = node.expect
        parts.append("EXPECT " + unparse(e.condition) + (f" AS {quote(e.name)}" if e.name is not None else ""))
    if node.dataset is not None:
        d = node.dataset
        text = "FOR EACH ROW IN " + unparse(d.source)
        if d.where is not None:
            text += " WHERE " + unparse(d.where)
        if d.limit is not None:
            text += " LIMIT " + unparse(d.limit)
        parts.append(text)
    return "\n".join(parts)


_UNPARSE = {
    list: lambda node: "\n".join(unparse(s) + ";" for s in node),  # statements
    A.Literal: _literal,
    A.Param: lambda node: ":" + node.name,
    A.Column: lambda node: name(node.name),
    A.Star: lambda node: "*",
    A.Call: lambda node: f"{node.name}({', '.join(unparse(a) for a in node.args)})",
    A.Unary: _unary,
    A.Binary: _binary,
    A.InList: _in_list,
    A.Matches: _matches,
    A.IsNull: lambda node: f"{_wrap(node.operand, 5)} IS {'NOT ' if node.negated else ''}NULL",
    A.SelectItem: _select_item,
    A.Option: lambda node: node.name + ("" if node.value is None else " " + _option_value(node.value)),
    A.Test: lambda node: f"TEST {node.kind.upper()} OF {', '.join(unparse(c) for c in node.columns)}",
    A.OrderKey: lambda node: f"{node.column}{'' if node.descending else ' ASC'}",
    A.Query: _query,
    A.Explain: lambda node: "EXPLAIN " + unparse(node.query),
    A.Set: lambda node: f"SET {node.name} = {unparse(node.value)}",
    A.SetParam: lambda node: f"SET :{node.name} = {unparse(node.value)}",
    A.Show: lambda node: f"SHOW {node.what.upper()}",
}


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
