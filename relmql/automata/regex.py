"""Python ``re`` syntax → a small regular-expression AST with source spans: ``parse`` checks the
pattern with ``re`` itself, parses it (``regex_parser``), removes the anchors at its edges and refuses
the conditionals Python decides from leftovers (docs/compiler.md, "The regex parser")."""

from __future__ import annotations

import re
from typing import Tuple

from ..errors import RegexError
from ..syntax.regexes import compiled as python_regex
from .regex_ast import (ANCHOR_KINDS, MAXREPEAT, Alt, Anchor, Atomic, Chars, Cond, Group, Node, Pattern, Repeat, Seq,
                        Text, children, is_backtracking)
from .regex_parser import Parser

__all__ = ["parse", "atom_count", "strip_anchors", "check_conditionals", "Pattern", "Node", "Chars", "Text", "Seq",
           "Alt", "Repeat", "Group", "Anchor", "Atomic", "Cond", "ANCHOR_KINDS", "MAXREPEAT", "children",
           "is_backtracking"]


def parse(pattern: str) -> Pattern:
    """Parse ``pattern`` (Python ``re`` syntax) into a ``Pattern`` with edge anchors removed.

    Raises ``RegexError`` with a span inside ``pattern`` for invalid or non-regular patterns.
    """
    try:
        compiled = python_regex(pattern)
    except re.error as e:
        pos = e.pos if e.pos is not None else 0
        raise RegexError(e.msg, (pos, pos + 1), pattern) from None
    except (OverflowError, RecursionError) as e:
        raise RegexError(f"pattern too complex for Python's re: {e}", (0, len(pattern)), pattern) from None
    parser = Parser(pattern)
    try:
        root = parser.parse()
    except RegexError:
        raise
    except RecursionError:
        raise RegexError("this pattern is nested too deeply", (0, len(pattern)), pattern) from None
    except Exception as e:  # pragma: no cover - a construct re accepts that the port does not
        raise RegexError(f"relmql cannot read this pattern ({type(e).__name__})", (0, len(pattern)),
                         pattern) from None
    root = strip_anchors(root, pattern)
    check_conditionals(root, pattern)
    names = tuple(sorted(compiled.groupindex.items(), key=lambda kv: kv[1]))
    return Pattern(root, pattern, compiled.groups, names)


# ---------------------------------------------------------------- size, from the source alone

# One scan over the source: escapes that are one character become "\" (counted), escapes and
# literals that are no character (anchors, group references, surrogates), classes (which can be
# empty), group and flag syntax, comments and quantifier bounds are dropped, and a quantifier
# with an upper bound of 0 becomes "{".
_ATOMS = r"""(?sx)
  \\(?:[AZbB]|[1-9][0-9]{0,2}|u[dD][89a-fA-F][0-9a-fA-F]{2}|U0000[dD][89a-fA-F][0-9a-fA-F]{2})
| (?P<one>\\)(?:x[0-9a-fA-F]{0,2}|u[0-9a-fA-F]{0,4}|U[0-9a-fA-F]{0,8}|N\{[^}]*\}|0[0-7]{0,2}|.)
| \[\^?\]?(?:\\.|[^\\\]])*\]
| \(\?(?:\#[^)]*\)|P?<[^>]*>|P=[^)]*\)|\([^)]*\)|>|[aiLmsux-]*[:)])?
| (?P<zero>\{)0*,?0*\}
| \{[0-9]*,?[0-9]*\}
| [{\ud800-\udfff]"""
_SCAN = re.compile(_ATOMS)
_SCAN_VERBOSE = re.compile(_ATOMS + r"| \#[^\n]* | \s+")
_VERBOSE_FLAG = re.compile(r"\(\?[aiLmsux-]*x")
_NOT_ATOMS = re.compile(r"[.\[\]}()*+?^$|]")


def atom_count(source: str) -> int:
    """A lower bound, read from the source text without parsing it, of how many characters and
    classes the pattern has outside repetitions of at most 0 (each one adds at least one state to
    ``regex_fst.estimate_states``), so that a huge pattern is refused before Python's ``re`` reads it."""
    scan = _SCAN_VERBOSE if _VERBOSE_FLAG.search(source) else _SCAN  # (?x) may drop spaces
    kept = scan.sub(r"\g<one>\g<zero>", source)
    kept = kept[kept.rfind("{") + 1:]  # what a {0} may repeat zero times is before it
    return len(_NOT_ATOMS.sub("", kept))



# ---------------------------------------------------------------- anchors


def strip_anchors(node: Node, source: str) -> Node:
    """Replace anchors at the very start or end by nothing (``re.fullmatch`` makes them true on
    every path that reaches them); the others stay, for ``backtrack`` to compile. Anchors inside
    atomic groups, possessive repetitions and conditionals stay too: there a failing anchor
    decides which option the engine commits to."""
    return _strip(node, True, True, source)


