"""Regexes as Python's ``re`` reads them, for every stage that reads one: compiled once, without
re's FutureWarning about sets, and with POSIX bracket expressions refused (re would read
``[[:alpha:]]`` as the characters ``[:alph`` and then ``]``)."""

from __future__ import annotations

import functools
import re
import warnings
from typing import Optional, Tuple

_SPECIAL = set(".^$*+?{}[]\\|()")


def escape(s: str) -> str:
    """``s`` as a regex matching exactly ``s`` (only the characters regexes treat specially are
    escaped, so the pattern stays readable)."""
    return "".join("\\" + c if c in _SPECIAL else c for c in s)


_POSIX = re.compile(r"\[([:=.])(\^?[A-Za-z]*)\1\]")
_INSTEAD = {"alpha": "[a-zA-Z]", "digit": r"[0-9] or \d", "alnum": "[a-zA-Z0-9]", "space": r"\s",
            "upper": "[A-Z]", "lower": "[a-z]", "xdigit": "[0-9a-fA-F]", "word": r"\w", "blank": r"[ \t]",
            "punct": r"""[!-/:-@\[-`{-~]""", "cntrl": r"[\x00-\x1f\x7f]", "print": r"[ -~]", "graph": r"[!-~]"}


def posix_class(pattern: str) -> Optional[Tuple[int, int, str]]:
    """The first POSIX bracket expression (``[:alpha:]``, ``[=a=]``, ``[.a.]``) inside a character
    class of ``pattern``, or a known class's name alone in brackets (``[:digit:]``): its span
    and what to write instead; None where there is none."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c != "[":
            i += 1
            continue
        m = _POSIX.match(pattern, i)
        if m and m.group(2) in _INSTEAD:  # [:alpha:] alone: grep refuses it too (it means [[:alpha:]])
            return m.start(), m.end(), _INSTEAD[m.group(2)]
        j = i + 1
        if j < n and pattern[j] == "^":
            j += 1
        if j < n and pattern[j] == "]":  # a ] first is one of the class's characters
            j += 1
        while j < n and pattern[j] != "]":
            if pattern[j] == "\\":
                j += 2
                continue
            m = _POSIX.match(pattern, j)
            if m:
                name = m.group(2)
                instead = _INSTEAD.get(name, "its characters in a class, as [a-z0-9]")
                return m.start(), m.end(), instead
            j += 1
        i = j + 1
    return None


@functools.lru_cache(maxsize=1024)
def compiled(pattern: str) -> re.Pattern:
    """``pattern`` compiled by ``re`` (``re.error``, ``OverflowError`` or ``RecursionError`` where
    it cannot be; ``re.error`` at its place for a POSIX bracket expression)."""
    posix = posix_class(pattern)
    if posix is not None:
        start, end, instead = posix
        chars = "".join(dict.fromkeys(pattern[start + 1:end - 1]))
        raise re.error(f"{pattern[start:end]} is a POSIX class, which Python's regex syntax does not have (it "
                       f"would match the characters {chars!r}); write {instead}", pattern, start)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return re.compile(pattern)


__all__ = ["compiled", "posix_class"]
