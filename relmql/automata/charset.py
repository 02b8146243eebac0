"""Sets of Unicode code points as sorted ranges, Python ``re``'s character categories, and the
split of a code-point range into UTF-8 byte-range sequences."""

from __future__ import annotations

import functools
import sys
from collections import defaultdict
from typing import Dict, FrozenSet, Iterable, Iterator, List, Tuple

MAX_CP = sys.maxunicode  # 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

Range = Tuple[int, int]


class CodepointSet:
    """An immutable set of code points stored as sorted, disjoint, non-adjacent inclusive ranges."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: Iterable[Range] = ()):
        self.ranges: Tuple[Range, ...] = _normalize(ranges)

    @classmethod
    def of(cls, *cps: int) -> "CodepointSet":
        return cls((c, c) for c in cps)

    @classmethod
    def from_predicate(cls, pred, limit: int = MAX_CP) -> "CodepointSet":
        """All code points ``c <= limit`` with ``pred(chr(c))`` true (a full scan; cache the result)."""
        out, start = [], None
        for c in range(limit + 1):
            if pred(chr(c)):
                if start is None:
                    start = c
            elif start is not None:
                out.append((start, c - 1))
                start = None
        if start is not None:
            out.append((start, limit))
        return cls(out)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __eq__(self, other) -> bool:
        return isinstance(other, CodepointSet) and self.ranges == other.ranges

    def __hash__(self) -> int:
        return hash(self.ranges)

    def __repr__(self) -> str:
        shown = ", ".join(f"{lo:#x}" if lo == hi else f"{lo:#x}-{hi:#x}" for lo, hi in self.ranges[:6])
        more = ", ..." if len(self.ranges) > 6 else ""
        return f"CodepointSet({shown}{more})"

    def __contains__(self, cp: int) -> bool:
        lo, hi = 0, len(self.ranges)
        while lo < hi:
            mid = (lo + hi) // 2
            a, b = self.ranges[mid]
            if cp < a:
                hi = mid
            elif cp > b:
                lo = mid + 1
            else:
                return True
        return False

    def size(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.ranges)

    def union(self, other: "CodepointSet") -> "CodepointSet":
        return CodepointSet(self.ranges + other.ranges)

    def complement(self) -> "CodepointSet":
        out, nxt = [], 0
        for lo, hi in self.ranges:
            if lo > nxt:
                out.append((nxt, lo - 1))
            nxt = hi + 1
        if nxt <= MAX_CP:
            out.append((nxt, MAX_CP))
        return CodepointSet(out)

    def intersection(self, other: "CodepointSet") -> "CodepointSet":
        return self.complement().union(other.complement()).complement()

    def difference(self, other: "CodepointSet") -> "CodepointSet":
        return self.intersection(other.complement())

    def encodable(self) -> "CodepointSet":
        """Without the surrogates, which have no UTF-8 encoding."""
        if not any(lo <= SURROGATES[1] and hi >= SURROGATES[0] for lo, hi in self.ranges):
            return self
        return self.difference(CodepointSet([SURROGATES]))

    def codepoints(self) -> Iterator[int]:
        for lo, hi in self.ranges:
            yield from range(lo, hi + 1)


def _normalize(ranges: Iterable[Range]) -> Tuple[Range, ...]:
    out: List[List[int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


ALL = CodepointSet([(0, MAX_CP)])
NEWLINE = CodepointSet.of(0x0A)


# Python's re categories (see Modules/_sre/sre.c): for str patterns without re.ASCII
# \d is str.isdecimal, \s is str.isspace, \w is str.isalnum or "_".
@functools.lru_cache(maxsize=None)
def category(name: str, ascii_only: bool) -> CodepointSet:
    """The code points of ``\\d``, ``\\s`` or ``\\w`` under Python's rules."""
    if ascii_only:
        return {
            "d": CodepointSet([(0x30, 0x39)]),
            "s": CodepointSet.of(*map(ord, " \t\n\r\f\v")),
            "w": CodepointSet([(0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A), (0x5F, 0x5F)]),
        }[name]
    pred = {"d": str.isdecimal, "s": str.isspace, "w": lambda c: c.isalnum() or c == "_"}[name]
    return CodepointSet.from_predicate(pred)


def _encode(cp: int) -> bytes:
    return chr(cp).encode("utf-8")


def utf8_sequences(lo: int, hi: int) -> Iterator[List[Range]]:
    """Split the code points ``lo..hi`` into sequences of byte ranges whose products are exactly
    the UTF-8 encodings of those code points (surrogates skipped)."""
    stack = [(lo, hi)]
    while stack:
        lo, hi = stack.pop()
        if lo > hi:
            continue
        if lo <= SURROGATES[1] and hi >= SURROGATES[0]:
            stack.append((SURROGATES[1] + 1, hi))
            stack.append((lo, SURROGATES[0] - 1))
            continue
        split = False
        for edge in (0x7F, 0x7FF, 0xFFFF):
            if lo <= edge < hi:
                stack.append((edge + 1, hi))
                stack.append((lo, edge))
                split = True
                break
        if split:
            continue
        if hi <= 0x7F:
            yield [(lo, hi)]
            continue
        for i in (1, 2, 3):
            m = (1 << (6 * i)) - 1
            if (lo & ~m) != (hi & ~m):
                if lo & m:
                    stack.append(((lo | m) + 1, hi))
                    stack.append((lo, lo | m))
                    split = True
                    break
                if (hi & m) != m:
                    stack.append((hi & ~m, hi))
                    stack.append((lo, (hi & ~m) - 1))
                    split = True
                    break
        if split:
            continue
        yield list(zip(_encode(lo), _encode(hi)))


def partition(classes: List[CodepointSet]) -> Tuple[List[CodepointSet], List[FrozenSet[int]]]:
    """The coarsest split of the code points of ``classes`` into disjoint atoms, and the atoms
    of each class."""
    events = defaultdict(list)
    for k, chars in enumerate(classes):
        for lo, hi in chars.ranges:
            events[lo].append(k)
            events[hi + 1].append(~k)
    active: set = set()
    pieces: Dict[FrozenSet[int], list] = {}
    points = sorted(events)
    for p, q in zip(points, points[1:] + [None]):
        for k in events[p]:
            if k >= 0:
                active.add(k)
            else:
                active.discard(~k)
        if active and q is not None:
            pieces.setdefault(frozenset(active), []).append((p, q - 1))
    atoms = [CodepointSet(r) for r in pieces.values()]
    members: List[set] = [set() for _ in classes]
    for a, key in enumerate(pieces):
        for k in key:
            members[k].add(a)
    return atoms, [frozenset(m) for m in members]
