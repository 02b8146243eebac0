"""The text of a query as the user wrote it: a script's bytes as UTF-8, and the place in the query
of each character of a string literal."""

from __future__ import annotations

import bisect
import codecs
from typing import List, Optional, Sequence

from ..errors import EncodingError
from . import ast as A


def decode_script(data: bytes, hint: str = "save the file as UTF-8") -> str:
    """``data`` as UTF-8 text, a byte order mark dropped. Bytes that are not UTF-8 are an error at
    their line, with a caret under them in the line as far as it reads."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        body = data[len(codecs.BOM_UTF8):] if data.startswith(codecs.BOM_UTF8) else data  # e's offsets are in it
        at = len(body[:e.start].decode("utf-8"))  # the bytes before the first bad one are good
        column = e.start - (body.rfind(b"\n", 0, e.start) + 1) + 1
        bad = " ".join(f"0x{b:02X}" for b in body[e.start:e.end])
        line = body.count(b"\n", 0, e.start) + 1
        raise EncodingError(f"byte {bad} (byte {column} of line {line}) is not UTF-8: statements are read as UTF-8 "
                            f"text", (at, at + 1), body.decode("utf-8", "replace"), hint=hint) from None


def check_text(text: str) -> str:
    """``text`` (a command-line argument, or standard input decoded by Python) unless it holds bytes
    that were not UTF-8, which Python keeps as lone surrogates: then the error of
    ``decode_script`` on its bytes."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return decode_script(text.encode("utf-8", "surrogateescape"), hint="write the statement as UTF-8 text")


class LiteralOffsets(Sequence[int]):
    """Source offset of each character of a string literal's value, plus one past the end, so that
    spans inside a regex map back to the query text. Computed on lookup from the places of the
    literal's doubled quotes: a 10 MB literal costs a few bytes, not a list of ten million ints."""

    def __init__(self, raw: str, start: int):
        self._start = start + 1
        self._quotes: List[int] = []  # the value index of each doubled quote's character
        at = raw.find("''", 1, len(raw) - 1)
        while at >= 0:
            self._quotes.append(at - 1 - len(self._quotes))
            at = raw.find("''", at + 2, len(raw) - 1)
        self._len = len(raw) - 2 - len(self._quotes) + 1

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._len))]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(i)
        return self._start + i + bisect.bisect_left(self._quotes, i)

    def __eq__(self, other) -> bool:
        return isinstance(other, LiteralOffsets) and (self._start, self._quotes, self._len) == \
            (other._start, other._quotes, other._len)

    def __hash__(self) -> int:
        return hash((self._start, tuple(self._quotes), self._len))


def string_offsets(raw: str, start: int) -> LiteralOffsets:
    """Source offset of each character of a string literal's value (``raw`` begins at ``start``),
    plus one past the end, so that spans inside a regex map back to the query text."""
    return LiteralOffsets(raw, start)


def string_literal_at(text: str, span: A.Span) -> Optional[LiteralOffsets]:
    """Offsets of the characters of the string literal at ``span`` in ``text`` (None if not one)."""
    raw = text[span[0]:span[1]]
    if len(raw) >= 2 and raw[0] == "'" and raw[-1] == "'":
        return string_offsets(raw, span[0])
    return None
