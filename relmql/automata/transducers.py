"""Transducers on byte languages: the prefix split, the longest split, exclusions, character edits
and the edit level of each string (as a TAG label at its end)."""

from __future__ import annotations

from typing import Iterable, List, Optional, Sequence

import pynini

from ..errors import CompileError
from .primitives import (EPS, NBYTES, ONE, SPLIT, TAG, apply, difference, intersect, is_final, lab, new_fst,
                         optimize, ranges_fst, sigma_star)


def _copy_arcs(f: pynini.Fst, state: int, target: int, labels: Iterable[int]):
    for x in labels:
        f.add_arc(state, pynini.Arc(x, x, ONE, target))


def insert_split_transducer() -> pynini.Fst:
    """Σ* (ε:SPLIT) Σ*: insert one SPLIT anywhere."""
    f = new_fst(2)
    f.set_final(1)
    for s in (0, 1):
        _copy_arcs(f, s, s, range(1, NBYTES + 1))
    f.add_arc(0, pynini.Arc(EPS, SPLIT, ONE, 1))
    return f


def move_split_left_transducer() -> pynini.Fst:
    """u d SPLIT v → u SPLIT d v for a non-empty d: maps a split string to every split that is
    strictly shorter on the prefix side."""
    f = new_fst(4)
    f.set_final(3)
    _copy_arcs(f, 0, 0, range(1, NBYTES + 1))
    f.add_arc(0, pynini.Arc(EPS, SPLIT, ONE, 1))
    _copy_arcs(f, 1, 2, range(1, NBYTES + 1))
    _copy_arcs(f, 2, 2, range(1, NBYTES + 1))
    f.add_arc(2, pynini.Arc(SPLIT, EPS, ONE, 3))
    _copy_arcs(f, 3, 3, range(1, NBYTES + 1))
    return f


def split_language(matching: pynini.Fst, prefix: Optional[pynini.Fst], max_states: int) -> pynini.Fst:
    """{p SPLIT c : p in PREFIX, pc in MATCHING}; without a prefix, SPLIT · MATCHING."""
    split_arc = new_fst(2)
    split_arc.set_final(1)
    split_arc.add_arc(0, pynini.Arc(SPLIT, SPLIT, ONE, 1))
    if prefix is None:
        return split_arc.concat(matching).rmepsilon()  # deterministic and minimal already
    with_split = optimize(apply(matching, insert_split_transducer()), max_states)
    shape = prefix.copy().concat(split_arc).concat(sigma_star())
    return optimize(intersect(optimize(shape, max_states), with_split), max_states)


def longest_split(lang: pynini.Fst, max_states: int) -> pynini.Fst:
    """Keep, for each string, only its split with the longest prefix."""
    shorter = optimize(apply(lang, move_split_left_transducer()), max_states)
    return optimize(difference(lang, shorter), max_states)


def exclude(lang: pynini.Fst, filt: pynini.Fst, max_states: int) -> pynini.Fst:
    """``lang`` without the strings (split ignored) of ``filt``."""
    with_split = optimize(apply(filt, insert_split_transducer()), max_states)
    return optimize(difference(lang, with_split), max_states)


def edit_transducer(k: int, alphabet: str, scope: str) -> pynini.Fst:
    """Up to ``k`` character edits (insert, delete, substitute characters of ``alphabet``) on
    UTF-8 text with one SPLIT, allowed before the SPLIT, after it, or both (``scope``).

    States are (phase, edits used) at character boundaries, plus the states needed to copy or
    rewrite a multi-byte character as one unit, so edits never cut a character in half.
    """
    chars = sorted(set(alphabet))
    encoded = [c.encode("utf-8") for c in chars]
    f = pynini.Fst()
    boundary = {}
    for phase in (0, 1):
        for e in range(k + 1):
            boundary[phase, e] = f.add_state()
            if phase == 1:
                f.set_final(boundary[phase, e])
    f.set_start(boundary[0, 0])

    def path(src: int, dst: int, ins: bytes, outs: bytes):
        n = max(len(ins), len(outs))
        state = src
        for i in range(n):
            a = lab(ins[i]) if i < len(ins) else EPS
            b = lab(outs[i]) if i < len(outs) else EPS
            nxt = dst if i == n - 1 else f.add_state()
            f.add_arc(state, pynini.Arc(a, b, ONE, nxt))
            state = nxt

    copy_char = ranges_fst(((0, 0x10FFFF),))
    for (phase, e), s in boundary.items():
        # copy one whole character: graft the UTF-8 automaton between s and s
        mapping = {copy_char.start(): s}
        for st in copy_char.states():
            if st not in mapping:
                mapping[st] = s if is_final(copy_char, st) else f.add_state()
        for st in copy_char.states():
            for arc in copy_char.arcs(st):
                f.add_arc(mapping[st], pynini.Arc(arc.ilabel, arc.olabel, ONE, mapping[arc.nextstate]))
        if phase == 0:
            f.add_arc(s, pynini.Arc(SPLIT, SPLIT, ONE, boundary[1, e]))
        editable = scope == "all" or (scope == "prefix") == (phase == 0)
        if editable and e < k:
            t = boundary[phase, e + 1]
            for a in encoded:
                path(s, t, a, b"")          # delete
                path(s, t, b"", a)          # insert
                for b in encoded:
                    if a != b:
                        path(s, t, a, b)    # substitute
    return f


def with_edits(lang: pynini.Fst, k: int, alphabet: str, scope: str, max_states: int) -> List[pynini.Fst]:
    """``[E_0, ..., E_k]``: the strings at edit distance exactly j from ``lang``.

    The strings within j edits are built within ``max_states / j`` states: a state of their
    subset construction holds states of the edit transducer at up to j edit counts, so a state
    costs more as j grows (within 6 edits of "The cat sat": 15,900 states before minimizing,
    5 s; within 7: 35,900 states, 24 s; 8 took minutes), and the bound keeps each level's time
    in proportion."""
    levels, previous = [], None
    for j in range(k + 1):
        try:
            within = lang if j == 0 else optimize(apply(lang, edit_transducer(j, alphabet, scope)), max_states // j)
        except CompileError:
            raise CompileError(f"{k} edits make too large an automaton: the strings within {j} edits of the query "
                               f"need more than {max_states // j:,} states (max_states / {j})",
                               hint="use fewer edits or a shorter pattern, or raise max_states") from None
        exact = within if previous is None else optimize(difference(within, previous), max_states)
        levels.append(exact)
        previous = within
    return levels


def tag_levels(levels: Sequence[pynini.Fst], max_states: int) -> pynini.Fst:
    """One acceptor whose strings end with the TAG label of their level."""
    parts = []
    for j, level in enumerate(levels):
        t = new_fst(2)
        t.set_final(1)
        t.add_arc(0, pynini.Arc(TAG + j, TAG + j, ONE, 1))
        parts.append(level.copy().concat(t))
    return optimize(pynini.union(*parts), max_states)
