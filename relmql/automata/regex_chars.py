"""The characters of a regex: its flags, literals, escapes and classes, and what they match under
``(?i)`` (docs/compiler.md, "The regex parser")."""

from __future__ import annotations

import functools
import re
import unicodedata
import warnings

from ..errors import Span
from .charset import CodepointSet, category
from .regex_ast import Anchor, Chars, Node

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


class CharParser:
    """Reads the characters of a pattern at the cursor of the parser that owns it (``cursor``:
    ``regex_parser.Cursor``): literals, escapes and classes, each a ``Chars`` node (or an anchor)."""

    def __init__(self, cursor):
        self.cur = cursor

    def literal(self, cp: int, span: Span, flags: int) -> Chars:
        """The character ``cp``, written at ``span`` (with the case variants ``(?i)`` matches)."""
        cur = self.cur
        if 0xD800 <= cp <= 0xDFFF:  # else "MATCHING matches no string", with no word of why
            low = re.match(r"\\u([dD][c-fC-F][0-9a-fA-F]{2})", cur.s[span[1]:])
            if cp < 0xDC00 and low:  # a UTF-16 pair, as JSON and JavaScript write one
                c = 0x10000 + ((cp - 0xD800) << 10) + (int(low.group(1), 16) - 0xDC00)
                cur.unsupported(f"\\u{cp:04x}\\u{low.group(1).lower()} is a UTF-16 pair of surrogates, which re reads "
                                f"as two code points no UTF-8 text holds: write the character it stands for, "
                                f"{chr(c)} or \\U{c:08X}", span[0], span[1] + 6)
            cur.unsupported(f"U+{cp:04X} is a surrogate code point, which no UTF-8 text holds", *span)
        chars = CodepointSet.of(cp)
        if flags & FLAG_I:
            chars = _ignorecase(cur.s[span[0]:span[1]], chars, flags)
        return Chars(span, chars.encodable())

    def escape(self, esc: str, pos: int, flags: int) -> Node:
        """The backslash escape ``esc`` read at ``pos``, outside a class: a character, a category or an anchor."""
        c = esc[1]
        span = lambda: (pos, self.cur.i)  # noqa: E731
        if c in "AZ":
            return Anchor(span(), "start" if c == "A" else "string end")
        if c in "bB":
            self.cur.unsupported("word boundaries (\\b, \\B) are not supported", pos)
        if c in "dswDSW":
            chars = category(c.lower(), bool(flags & FLAG_A))
            if c.isupper():
                chars = chars.complement()
            if flags & FLAG_I:
                chars = _ignorecase(esc, chars, flags)
            return Chars(span(), chars.encodable())
        if c in DIGITS and c != "0":
            # octal escape (three octal digits) or a group reference
            if self.cur.peek() in DIGITS:
                d2 = self.cur.get()
                if c in OCTDIGITS and d2 in OCTDIGITS and self.cur.peek() in OCTDIGITS:
                    d3 = self.cur.get()
                    return self.literal(int(c + d2 + d3, 8), span(), flags)
            self.cur.unsupported("back-references are not regular and cannot be compiled", pos)
        return self.literal(self.escape_cp(esc), span(), flags)

    def escape_cp(self, esc: str) -> int:
        """The code point of a literal escape (also valid inside a class)."""
        c = esc[1]
        if c in SIMPLE_ESCAPES:
            return SIMPLE_ESCAPES[c]
        if c == "x":
            return int(self.cur.getwhile(2, HEXDIGITS), 16)
        if c == "u":
            return int(self.cur.getwhile(4, HEXDIGITS), 16)
        if c == "U":
            return int(self.cur.getwhile(8, HEXDIGITS), 16)
        if c == "N":
            self.cur.match("{")
            return ord(unicodedata.lookup(self.cur.getuntil("}")))
        if c in OCTDIGITS:
            return int(c + self.cur.getwhile(2, OCTDIGITS), 8)
        return ord(c)

    def char_class(self, start: int, flags: int) -> Chars:
        """The class ``[...]`` whose ``[`` is at ``start``."""
        negate = self.cur.match("^")
        items = []
        first = True
        while True:
            this = self.cur.get()
            if this == "]" and not first:
                break
            first = False
            if this[0] == "\\":
                code1 = self.class_escape(this, flags)
            else:
                code1 = ord(this)
            if self.cur.match("-"):
                that = self.cur.get()
                if that == "]":
                    items.append(code1 if isinstance(code1, CodepointSet) else CodepointSet.of(code1))
                    items.append(CodepointSet.of(ord("-")))
                    break
                code2 = self.class_escape(that, flags) if that[0] == "\\" else ord(that)
                items.append(CodepointSet([(code1, code2)]))
            else:
                items.append(code1 if isinstance(code1, CodepointSet) else CodepointSet.of(code1))
        chars = CodepointSet()
        for item in items:
            chars = chars.union(item)
        if negate:
            chars = chars.complement()
        span = (start, self.cur.i)
        if flags & FLAG_I:
            chars = _ignorecase(self.cur.s[start:self.cur.i], chars, flags)
        return Chars(span, chars.encodable())

    def class_escape(self, esc: str, flags: int):
        """An escape inside a class: a category's ``CodepointSet`` or a code point."""
        c = esc[1]
        if c in "dswDSW":
            chars = category(c.lower(), bool(flags & FLAG_A))
            return chars.complement() if c.isupper() else chars
        return self.escape_cp(esc)


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
