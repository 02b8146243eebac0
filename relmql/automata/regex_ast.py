"""The regex AST: the nodes a parsed pattern is made of, with their source spans (docs/compiler.md,
"The regex parser")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from ..errors import Span
from .charset import CodepointSet

MAXREPEAT = None  # an unbounded repetition


@dataclass(frozen=True)
class Node:
    span: Span  # where the node is written in the pattern


@dataclass(frozen=True)
class Chars(Node):
    """One character from ``chars``."""
    chars: CodepointSet  # the code points it matches


@dataclass(frozen=True)
class Text(Node):
    """A run of literal characters (read as one node, so that long word lists stay cheap)."""
    text: str  # the characters, in order


@dataclass(frozen=True)
class Seq(Node):
    """Its items one after the other."""
    items: Tuple[Node, ...]  # in order (none: the empty string)


@dataclass(frozen=True)
class Alt(Node):
    """One of its items, tried left to right."""
    items: Tuple[Node, ...]  # the alternatives, in order


@dataclass(frozen=True)
class Repeat(Node):
    """``item`` repeated from ``min`` to ``max`` times."""
    item: Node  # what is repeated
    min: int  # the fewest repetitions
    max: Optional[int]  # None: unbounded
    lazy: bool = False  # x*?: the fewest repetitions first
    possessive: bool = False  # x*+: as many as possible, never given back


@dataclass(frozen=True)
class Group(Node):
    """A capturing group (index from 1) or a scoped-flag group (index 0)."""
    item: Node  # what the group holds
    index: int  # its number (0: a scoped-flag group)
    name: Optional[str]  # its name, for (?P<name>...)


@dataclass(frozen=True)
class Anchor(Node):
    """A zero-width assertion; ``kind`` is one of ``ANCHOR_KINDS``. Anchors at the very start or
    end of the pattern are removed by ``strip_anchors``."""
    kind: str  # one of ANCHOR_KINDS


# "start": ^ or \A (position 0); "line start": ^ under (?m) (also after a newline); "end": $
# (at the end or before a newline that ends the string); "line end": $ under (?m) (also before
# any newline); "string end": \Z (at the end only)
ANCHOR_KINDS = ("start", "line start", "end", "line end", "string end")


@dataclass(frozen=True)
class Atomic(Node):
    """``(?>item)``: the first way ``item`` matches (in backtracking order) is never given up."""
    item: Node  # what the group holds


@dataclass(frozen=True)
class Cond(Node):
    """``(?(group)yes|no)``: ``yes`` where the group has matched so far, else ``no``."""
    group: int  # the number of the group tested
    yes: Node  # where the group has matched
    no: Node  # where it has not (an empty Seq where not written)


@dataclass(frozen=True)
class Pattern:
    """A parsed pattern: the AST, its source, and its capture groups."""
    root: Node  # the AST, edge anchors removed
    source: str  # the pattern as written
    groups: int  # how many capture groups it has
    group_names: Tuple[Tuple[str, int], ...]  # (name, number) of each named group, by number


def children(node: Node) -> Tuple[Node, ...]:
    """The direct subexpressions of ``node``."""
    return _CHILDREN.get(type(node), _no_children)(node)


def _no_children(node: Node) -> Tuple[Node, ...]:
    return ()


_CHILDREN = {
    Seq: lambda node: node.items,
    Alt: lambda node: node.items,
    Group: lambda node: (node.item,),
    Repeat: lambda node: (node.item,),
    Atomic: lambda node: (node.item,),
    Cond: lambda node: (node.yes, node.no),
}


def is_backtracking(node: Node) -> bool:
    """Whether the set of strings of ``node`` depends on the order in which Python's engine tries
    alternatives: it holds an atomic group, a possessive repetition, a conditional, or an anchor
    (which ``strip_anchors`` left because it is not at an edge)."""
    if isinstance(node, (Anchor, Atomic, Cond)) or (isinstance(node, Repeat) and node.possessive):
        return True
    return any(is_backtracking(n) for n in children(node))

