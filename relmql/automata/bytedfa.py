"""The final deterministic byte automaton, ``ByteDFA``, as numpy tables: conversion from an
optimized acceptor, trimming, and counting its strings."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Tuple

import numpy as np
import pynini

from ..records import checkpoint
from .primitives import NBYTES, SPLIT, TAG, fst_arrays

SPLIT_COL = 256  # column of SPLIT in ByteDFA.delta


@dataclass
class ByteDFA:
    """A trimmed deterministic automaton over bytes and SPLIT.

    ``delta[s, b]`` is the next state on byte ``b`` (column ``SPLIT_COL`` for SPLIT); the last
    row is the dead state, and missing transitions go there. ``final[s]`` is -1 for non-final
    states, else the edit count of the strings that end there. State 0 is the start.
    """

    delta: np.ndarray
    final: np.ndarray

    @property
    def num_states(self) -> int:
        """States, the dead one aside."""
        return self.delta.shape[0] - 1

    @property
    def dead(self) -> int:
        """The dead state."""
        return self.num_states  # the last row

    @property
    def num_arcs(self) -> int:
        """Transitions that do not lead to the dead state."""
        return int((self.delta[:-1] != self.dead).sum())

    def is_empty(self) -> bool:
        """Whether the language has no string."""
        return self.num_states == 0 or not (self.final[:-1] >= 0).any()

    def walk(self, data: bytes, state: int = 0) -> int:
        """The state reached from ``state`` on ``data``."""
        for b in data:
            state = int(self.delta[state, b])
        return state

    def accepts(self, text: str, prefix_len: Optional[int] = None) -> bool:
        """Whether ``text`` (split after ``prefix_len`` characters, or anywhere) is in the language."""
        data = text.encode("utf-8")
        if prefix_len is not None:
            head = text[:prefix_len].encode("utf-8")
            s = self.walk(head)
            s = int(self.delta[s, SPLIT_COL])
            return self.final[self.walk(data[len(head):], s)] >= 0
        for cut in range(len(text) + 1):
            head = text[:cut].encode("utf-8")
            s = int(self.delta[self.walk(head), SPLIT_COL])
            if s != self.dead and self.final[self.walk(data[len(head):], s)] >= 0:
                return True
        return False


def to_dfa(fst: pynini.Fst) -> ByteDFA:
    """Convert an optimized acceptor (labels: bytes, SPLIT, TAG+j) into a ``ByteDFA``."""
    checkpoint()
    n = fst.num_states()
    if n == 0 or fst.start() < 0:
        return ByteDFA(np.zeros((1, NBYTES + 1), np.int32), np.full(1, -1, np.int16))
    start, final_weight, src, ilab, _, dst = fst_arrays(fst)
    # renumber so that the start is state 0
    new_id = np.arange(n)
    new_id[[0, start]] = [start, 0]
    dead = n
    delta = np.full((n + 1, NBYTES + 1), dead, dtype=np.int32)
    final = np.full(n + 1, -1, dtype=np.int16)
    byte_arcs = (ilab >= 1) & (ilab <= SPLIT)
    delta[new_id[src[byte_arcs]], ilab[byte_arcs] - 1] = new_id[dst[byte_arcs]]
    tagged = ilab >= TAG
    if tagged.any():
        # a tagged acceptor: state s is final with tag j when it has an arc TAG+j
        final[new_id[src[tagged]]] = (ilab[tagged] - TAG).astype(np.int16)
    else:
        final[new_id[np.flatnonzero(final_weight != np.inf)]] = 0
    return trim(ByteDFA(delta, final))


def prepend_split(dfa: ByteDFA) -> ByteDFA:
    """SPLIT followed by the language of a ByteDFA without splits (an empty prefix)."""
    n = dfa.num_states
    delta = np.full((n + 2, NBYTES + 1), n + 1, np.int32)
    delta[1:n + 1] = np.where(dfa.delta[:n] == dfa.dead, n + 1, dfa.delta[:n] + 1)
    delta[0, SPLIT_COL] = 1
    final = np.concatenate([[np.int16(-1)], dfa.final[:n], [np.int16(-1)]])
    return ByteDFA(delta, final)


def trim(dfa: ByteDFA) -> ByteDFA:
    """Drop the states that cannot reach a final state."""
    n = dfa.num_states
    # depth-first from the final states along reversed arcs
    src, tgt, _ = _edges(dfa)
    checkpoint()  # a large automaton's arcs take seconds
    order = np.argsort(tgt, kind="stable")
    rsrc = src[order].tolist()
    bounds = np.searchsorted(tgt[order], np.arange(n + 1)).tolist()
    live = (dfa.final[:n] >= 0).tolist()
    stack = [s for s in range(n) if live[s]]
    while stack:
        t = stack.pop()
        for k in range(bounds[t], bounds[t + 1]):
            s = rsrc[k]
            if not live[s]:
                live[s] = True
                stack.append(s)
    live = np.array(live, bool)
    if live.all():
        return dfa
    keep = np.flatnonzero(live)
    if len(keep) == 0 or not live[0]:
        return ByteDFA(np.zeros((1, NBYTES + 1), np.int32), np.full(1, -1, np.int16))
    remap = np.full(n + 1, len(keep), np.int32)
    remap[keep] = np.arange(len(keep), dtype=np.int32)
    delta = np.vstack([remap[dfa.delta[keep]], np.full((1, NBYTES + 1), len(keep), np.int32)])
    final = np.append(dfa.final[keep], np.int16(-1))
    return ByteDFA(delta, final)


# ---------------------------------------------------------------- counting


def format_count(n: Optional[int]) -> str:
    """``n`` with thousands separators, as a power of ten when it is huge, or "infinite"."""
    if n is None:
        return "infinite"
    if n < 10 ** 15:
        return f"{n:,}"
    exp = int(n.bit_length() * math.log10(2))  # decimal digits without str(), which refuses huge ints
    while n >= 10 ** (exp + 1):
        exp += 1
    while n < 10 ** exp:
        exp -= 1
    lead = n // 10 ** (exp - 2)
    return f"about {lead // 100}.{lead % 100:02d}e{exp}"


def _edges(dfa: ByteDFA):
    """Distinct (source, target, number of labels) of a ByteDFA's arcs."""
    n = dfa.num_states
    d = dfa.delta[:n].astype(np.int64)
    src = np.repeat(np.arange(n), d.shape[1])
    tgt = d.ravel()
    keep = tgt != dfa.dead
    keys, mult = np.unique(src[keep] * (n + 1) + tgt[keep], return_counts=True)
    return keys // (n + 1), keys % (n + 1), mult


