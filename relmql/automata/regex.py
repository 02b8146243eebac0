"""Python ``re`` syntax → a small regular-expression AST with source spans.

The pattern is first checked by ``re.compile`` itself, so every syntax error is Python's own
message at Python's own position. The parser below follows CPython's ``re._parser`` step by
step, but keeps the span of every node and rejects what is not a regular language: back-references,
look-around and word boundaries. Alternation order and lazy quantifiers are kept (atomic groups,
possessive quantifiers and conditionals make the set of strings depend on them); anchors at the
very start or end are removed, since ``re.fullmatch`` makes them redundant. Conditionals whose
result Python's engine decides from leftovers of failed attempts are refused with the reason.
"""

from __future__ import annotations

import functools
import re
import unicodedata
import warnings
from dataclasses import dataclass
from typing import Optional, Tuple

from ..errors import RegexError, Span
from ..syntax.regexes import compiled as python_regex
from .charset import ALL, NEWLINE, CodepointSet, category

MAXREPEAT = None  # an unbounded repetition


# ---------------------------------------------------------------- AST


@dataclass(frozen=True)
class Node:
    span: Span


@dataclass(frozen=True)
class Chars(Node):
    """One character from ``chars``."""
    chars: CodepointSet


@dataclass(frozen=True)
class Text(Node):
    """A run of literal characters (read as one node, so that long word lists stay cheap)."""
    text: str


@dataclass(frozen=True)
class Seq(Node):
    items: Tuple[Node, ...]


@dataclass(frozen=True)
class Alt(Node):
    items: Tuple[Node, ...]


@dataclass(frozen=True)
class Repeat(Node):
    item: Node
    min: int
    max: Optional[int]  # None: unbounded
    lazy: bool = False  # x*?: the fewest repetitions first
    possessive: bool = False  # x*+: as many as possible, never given back


@dataclass(frozen=True)
class Group(Node):
    """A capturing group (index from 1) or a scoped-flag group (index 0)."""
    item: Node
    index: int
    name: Optional[str]


@dataclass(frozen=True)
class Anchor(Node):
    """A zero-width assertion; ``kind`` is one of ``ANCHOR_KINDS``. Anchors at the very start or
    end of the pattern are removed by ``strip_anchors``."""
    kind: str


# "start": ^ or \A (position 0); "line start": ^ under (?m) (also after a newline); "end": $
# (at the end or before a newline that ends the string); "line end": $ under (?m) (also before
# any newline); "string end": \Z (at the end only)
ANCHOR_KINDS = ("start", "line start", "end", "line end", "string end")


@dataclass(frozen=True)
class Atomic(Node):
    """``(?>item)``: the first way ``item`` matches (in backtracking order) is never given up."""
    item: Node


@dataclass(frozen=True)
class Cond(Node):
    """``(?(group)yes|no)``: ``yes`` where the group has matched so far, else ``no``."""
    group: int
    yes: Node
    no: Node


@dataclass(frozen=True)
class Pattern:
    """A parsed pattern: the AST, its source, and its capture groups."""
    root: Node
    source: str
    groups: int
    group_names: Tuple[Tuple[str, int], ...]


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


# ---------------------------------------------------------------- flags

FLAG_I, FLAG_M, FLAG_S, FLAG_X, FLAG_A, FLAG_U = 1, 2, 4, 8, 16, 32
FLAGS = {"i": FLAG_I, "m": FLAG_M, "s": FLAG_S, "x": FLAG_X, "a": FLAG_A, "u": FLAG_U}
_FLAG_LETTERS = {v: k for k, v in FLAGS.items()}

SPECIAL_CHARS = ".\\[{()*+?^$|"
REPEAT_CHARS = "*+?{"
DIGITS = frozenset("0123456789")
OCTDIGITS = frozenset("01234567")
HEXDIGITS = frozenset("0123456789abcdefABCDEF")
ASCIILETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
WHITESPACE = frozenset(" \t\n\r\v\f")
SIMPLE_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92}
_PLAIN_RUN = re.compile(r"[^.\\\[{()*+?^$|\ud800-\udfff]+")  # literal characters without flags i and x


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
    parser = _Parser(pattern)
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


