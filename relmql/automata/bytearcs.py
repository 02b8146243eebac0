"""The byte automaton read through a vocabulary: which tokens each byte state reads and where
they lead, cached (design: docs/compiler.md, "Inside the token automaton")."""

from __future__ import annotations

import functools
from typing import List, Tuple

import numpy as np

from ..memory import Lru
from .bytedfa import ByteDFA
from .trie import VocabTrie


class ByteArcs:
    """The tokens whose bytes walk the byte DFA from each of its states, and the states they
    reach, found by walking the vocabulary's trie and kept in a least-recently-used cache
    bounded in bytes (``cache``); an all-tokenization region's arcs are these."""

    def __init__(self, dfa: ByteDFA, trie: VocabTrie, vocab_size: int, budget: int):
        self.dfa = dfa
        self.delta = dfa.delta
        self.dead = dfa.dead
        self.trie = trie
        self.vocab_size = vocab_size  # tokens in the vocabulary
        self.cache = Lru(budget)  # q, ("dense", q) or ("coded", q) -> arrays

    def arcs(self, q: int) -> Tuple[np.ndarray, np.ndarray]:
        """The tokens byte state ``q`` reads (sorted) and the byte states they reach."""
        got = self.cache.get(q)
        if got is None:
            _, toks, tgts = self.trie.walk_dfa(self.delta, [q])
            got = (toks, tgts)
            self.cache.put(q, got, got[0].nbytes + got[1].nbytes)
        return got

    def fill(self) -> None:
        """Every byte state's arcs at once, in one vectorized walk (the cache grown to hold them)."""
        bounds, toks, tgts = self.trie.walk_dfa(self.delta, np.arange(self.dfa.num_states))
        self.cache.budget = max(self.cache.budget, toks.nbytes + tgts.nbytes + 1)
        for q in range(self.dfa.num_states):
            got = (toks[bounds[q]:bounds[q + 1]], tgts[bounds[q]:bounds[q + 1]])
            self.cache.put(q, got, got[0].nbytes + got[1].nbytes)

    def targets(self, q: int) -> np.ndarray:
        """``arcs(q)`` over the whole vocabulary: each token's target (-1 where none)."""
        key = ("dense", q)
        got = self.cache.get(key)
        if got is None:
            toks, tq = self.arcs(q)
            got = np.full(self.vocab_size, -1, np.int32)
            got[toks] = tq
            self.cache.put(key, got, got.nbytes)
        return got

    def coded(self, q: int):
        """``arcs(q)`` with each target's code among the distinct targets, and those."""
        key = ("coded", q)
        got = self.cache.get(key)
        if got is None:
            toks, tq = self.arcs(q)
            qvals, qcode = unique_small(tq)
            got = (toks, tq, qcode.reshape(-1).astype(np.int32), qvals)
            self.cache.put(key, got, sum(a.nbytes for a in got))
        return got

    @functools.cached_property
    def reads_on(self) -> np.ndarray:
        """Whether each byte state reads another byte."""
        return (self.delta[:, :256] != self.dead).any(axis=1)

    def few(self, q: int, most: int = 4096) -> bool:
        """Whether at most ``most`` tokens can leave byte state ``q``: at once where few tokens
        begin with the bytes it reads, else counted (the tokens it reads, which its expansion
        needs anyway: "e latte" reads few of the thousands of tokens that begin with "e")."""
        live = self.delta[q, :256] != self.dead
        return int(self.trie.first_byte_weight[live].sum()) <= most or len(self.arcs(q)[0]) <= most


def unique_small(values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for small integers from -1 (automaton and
    tracker states over the vocabulary) by counting rather than sorting: a tenth of the time
    for 49,152 tokens, where a wide canonical search asks for it thousands of times."""
    shifted = values.astype(np.int64) + 1
    if not len(values) or shifted.min() < 0 or shifted.max() > 4 * len(values):
        return np.unique(values, return_inverse=True)
    present = np.bincount(shifted) > 0
    return (np.flatnonzero(present) - 1).astype(values.dtype), (np.cumsum(present) - 1)[shifted]


def lookup(sorted_values: np.ndarray, wanted: List[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """Where each value of the arrays ``wanted`` (concatenated) would sit in ``sorted_values``,
    and whether it is there."""
    flat = np.concatenate(wanted) if len(wanted) > 1 else wanted[0]
    pos = np.searchsorted(sorted_values, flat)
    hit = pos < len(sorted_values)
    hit[hit] = sorted_values[pos[hit]] == flat[hit]
    return pos, hit