def count_strings(dfa: ByteDFA) -> Optional[int]:
    """The number of strings (split strings) in the language, or None when it is infinite."""
    n = dfa.num_states
    if n == 0:
        return 0
    src, tgt, mult = _edges(dfa)
    order = _topological(n, src, tgt)
    if order is None:
        return None
    counts = [0] * n
    bounds = np.searchsorted(src, np.arange(n + 1))
    tl, ml = tgt.tolist(), mult.tolist()
    final = (dfa.final[:n] >= 0).tolist()
    for s in reversed(order):
        total = int(final[s])
        for k in range(bounds[s], bounds[s + 1]):
            total += ml[k] * counts[tl[k]]
        counts[s] = total
    return counts[0]


def _topological(n: int, src: np.ndarray, tgt: np.ndarray) -> Optional[List[int]]:
    indeg = np.bincount(tgt, minlength=n).tolist()
    bounds = np.searchsorted(src, np.arange(n + 1)).tolist()
    tl = tgt.tolist()
    stack = [s for s in range(n) if indeg[s] == 0]
    order = []
    while stack:
        s = stack.pop()
        order.append(s)
        for k in range(bounds[s], bounds[s + 1]):
            t = tl[k]
            indeg[t] -= 1
            if indeg[t] == 0:
                stack.append(t)
    return order if len(order) == n else None


# ---------------------------------------------------------------- restricting regions


def restrict(dfa: ByteDFA, allowed: ByteDFA, regions: Tuple[bool, bool]) -> ByteDFA:
    """The strings of ``dfa`` whose prefix text (before SPLIT; ``regions[0]``) and completion
    text (after it; ``regions[1]``) are each in ``allowed``'s language where the flag is set."""
    na = allowed.num_states
    free = na + 1  # the allowed-state of a region that is not restricted
    start_a = (0 if regions[0] else free, 0 if regions[1] else free)
    ids = {}
    pairs = []

    def state(key) -> int:
        if key not in ids:
            ids[key] = len(pairs)
            pairs.append(key)
        return ids[key]
    state((0, start_a[0]))
    rows, finals = [], []
    a_delta = np.vstack([allowed.delta[:, :NBYTES], np.full((1, NBYTES), free, np.int32)])  # row na+1: free
    a_final = np.append(allowed.final >= 0, True)
    k = 0
    while k < len(pairs):
        q, a = pairs[k]
        k += 1
        row = np.full(NBYTES + 1, -1, np.int64)
        q2 = dfa.delta[q, :NBYTES]
        a2 = a_delta[a]
        live = np.flatnonzero((q2 != dfa.dead) & (a2 != allowed.dead))
        for b in live.tolist():
            row[b] = state((int(q2[b]), int(a2[b])))
        qs = int(dfa.delta[q, SPLIT_COL])
        if qs != dfa.dead and a_final[a]:
            row[SPLIT_COL] = state((qs, start_a[1]))
        rows.append(row)
        finals.append(dfa.final[q] if a_final[a] else -1)
    n = len(pairs)
    delta = np.vstack(rows + [np.full(NBYTES + 1, n, np.int64)])
    delta[delta < 0] = n
    return trim(ByteDFA(delta.astype(np.int32), np.append(np.array(finals, np.int16), np.int16(-1))))
