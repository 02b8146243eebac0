"""The vocabulary as a byte trie in flat numpy arrays, and vectorized walks of a DFA over it."""

from __future__ import annotations

import weakref
from typing import Tuple

import numpy as np

from ..models.vocab import Vocabulary


class VocabTrie:
    """Every token's bytes in one trie, nodes numbered breadth-first.

    The children of a node are contiguous (``child_start[n] .. child_start[n] + child_count[n]``);
    ``node_byte[n]`` is the byte on the edge into node ``n``; tokens ending at node ``n`` are
    ``end_tokens[end_start[n] : end_start[n + 1]]``. Node 0 is the root.
    """

    def __init__(self, vocab: Vocabulary):
        items = [(t, i) for i, t in enumerate(vocab.tokens) if t is not None]
        prefixes = {t[:k] for t, _ in items for k in range(1, len(t) + 1)}
        order = [b""] + sorted(prefixes, key=lambda p: (len(p), p))
        node_of = {p: k for k, p in enumerate(order)}
        n = len(order)
        parent = np.zeros(n, np.int64)
        parent[1:] = [node_of[p[:-1]] for p in order[1:]]
        self.node_byte = np.zeros(n, np.uint8)
        self.node_byte[1:] = [p[-1] for p in order[1:]]
        self.depth = np.fromiter(map(len, order), np.int64, n)
        # sorted by (length, bytes): the children of a node are contiguous and parents ascend
        self.child_count = np.bincount(parent[1:], minlength=n).astype(np.int64)
        self.child_start = np.zeros(n, np.int64)
        owners, first = np.unique(parent[1:], return_index=True)
        self.child_start[owners] = first + 1
        self.parent = parent
        self.token_node = np.full(len(vocab.tokens), -1, np.int64)
        for t, i in items:
            self.token_node[i] = node_of[t]
        ends = np.flatnonzero(self.token_node >= 0)
        self.end_tokens = ends[np.argsort(self.token_node[ends], kind="stable")].astype(np.int32)
        self.end_start = np.searchsorted(self.token_node[self.end_tokens], np.arange(n + 1)).astype(np.int64)
        # one token per node is the common case (byte strings are unique in byte-level BPE)
        self.node_token = np.full(n, -1, np.int64)
        single = np.flatnonzero(np.diff(self.end_start) == 1)
        self.node_token[single] = self.end_tokens[self.end_start[single]]
        self.multi_token_nodes = bool((np.diff(self.end_start) > 1).any())
        self.level_start = np.searchsorted(self.depth, np.arange(int(self.depth.max()) + 2 if n > 1 else 2))
        # tokens below each first byte: how much of the trie a state with that byte live reaches
        below = np.zeros(n, np.int64)
        below[self.token_node[self.token_node >= 0]] += 1
        for d in range(int(self.depth.max()) if n > 1 else 0, 0, -1):
            lo, hi = self.level_start[d], self.level_start[d + 1]
            np.add.at(below, parent[lo:hi], below[lo:hi])
        self.below = below  # tokens in each node's subtree
        self.ending = np.diff(self.end_start)  # tokens ending at each node
        self.first_byte_weight = np.zeros(256, np.int64)
        roots = np.arange(1, 1 + self.child_count[0])
        self.first_byte_weight[self.node_byte[roots]] = below[roots]
        self.num_nodes = n
        self.max_depth = int(self.depth.max()) if n > 1 else 0
        self.root_children = np.arange(1, 1 + self.child_count[0], dtype=np.int64)

    def children(self, nodes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """All children of ``nodes``, and for each child the index of its parent in ``nodes``."""
        counts = self.child_count[nodes]
        total = int(counts.sum())
        if total == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        owner = np.repeat(np.arange(len(nodes)), counts)
        offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        return self.child_start[nodes][owner].astype(np.int64) + offsets, owner

    def tokens_at(self, nodes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Tokens ending at ``nodes``, and for each the index of its node in ``nodes``."""
        starts = self.end_start[nodes]
        counts = self.end_start[nodes + 1] - starts
        total = int(counts.sum())
        if total == 0:
            return np.empty(0, np.int32), np.empty(0, np.int64)
        owner = np.repeat(np.arange(len(nodes)), counts)
        offsets = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
        return self.end_tokens[starts[owner] + offsets], owner

    def walk(self, step, dead: int, starts: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Walk every token from each state in ``starts`` through an automaton.

        ``step(states, bytes)`` gives the next states (vectorized); ``dead`` is the state that
        never leads anywhere (numbers below it are dead too). Returns ``(which, tokens, targets)``:
        for each token that does not die, the index into ``starts`` it started from, its id and
        the state it ends in. Subtrees of the trie are dropped as soon as their bytes die.
        """
        starts = np.asarray(starts, np.int64)
        roots = self.root_children
        which = np.repeat(np.arange(len(starts)), len(roots))
        nodes = np.tile(roots, len(starts))
        states = step(starts[which], self.node_byte[nodes])
        out_which, out_tok, out_tgt = [], [], []
        while len(nodes):
            live = (states != dead) & (states >= 0)
            nodes, states, which = nodes[live], states[live], which[live]
            if not len(nodes):
                break
            if self.multi_token_nodes:
                toks, owner = self.tokens_at(nodes)
            else:
                toks = self.node_token[nodes]
                owner = np.flatnonzero(toks >= 0)
                toks = toks[owner].astype(np.int32)
            if len(toks):
                out_which.append(which[owner])
                out_tok.append(toks)
                out_tgt.append(states[owner])
            kids, owner = self.children(nodes)
            which = which[owner]
            states = step(states[owner], self.node_byte[kids])
            nodes = kids
        if not out_tok:
            return np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.int64)
        return (np.concatenate(out_which), np.concatenate(out_tok),
                np.concatenate(out_tgt).astype(np.int64))

    def walk_dense(self, delta: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The DFA state every token ends in from each start, ``[len(starts), vocab]`` (dead
        where it dies), walking every trie node level by level without pruning."""
        dead = delta.shape[0] - 1
        state = np.empty((len(starts), self.num_nodes), delta.dtype)
        state[:, 0] = starts
        for d in range(1, self.max_depth + 1):
            lo, hi = self.level_start[d], self.level_start[d + 1]
            state[:, lo:hi] = delta[state[:, self.parent[lo:hi]], self.node_byte[lo:hi]]
        out = np.full((len(starts), len(self.token_node)), dead, delta.dtype)
        has = self.token_node >= 0
        out[:, has] = state[:, self.token_node[has]]
        return out

    def walk_dfa(self, delta: np.ndarray, starts, dense_at: float = 0.1, chunk: int = 64):
        """Every token's transition from each DFA state in ``starts`` (``delta``'s last row is
        dead). Returns ``(bounds, tokens, targets)``: the arcs of ``starts[i]`` are
        ``tokens[bounds[i]:bounds[i+1]]`` (ascending) and their targets.

        States whose live first two bytes begin at least ``dense_at`` of the vocabulary are
        walked densely over the whole trie, the others with pruning; both vectorized over the
        states. (Two bytes, not one: a position in a literal text reads one first byte that
        most of a byte-level vocabulary begins with, " " say, and one second byte.)
        """
        starts = np.asarray(starts, np.int64)
        dead = delta.shape[0] - 1
        reach = (delta[starts, :256] != dead) @ self.first_byte_weight
        dense = reach >= dense_at * len(self.token_node)
        many = np.flatnonzero(dense)
        if len(many) and self.max_depth >= 2:
            lo, mid, hi = self.level_start[1:4]  # the nodes of the first level, then of the second
            one = delta[starts[many][:, None], self.node_byte[lo:mid]]
            two = delta[one[:, self.parent[mid:hi] - lo], self.node_byte[mid:hi]]
            # the tokens of one live byte, and those below each live node of the second level
            reach2 = (one != dead) @ self.ending[lo:mid] + (two != dead) @ self.below[mid:hi]
            dense[many] = reach2 >= dense_at * len(self.token_node)
        toks = [None] * len(starts)
        tgts = [None] * len(starts)
        idx = np.flatnonzero(dense)
        for c in range(0, len(idx), chunk):
            part = idx[c:c + chunk]
            ends = self.walk_dense(delta, starts[part])
            for row, i in enumerate(part):
                t = np.flatnonzero(ends[row] != dead)
                toks[i], tgts[i] = t.astype(np.int32), ends[row, t].astype(np.int32)
        idx = np.flatnonzero(~dense)
        if len(idx):
            which, tk, tg = self.walk(lambda s, b: delta[s, b], dead, starts[idx])
            tg = tg.astype(np.int32)
            order = np.lexsort((tk, which))
            which, tk, tg = which[order], tk[order], tg[order]
            b = np.searchsorted(which, np.arange(len(idx) + 1))
            for j, i in enumerate(idx):
                toks[i], tgts[i] = tk[b[j]:b[j + 1]], tg[b[j]:b[j + 1]]
        bounds = np.zeros(len(starts) + 1, np.int64)
        bounds[1:] = np.cumsum([len(t) for t in toks])
        if not len(starts):
            return bounds, np.empty(0, np.int32), np.empty(0, np.int32)
        return bounds, np.concatenate(toks), np.concatenate(tgts)


_TRIES: "weakref.WeakKeyDictionary[Vocabulary, VocabTrie]" = weakref.WeakKeyDictionary()


def trie_for(vocab: Vocabulary) -> VocabTrie:
    """The (cached) trie of ``vocab``."""
    trie = _TRIES.get(vocab)
    if trie is None:
        trie = _TRIES[vocab] = VocabTrie(vocab)
    return trie