class _Parser:
    def __init__(self, source: str):
        self.s = source
        self.i = 0
        self.flags = 0
        self.group_count = 0
        self.group_names = {}

    # -- tokenizer (one "char" is a single character or a backslash escape of two)
    def peek(self) -> Optional[str]:
        if self.i >= len(self.s):
            return None
        if self.s[self.i] == "\\":
            return self.s[self.i:self.i + 2]
        return self.s[self.i]

    def get(self) -> Optional[str]:
        c = self.peek()
        if c is not None:
            self.i += len(c)
        return c

    def match(self, c: str) -> bool:
        if self.peek() == c:
            self.i += len(c)
            return True
        return False

    def getwhile(self, n: int, charset) -> str:
        out = ""
        for _ in range(n):
            c = self.peek()
            if c is None or c not in charset:
                break
            out += c
            self.i += 1
        return out

    def getuntil(self, terminator: str) -> str:
        out = ""
        while True:
            c = self.get()
            if c == terminator or c is None:
                return out
            out += c

    def unsupported(self, message: str, start: int, end: Optional[int] = None):
        raise RegexError(message, (start, end if end is not None else self.i), self.s)

    # -- grammar
    def parse(self) -> Node:
        node = self.parse_alt(self.flags, nested=0)
        return node

    def parse_alt(self, flags: int, nested: int) -> Node:
        start = self.i
        items = [self.parse_seq(flags, nested, first=not nested)]
        while self.match("|"):
            if not nested:
                flags = self.flags
            items.append(self.parse_seq(flags, nested, first=False))
        if len(items) == 1:
            return items[0]
        return Alt((start, self.i), tuple(items))

    def parse_seq(self, flags: int, nested: int, first: bool) -> Node:
        start = self.i
        items = []
        while True:
            this_pos = self.i
            run = None if flags & (FLAG_I | FLAG_X) else _PLAIN_RUN.match(self.s, self.i)
            if run:
                end = run.end()
                if end < len(self.s) and self.s[end] in REPEAT_CHARS:
                    end -= 1  # the last character takes the quantifier
                if end - this_pos > 1:
                    self.i = end
                    items.append(Text((this_pos, end), self.s[this_pos:end]))
                    continue
            this = self.peek()
            if this is None or this in "|)":
                break
            self.get()
            if flags & FLAG_X:
                if this in WHITESPACE:
                    continue
                if this == "#":
                    while True:
                        c = self.get()
                        if c is None or c == "\n":
                            break
                    continue
            if this[0] == "\\":
                items.append(self.escape(this, this_pos, flags))
            elif this not in SPECIAL_CHARS:
                items.append(self.literal(ord(this), (this_pos, self.i), flags))
            elif this == "[":
                items.append(self.char_class(this_pos, flags))
            elif this in REPEAT_CHARS:
                rep = self.quantifier(this, this_pos)
                if rep is None:  # a "{" that is not a quantifier is a literal
                    items.append(self.literal(ord("{"), (this_pos, this_pos + 1), flags))
                    continue
                lo, hi = rep
                item = items.pop()
                lazy = self.match("?")
                possessive = not lazy and self.match("+")
                items.append(Repeat((item.span[0], self.i), item, lo, hi, lazy, possessive))
            elif this == ".":
                chars = ALL if flags & FLAG_S else ALL.difference(NEWLINE)
                items.append(Chars((this_pos, self.i), chars.encodable()))
            elif this == "(":
                node = self.group(this_pos, flags, nested, first and not items)
                if node is not None:
                    items.append(node)
                elif not nested:
                    flags = self.flags  # a comment, or global flags just read
            elif this == "^":
                items.append(Anchor((this_pos, self.i), "line start" if flags & FLAG_M else "start"))
            elif this == "$":
                items.append(Anchor((this_pos, self.i), "line end" if flags & FLAG_M else "end"))
            else:  # pragma: no cover - re.compile accepted it
                raise AssertionError(this)
        if len(items) == 1:
            return items[0]
        return Seq((start, self.i), tuple(items))

    def quantifier(self, this: str, pos: int):
        if this == "?":
            return 0, 1
        if this == "*":
            return 0, MAXREPEAT
        if this == "+":
            return 1, MAXREPEAT
        # "{"
        if self.peek() == "}":
            return None
        here = self.i
        lo = hi = ""
        while self.peek() in DIGITS:
            lo += self.get()
        if self.match(","):
            while self.peek() in DIGITS:
                hi += self.get()
        else:
            hi = lo
        if not self.match("}"):
            self.i = here
            return None
        return (int(lo) if lo else 0), (int(hi) if hi else MAXREPEAT)

    def group(self, start: int, flags: int, nested: int, first: bool) -> Optional[Node]:
        capture, name, add, delete = True, None, 0, 0
        if self.match("?"):
            c = self.get()
            if c == "P":
                if self.match("<"):
                    name = self.getuntil(">")
                    self.group_names[name] = self.group_count + 1
                else:  # (?P=name)
                    self.getuntil(")")
                    self.unsupported("back-references are not regular and cannot be compiled", start)
            elif c == ":":
                capture = False
            elif c == "#":
                self.getuntil(")")
                return None
            elif c in "=!<":
                kind = "look-behind" if c == "<" else "look-ahead"
                self._skip_group()
                self.unsupported(f"{kind} assertions are not supported", start)
            elif c == "(":
                cond = self.getuntil(")")
                group = self.group_names[cond] if cond.isidentifier() else int(cond)
                yes = self.parse_seq(flags, nested + 1, first=False)
                no = self.parse_seq(flags, nested + 1, first=False) if self.match("|") else Seq((self.i, self.i), ())
                self.match(")")
                return Cond((start, self.i), group, yes, no)
            elif c == ">":
                item = self.parse_alt(flags, nested + 1)
                self.match(")")
                return Atomic((start, self.i), item)
            else:  # flags
                while c not in (":", ")", "-"):
                    add |= FLAGS[c]
                    c = self.get()
                if c == "-":
                    c = self.get()
                    while c != ":":
                        delete |= FLAGS[c]
                        c = self.get()
                if c == ")":  # global flags
                    self.flags |= add
                    return None
                capture = False
        index = 0
        if capture:
            self.group_count += 1
            index = self.group_count
        if add & (FLAG_A | FLAG_U):  # as CPython: turning on one of a/u turns off the other
            flags &= ~(FLAG_A | FLAG_U)
        inner = (flags | add) & ~delete
        item = self.parse_alt(inner, nested + 1)
        self.match(")")
        if capture or add or delete:
            return Group((start, self.i), item, index, name)
        return item

    def _skip_group(self):
        depth = 1
        while depth:
            c = self.get()
            if c is None:
                return
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "[":
                self._skip_class()

    def _skip_class(self):
        self.match("^")
        first = True
        while True:
            c = self.get()
            if c is None or (c == "]" and not first):
                return
            first = False

    def literal(self, cp: int, span: Span, flags: int) -> Chars:
        if 0xD800 <= cp <= 0xDFFF:  # else "MATCHING matches no string", with no word of why
            low = re.match(r"\\u([dD][c-fC-F][0-9a-fA-F]{2})", self.s[span[1]:])
            if cp < 0xDC00 and low:  # a UTF-16 pair, as JSON and JavaScript write one
                c = 0x10000 + ((cp - 0xD800) << 10) + (int(low.group(1), 16) - 0xDC00)
                self.unsupported(f"\\u{cp:04x}\\u{low.group(1).lower()} is a UTF-16 pair of surrogates, which re reads "
                                 f"as two code points no UTF-8 text holds: write the character it stands for, "
                                 f"{chr(c)} or \\U{c:08X}", span[0], span[1] + 6)
            self.unsupported(f"U+{cp:04X} is a surrogate code point, which no UTF-8 text holds", *span)
        chars = CodepointSet.of(cp)
        if flags & FLAG_I:
            chars = _ignorecase(self.s[span[0]:span[1]], chars, flags)
        return Chars(span, chars.encodable())

    def escape(self, esc: str, pos: int, flags: int) -> Node:
        c = esc[1]
        span = lambda: (pos, self.i)  # noqa: E731
        if c in "AZ":
            return Anchor(span(), "start" if c == "A" else "string end")
        if c in "bB":
            self.unsupported("word boundaries (\\b, \\B) are not supported", pos)
        if c in "dswDSW":
            chars = category(c.lower(), bool(flags & FLAG_A))
            if c.isupper():
                chars = chars.complement()
            if flags & FLAG_I:
                chars = _ignorecase(esc, chars, flags)
            return Chars(span(), chars.encodable())
        if c in DIGITS and c != "0":
            # octal escape (three octal digits) or a group reference
            if self.peek() in DIGITS:
                d2 = self.get()
                if c in OCTDIGITS and d2 in OCTDIGITS and self.peek() in OCTDIGITS:
                    d3 = self.get()
                    return self.literal(int(c + d2 + d3, 8), span(), flags)
            self.unsupported("back-references are not regular and cannot be compiled", pos)
        return self.literal(self._escape_cp(esc), span(), flags)

    def _escape_cp(self, esc: str) -> int:
        """The code point of a literal escape (also valid inside a class)."""
        c = esc[1]
        if c in SIMPLE_ESCAPES:
            return SIMPLE_ESCAPES[c]
        if c == "x":
            return int(self.getwhile(2, HEXDIGITS), 16)
        if c == "u":
            return int(self.getwhile(4, HEXDIGITS), 16)
        if c == "U":
            return int(self.getwhile(8, HEXDIGITS), 16)
        if c == "N":
            self.match("{")
            return ord(unicodedata.lookup(self.getuntil("}")))
        if c in OCTDIGITS:
            return int(c + self.getwhile(2, OCTDIGITS), 8)
        return ord(c)

    def char_class(self, start: int, flags: int) -> Chars:
        negate = self.match("^")
        items = []
        first = True
        while True:
            this = self.get()
            if this == "]" and not first:
                break
            first = False
            if this[0] == "\\":
                code1 = self._class_escape(this, flags)
            else:
                code1 = ord(this)
            if self.match("-"):
                that = self.get()
                if that == "]":
                    items.append(code1 if isinstance(code1, CodepointSet) else CodepointSet.of(code1))
                    items.append(CodepointSet.of(ord("-")))
                    break
                code2 = self._class_escape(that, flags) if that[0] == "\\" else ord(that)
                items.append(CodepointSet([(code1, code2)]))
            else:
                items.append(code1 if isinstance(code1, CodepointSet) else CodepointSet.of(code1))
        chars = CodepointSet()
        for item in items:
            chars = chars.union(item)
        if negate:
            chars = chars.complement()
        span = (start, self.i)
        if flags & FLAG_I:
            chars = _ignorecase(self.s[start:self.i], chars, flags)
        return Chars(span, chars.encodable())

    def _class_escape(self, esc: str, flags: int):
        c = esc[1]
        if c in "dswDSW":
            chars = category(c.lower(), bool(flags & FLAG_A))
            return chars.complement() if c.isupper() else chars
        return self._escape_cp(esc)


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


# ---------------------------------------------------------------- IGNORECASE


@functools.lru_cache(maxsize=1)
def _cased() -> CodepointSet:
    """Code points whose match under re.IGNORECASE can differ from an exact match."""
    import _sre
    cps = set()
    for c in range(0x110000):
        low = _sre.unicode_tolower(c)
        if low != c or _sre.unicode_iscased(c):
            cps.add(c)
            cps.add(low)
    return CodepointSet((c, c) for c in cps)


def _ignorecase(atom_source: str, chars: CodepointSet, flags: int) -> CodepointSet:
    """``chars`` as matched by ``atom_source`` under re.IGNORECASE, decided by ``re`` itself for
    every code point that has a case mapping (all others match exactly as without the flag)."""
    letters = "".join(_FLAG_LETTERS[f] for f in (FLAG_I, FLAG_S, FLAG_A) if flags & f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        oracle = re.compile(f"(?{letters}:{atom_source})")
    cased = _cased()
    keep = chars.difference(cased)
    extra = [c for c in cased.codepoints() if not (0xD800 <= c <= 0xDFFF) and oracle.fullmatch(chr(c))]
    return keep.union(CodepointSet((c, c) for c in extra))


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