def _has_anchor(node: Node) -> bool:
    return isinstance(node, Anchor) or any(_has_anchor(n) for n in children(node))


def _zero_width(node: Node) -> bool:
    if isinstance(node, Group):
        return _zero_width(node.item)
    return isinstance(node, Anchor) or (isinstance(node, Seq) and all(_zero_width(n) for n in node.items))


def _strip(node: Node, at_start: bool, at_end: bool, source: str) -> Node:
    strip = _STRIP.get(type(node))
    return node if strip is None else strip(node, at_start, at_end, source)


def _strip_anchor(node: Anchor, at_start: bool, at_end: bool, source: str) -> Node:
    if not (at_start if node.kind in ("start", "line start") else at_end):
        return node
    return Seq(node.span, ())


def _strip_seq(node: Seq, at_start: bool, at_end: bool, source: str) -> Node:
    items = node.items
    if not any(_has_anchor(n) for n in items):
        return node
    zero = [_zero_width(n) for n in items]
    before = [True] * (len(items) + 1)  # before[k]: items[:k] are all zero-width
    for k, z in enumerate(zero):
        before[k + 1] = before[k] and z
    after = [True] * (len(items) + 1)  # after[k]: items[k:] are all zero-width
    for k in range(len(items) - 1, -1, -1):
        after[k] = after[k + 1] and zero[k]
    return Seq(node.span, tuple(_strip(item, at_start and before[k], at_end and after[k + 1], source)
                                for k, item in enumerate(items)))


def _strip_alt(node: Alt, at_start: bool, at_end: bool, source: str) -> Node:
    return Alt(node.span, tuple(_strip(n, at_start, at_end, source) for n in node.items))


def _strip_group(node: Group, at_start: bool, at_end: bool, source: str) -> Node:
    return Group(node.span, _strip(node.item, at_start, at_end, source), node.index, node.name)


def _strip_repeat(node: Repeat, at_start: bool, at_end: bool, source: str) -> Node:
    if node.possessive:  # a failing anchor makes the engine try the next option: keep it
        return node
    once = node.max is not None and node.max <= 1
    return Repeat(node.span, _strip(node.item, at_start and once, at_end and once, source), node.min, node.max,
                  node.lazy, node.possessive)


_STRIP = {  # the nodes that may hold an anchor; the others stay as they are
    Anchor: _strip_anchor,
    Seq: _strip_seq,
    Alt: _strip_alt,
    Group: _strip_group,
    Repeat: _strip_repeat,
}


# ---------------------------------------------------------------- conditionals


def check_conditionals(root: Node, source: str) -> None:
    """Refuse the conditionals ``(?(g)yes|no)`` whose result Python's engine does not decide by
    whether group g has matched on the way to them.

    Python tests the positions the engine last recorded for the group's start and end, and two
    kinds of leftovers make that differ from "g has matched": inside group g itself the start
    is already the new one while the end is still from the group's previous match; and inside
    a possessive repetition that no ordinary repetition encloses, the engine does not restore
    the positions a failed attempt recorded, so a group that matched only in an attempt that
    failed still counts as matched."""
    groups, conds = {}, []

    def walk(node: Node, ancestors: Tuple[Node, ...]):
        if isinstance(node, Group) and node.index:
            groups[node.index] = (node, ancestors)
        if isinstance(node, Cond):
            conds.append((node, ancestors))
        for c in children(node):
            walk(c, ancestors + (node,))

    walk(root, ())
    for cond, ancestors in conds:
        if cond.group not in groups:
            continue  # pragma: no cover - re.compile checked the number
        group, above = groups[cond.group]
        if any(a is group for a in ancestors):
            raise RegexError(f"a conditional inside group {cond.group}, the group it tests, cannot be compiled: "
                             "there Python's re compares where this match of the group starts with where "
                             "its previous match ended, which is not whether the group has matched",
                             cond.span, source)
        loops = [k for k, a in enumerate(above) if isinstance(a, Repeat) and a.possessive
                 and (a.max is None or a.max >= 2)]
        if loops and not any(isinstance(a, Repeat) and not a.possessive for a in above[:loops[0]]):
            outer = above[loops[0]]
            raise RegexError(f"this conditional tests group {cond.group}, which is inside a possessive repetition "
                             f"(at {outer.span[0]}): there Python's re keeps what a group matched in attempts "
                             "that failed, so the test depends on the engine's search order, not on the "
                             "pattern; use a greedy repetition inside an atomic group, (?>(?:...)*)",
                             cond.span, source)
