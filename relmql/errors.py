"""User-facing errors: one message, an optional source span, rendered with a caret."""

from __future__ import annotations

import difflib
import unicodedata
from typing import Iterable, Optional, Tuple

Span = Tuple[int, int]


class Error(Exception):
    """Base class of every error a user can cause.

    ``span`` is a half-open (start, end) range of character offsets into ``source`` (the
    text the user wrote: a regex, a query, a file). ``render()`` gives the message, the
    source line and a caret under the offending text.
    """

    kind = "error"
    role: Optional[str] = None  # which part of a query the source is, e.g. "PREFIX"

    def __init__(self, message: str, span: Optional[Span] = None, source: Optional[str] = None,
                 hint: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.source = source
        self.hint = hint

    def __str__(self) -> str:
        if self.span is not None and self.source is not None:
            return f"{self.message} (at position {self.span[0]})"
        return self.message

    def shifted(self, offset: int, source: str) -> "Error":
        """The same error with its span moved by ``offset`` into a larger ``source``."""
        span = None if self.span is None else (self.span[0] + offset, self.span[1] + offset)
        err = type(self)(self.message, span, source, self.hint)
        err.role = self.role
        err.__cause__ = self.__cause__
        return err

    def render(self, origin: Optional[str] = None) -> str:
        """The message, the offending source line and a caret span under it; with ``origin`` (a
        file name) the first line starts with ``origin:line:``."""
        lines = [f"{self.kind}: {self.message}"]
        if origin and self.span is not None and self.source is not None:
            lines[0] = f"{origin}:{self.source.count(chr(10), 0, self.span[0]) + 1}: {lines[0]}"
        if self.span is not None and self.source is not None:
            lines.extend(caret_lines(self.source, self.span))
        if self.hint:
            lines.append(f"hint: {self.hint}")
        # a lone surrogate (from Python text) as its escape: no stream could write it
        return "\n".join(lines).encode("utf-8", "backslashreplace").decode("utf-8")


class RegexError(Error):
    """A pattern that is not valid Python ``re`` syntax, or uses a construct that is not regular."""

    kind = "regex error"


class CompileError(Error):
    """A valid pattern that cannot be compiled: empty language, too large, unproducible."""

    kind = "compile error"


class ModelError(Error):
    """An unknown model, a model that cannot be loaded, or a tokenizer relmql cannot read."""

    kind = "model error"


class ParseError(Error):
    """Text that is not a relmql statement."""

    kind = "syntax error"


class EncodingError(Error):
    """A script whose bytes are not UTF-8 text."""


class PlanError(Error):
    """A statement that parses but cannot be planned: unknown names, bad values, missing clauses."""

    kind = "error"


class ExecutionError(Error):
    """A query that cannot run as asked (bad option values, a budget exceeded)."""

    kind = "execution error"


class Cancelled(Error):
    """The query was stopped before it finished."""

    kind = "cancelled"


def caret_lines(source: str, span: Span, width: int = 100) -> list:
    """Two lines: the source line that holds ``span[0]`` and ``^^^`` under the span.

    Long lines are cut around the span; control characters are shown as spaces so the caret
    stays aligned.
    """
    start, end = span
    start = max(0, min(start, len(source)))
    end = max(start + 1, min(end, len(source) + 1))
    line_start = source.rfind("\n", 0, start) + 1
    line_end = source.find("\n", start)
    if line_end < 0:
        line_end = len(source)
    line_no = source.count("\n", 0, start) + 1
    text = source[line_start:line_end]
    col = start - line_start
    col_end = min(end - line_start, max(len(text), col + 1))
    # cut long lines around the caret
    left = 0
    if len(text) > width:
        left = max(0, min(col - width // 3, len(text) - width))
        text = ("..." if left else "") + text[left:left + width] + ("..." if left + width < len(text) else "")
        shift = 3 if left else 0
        col, col_end = col - left + shift, col_end - left + shift
    shown = "".join(c if c.isprintable() else " " for c in text)
    prefix = f"LINE {line_no}: " if "\n" in source else "  "
    return [prefix + shown, " " * (len(prefix) + display_width(shown[:col])) +
            "^" * max(1, display_width(shown[col:col_end]))]


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes: East Asian wide characters (CJK, most emoji) take two,
    combining marks none, so a caret lands under the character it points at."""
    return sum(0 if unicodedata.combining(c) or unicodedata.category(c) == "Cf" else
               2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def closest(name: str, candidates: Iterable[str], cutoff: float = 0.6) -> Optional[str]:
    """The candidate closest to ``name``, or None when nothing is close (``difflib``'s ratio below
    ``cutoff``)."""
    candidates = list(candidates)
    found = difflib.get_close_matches(name.lower(), [c.lower() for c in candidates], n=1, cutoff=cutoff)
    if not found:
        return None
    for c in candidates:
        if c.lower() == found[0]:
            return c
    return None
