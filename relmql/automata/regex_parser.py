"""The regex parser: Python ``re`` syntax → the AST of ``regex_ast``, step by step as CPython's
``re._parser`` reads it (docs/compiler.md, "The regex parser")."""

from __future__ import annotations

import re
from typing import List, Optional

from ..errors import RegexError
from .charset import ALL, NEWLINE
from .regex_ast import MAXREPEAT, Alt, Anchor, Atomic, Chars, Cond, Group, Node, Repeat, Seq, Text
from .regex_chars import (DIGITS, FLAG_A, FLAG_I, FLAG_M, FLAG_S, FLAG_U, FLAG_X, FLAGS, REPEAT_CHARS, SPECIAL_CHARS,
                          WHITESPACE, CharParser)

_PLAIN_RUN = re.compile(r"[^.\\\[{()*+?^$|\ud800-\udfff]+")  # literal characters without flags i and x


class Cursor:
    """A place in the pattern ``s`` (at ``i``), read one "char" at a time: a single character or a
    backslash escape of two."""

    def __init__(self, source: str):
        self.s = source
        self.i = 0

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


class Parser:
    """Reads a whole pattern into its AST; its characters are read by the ``CharParser`` it owns,
    at the same ``Cursor``."""

    def __init__(self, source: str):
        self.cur = Cursor(source)
        self.chars = CharParser(self.cur)
        self.flags = 0
        self.group_count = 0
        self.group_names = {}

    # -- grammar
    def parse(self) -> Node:
        """The AST of the whole pattern."""
        node = self.parse_alt(self.flags, nested=0)
        return node

    def parse_alt(self, flags: int, nested: int) -> Node:
        start = self.cur.i
        items = [self.parse_seq(flags, nested, first=not nested)]
        while self.cur.match("|"):
            if not nested:
                flags = self.flags
            items.append(self.parse_seq(flags, nested, first=False))
        if len(items) == 1:
            return items[0]
        return Alt((start, self.cur.i), tuple(items))

    def parse_seq(self, flags: int, nested: int, first: bool) -> Node:
        """The items up to the next ``|`` or ``)``, one after the other (``first``: at the pattern's
        start, where global flags may still come)."""
        cur = self.cur
        start = cur.i
        items: List[Node] = []
        while True:
            this_pos = cur.i
            if not flags & (FLAG_I | FLAG_X) and self._plain_run(items):
                continue
            this = cur.peek()
            if this is None or this in "|)":
                break
            cur.get()
            if flags & FLAG_X and self._verbose_skip(this):
                continue
            if this == "(":
                node = self.group(this_pos, flags, nested, first and not items)
                if node is not None:
                    items.append(node)
                elif not nested:
                    flags = self.flags  # a comment, or global flags just read
            else:
                self._atom(this, this_pos, flags, items)
        if len(items) == 1:
            return items[0]
        return Seq((start, cur.i), tuple(items))

    def _plain_run(self, items: List[Node]) -> bool:
        """Read a run of two or more literal characters as one ``Text`` (the last one left to a
        quantifier that follows); whether there was one."""
        cur = self.cur
        run = _PLAIN_RUN.match(cur.s, cur.i)
        if not run:
            return False
        start, end = cur.i, run.end()
        if end < len(cur.s) and cur.s[end] in REPEAT_CHARS:
            end -= 1  # the last character takes the quantifier
        if end - start <= 1:
            return False
        cur.i = end
        items.append(Text((start, end), cur.s[start:end]))
        return True

    def _verbose_skip(self, this: str) -> bool:
        """Under ``(?x)``: whether ``this`` (just read) is whitespace or starts a comment, which is skipped."""
        if this in WHITESPACE:
            return True
        if this == "#":
            while True:
                c = self.cur.get()
                if c is None or c == "\n":
                    break
            return True
        return False

    def _atom(self, this: str, pos: int, flags: int, items: List[Node]) -> None:
        """Add to ``items`` what ``this`` (just read at ``pos``, not a group) is: a character, a class,
        an anchor, or a quantifier applied to the last item."""
        cur = self.cur
        if this[0] == "\\":
            items.append(self.chars.escape(this, pos, flags))
        elif this not in SPECIAL_CHARS:
            items.append(self.chars.literal(ord(this), (pos, cur.i), flags))
        elif this == "[":
            items.append(self.chars.char_class(pos, flags))
        elif this in REPEAT_CHARS:
            rep = self.quantifier(this, pos)
            if rep is None:  # a "{" that is not a quantifier is a literal
                items.append(self.chars.literal(ord("{"), (pos, pos + 1), flags))
                return
            lo, hi = rep
            item = items.pop()
            lazy = cur.match("?")
            possessive = not lazy and cur.match("+")
            items.append(Repeat((item.span[0], cur.i), item, lo, hi, lazy, possessive))
        elif this == ".":
            chars = ALL if flags & FLAG_S else ALL.difference(NEWLINE)
            items.append(Chars((pos, cur.i), chars.encodable()))
        elif this == "^":
            items.append(Anchor((pos, cur.i), "line start" if flags & FLAG_M else "start"))
        elif this == "$":
            items.append(Anchor((pos, cur.i), "line end" if flags & FLAG_M else "end"))
        else:  # pragma: no cover - re.compile accepted it
            raise AssertionError(this)

    def quantifier(self, this: str, pos: int):
        if this == "?":
            return 0, 1
        if this == "*":
            return 0, MAXREPEAT
        if this == "+":
            return 1, MAXREPEAT
        # "{"
        if self.cur.peek() == "}":
            return None
        here = self.cur.i
        lo = hi = ""
        while self.cur.peek() in DIGITS:
            lo += self.cur.get()
        if self.cur.match(","):
            while self.cur.peek() in DIGITS:
                hi += self.cur.get()
        else:
            hi = lo
        if not self.cur.match("}"):
            self.cur.i = here
            return None
        return (int(lo) if lo else 0), (int(hi) if hi else MAXREPEAT)

    def group(self, start: int, flags: int, nested: int, first: bool) -> Optional[Node]:
        """The group whose ``(`` is at ``start``: its node, or None for a comment or global flags."""
        cur = self.cur
        capture, name, add, delete = True, None, 0, 0
        if cur.match("?"):
            c = cur.get()
            if c == "P":
                if cur.match("<"):
                    name = cur.getuntil(">")
                    self.group_names[name] = self.group_count + 1
                else:  # (?P=name)
                    cur.getuntil(")")
                    cur.unsupported("back-references are not regular and cannot be compiled", start)
            elif c == ":":
                capture = False
            elif c == "#":
                cur.getuntil(")")
                return None
            elif c in "=!<":
                kind = "look-behind" if c == "<" else "look-ahead"
                self._skip_group()
                cur.unsupported(f"{kind} assertions are not supported", start)
            elif c == "(":
                cond = cur.getuntil(")")
                group = self.group_names[cond] if cond.isidentifier() else int(cond)
                yes = self.parse_seq(flags, nested + 1, first=False)
                no = self.parse_seq(flags, nested + 1, first=False) if cur.match("|") else \
                    Seq((cur.i, cur.i), ())
                cur.match(")")
                return Cond((start, cur.i), group, yes, no)
            elif c == ">":
                item = self.parse_alt(flags, nested + 1)
                cur.match(")")
                return Atomic((start, cur.i), item)
            else:  # flags
                while c not in (":", ")", "-"):
                    add |= FLAGS[c]
                    c = cur.get()
                if c == "-":
                    c = cur.get()
                    while c != ":":
                        delete |= FLAGS[c]
                        c = cur.get()
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
        cur.match(")")
        if capture or add or delete:
            return Group((start, cur.i), item, index, name)
        return item

    def _skip_group(self):
        depth = 1
        while depth:
            c = self.cur.get()
            if c is None:
                return
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
            elif c == "[":
                self._skip_class()

    def _skip_class(self):
        self.cur.match("^")
        first = True
        while True:
            c = self.cur.get()
            if c is None or (c == "]" and not first):
                return
            first = False
