"""The abstract syntax tree: frozen dataclasses, each with the source span it was parsed from.

Spans are (start, end) character offsets into the statement's source text; they do not take
part in equality, so a tree parsed from ``unparse(tree)`` equals the original.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional, Tuple, Union

Span = Tuple[int, int]


@dataclass(frozen=True)
class Node:
    """Base of every syntax node."""

    def children(self):
        for f in fields(self):
            if f.name == "span":
                continue
            value = getattr(self, f.name)
            if isinstance(value, Node):
                yield value
            elif isinstance(value, tuple):
                yield from (v for v in value if isinstance(v, Node))

    def walk(self):
        """This node and every node below it, depth first."""
        yield self
        for c in self.children():
            yield from c.walk()


# -- expressions

@dataclass(frozen=True)
class Literal(Node):
    """A number, string, boolean or NULL. ``raw`` is the source text of a string literal."""

    value: Union[str, int, float, bool, None]
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Param(Node):
    """``:name``, bound from Python, the command line or a dataset row."""

    name: str
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Column(Node):
    """A result column, a named capture group, or an alias."""

    name: str
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Star(Node):
    """``*`` in ``SELECT *`` and ``count(*)``."""

    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Call(Node):
    """A function call (scalar or aggregate); ``name`` is lower-case."""

    name: str
    args: Tuple[Node, ...]
    span: Span = field(default=(0, 0), compare=False)
    name_span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Unary(Node):
    """``-x`` or ``NOT x``."""

    op: str
    operand: Node
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Binary(Node):
    """Arithmetic, comparison, ``||``, ``AND`` and ``OR``; ``op`` is upper-case for words."""

    op: str
    left: Node
    right: Node
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class InList(Node):
    """``x [NOT] IN (a, b, ...)`` or ``x [NOT] IN f(...)`` (a function returning a list)."""

    operand: Node
    items: Tuple[Node, ...]
    negated: bool
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Matches(Node):
    """``x MATCHES 'regex'`` / ``x NOT MATCHING 'regex'``: ``re.fullmatch`` of the regex."""

    operand: Node
    pattern: Node
    negated: bool
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class IsNull(Node):
    operand: Node
    negated: bool
    span: Span = field(default=(0, 0), compare=False)


# -- clauses

@dataclass(frozen=True)
class SelectItem(Node):
    expr: Node
    alias: Optional[str] = None
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Option(Node):
    """``name [value]`` in ``USING``; a bare name is ``true``."""

    name: str
    value: Optional[Node]
    span: Span = field(default=(0, 0), compare=False)
    name_span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class OrderKey(Node):
    column: str
    descending: bool = True
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Test(Node):
    """``TEST kind OF a, b``: a statistical test over the result rows (``independence``: χ²) of
    the output ``columns`` (as written; the planner checks how many the test takes)."""

    kind: str
    columns: Tuple[Node, ...]
    span: Span = field(default=(0, 0), compare=False)
    kind_span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Models(Node):
    """``FROM 'a', 'b'``: several models, the query run once on each."""

    items: Tuple[Node, ...]
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Expect(Node):
    """``EXPECT condition [AS 'name']``: a condition every result row must meet."""

    condition: Node
    name: Optional[str] = None
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Dataset(Node):
    """``FOR EACH ROW IN source [WHERE condition] [LIMIT n]``."""

    source: Node
    where: Optional[Node] = None
    limit: Optional[Node] = None
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Query(Node):
    """One query. ``select`` is empty when the statement has no SELECT."""

    select: Tuple[SelectItem, ...] = ()
    model: Optional[Node] = None  # FROM's one model, or a ``Models`` list of several
    matching: Optional[Node] = None
    prefix: Optional[Node] = None
    prompt: Optional[Node] = None
    where: Optional[Node] = None
    using: Tuple[Option, ...] = ()
    order: Tuple[OrderKey, ...] = ()
    sample: Optional[Node] = None
    group_by: Tuple[Node, ...] = ()
    limit: Optional[Node] = None
    dataset: Optional[Dataset] = None
    test: Optional[Test] = None
    expect: Optional[Expect] = None
    span: Span = field(default=(0, 0), compare=False)


# -- statements

@dataclass(frozen=True)
class Explain(Node):
    query: Query
    span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Set(Node):
    name: str
    value: Node
    span: Span = field(default=(0, 0), compare=False)
    name_span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class SetParam(Node):
    """``SET :name = value``: the parameter's value where the caller binds none (a script's default)."""
    name: str  # without the colon
    value: Node
    span: Span = field(default=(0, 0), compare=False)
    name_span: Span = field(default=(0, 0), compare=False)


@dataclass(frozen=True)
class Show(Node):
    what: str
    span: Span = field(default=(0, 0), compare=False)


Statement = Union[Query, Explain, Set, SetParam, Show]


def dump(node, indent: int = 0) -> str:
    """An indented, readable dump of a tree with spans (the AST golden files use it)."""
    pad = "  " * indent
    if not isinstance(node, Node):
        return pad + repr(node)
    head = f"{pad}{type(node).__name__}"
    if hasattr(node, "span"):
        head += f" @{node.span[0]}:{node.span[1]}"
    lines = [head]
    for f in fields(node):
        if f.name in ("span", "name_span"):
            continue
        value = getattr(node, f.name)
        if value is None or value == ():
            continue
        if isinstance(value, Node):
            lines.append(f"{pad}  {f.name}:")
            lines.append(dump(value, indent + 2))
        elif isinstance(value, tuple):
            lines.append(f"{pad}  {f.name}:")
            lines.extend(dump(v, indent + 2) for v in value)
        else:
            lines.append(f"{pad}  {f.name}: {value!r}")
    return "\n".join(lines)
