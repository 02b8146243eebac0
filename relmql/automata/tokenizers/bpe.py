"""Which adjacent token pairs byte-pair encoding can produce, from the merge list alone (the
"bigram" property of BPE within one pre-token chunk). Design: docs/tokenizers.md."""

from __future__ import annotations

import functools
import hashlib
import heapq
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...cache import cached_arrays
from ...errors import ModelError
from ...models.vocab import Vocabulary
from ..charset import CodepointSet
from .families import FAMILIES

INF = np.iinfo(np.int64).max
Chain = Tuple[Tuple[int, int, int], ...]  # ((token, born, absorbed), ...)
_SOURCE = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]  # cached tables go with the code


class HashIndex:
    """Non-negative int64 keys to int64 values in an open-addressing table (linear probing, at
    most half full), looked up for many keys at once in a few vectorized rounds: about one random
    read per key where a binary search over the sorted keys makes log2(n)."""

    MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the top bits of key * 2^64 / phi

    def __init__(self, keys: np.ndarray, values: np.ndarray):
        bits = max(4, (2 * len(keys)).bit_length())
        self.shift, self.mask = np.uint64(64 - bits), (1 << bits) - 1
        self.keys = np.full(1 << bits, -1, np.int64)
        self.values = np.zeros(1 << bits, np.int64)
        keys = np.asarray(keys, np.int64)
        owner = np.full(1 << bits, -1, np.int64)
        slot, todo, self.rounds = self._slot(keys), np.arange(len(keys)), 0
        while len(todo):  # each round, every key waiting takes its slot if free (one of those wanting it)
            s = slot[todo]
            free = self.keys[s] == -1
            owner[s[free]] = todo[free]
            won = free & (owner[s] == todo)
            self.keys[s[won]], self.values[s[won]] = keys[todo[won]], values[todo[won]]
            if (self.keys[s] == keys[todo])[~won].any():  # a copy of a key takes the same slots
                raise ValueError("HashIndex keys must be distinct")
            todo = todo[~won]
            slot[todo] = (slot[todo] + 1) & self.mask
            self.rounds += 1

    def _slot(self, keys: np.ndarray) -> np.ndarray:
        return ((keys.astype(np.uint64) * self.MIX) >> self.shift).astype(np.int64)

    def get(self, keys: np.ndarray, missing: int = -1) -> np.ndarray:
        """The value of each key (``missing`` where it is not in the table)."""
        keys = np.asarray(keys, np.int64)
        out = np.full(len(keys), missing, np.int64)
        slot, todo = self._slot(keys), np.arange(len(keys))
        for _ in range(self.rounds):  # no key sits further than ``rounds`` slots from its own
            at = self.keys[slot]
            hit = at == keys
            out[todo[hit]] = self.values[slot[hit]]
            on = np.flatnonzero(~hit & (at != -1))
            if not len(on):
                break
            todo, slot, keys = todo[on], (slot[on] + 1) & self.mask, keys[on]
        return out


class PairTable:
    """Merge structure of a BPE vocabulary: per token, whether BPE produces it for its own bytes,
    its left and right edge chains, and (lazily) the set of tokens that cannot follow it."""

    def __init__(self, vocab: Vocabulary):
        spec = vocab.spec
        model = spec.get("model", {})
        if model.get("type") != "BPE" or vocab.kind not in FAMILIES:
            raise ModelError("canonical tokenization needs a BPE tokenizer (byte-level or SentencePiece-style)")
        if model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
            raise ModelError("canonical tokenization does not support BPE dropout or subword affixes")
        if model.get("ignore_merges"):
            raise ModelError("canonical tokenization does not support BPE with ignore_merges")
        piece_id: Dict[str, int] = dict(model["vocab"])
        n = len(vocab.tokens)
        self._piece_id, self._merge_list = piece_id, model["merges"]
        # what BPE starts from: bytes (byte-level) or characters with byte fallback (SentencePiece)
        self.symbols = FAMILIES[vocab.kind].bpe_symbols(piece_id, model)
        edges = self._edges(vocab)
        # a character the vocabulary lacks is a chunk of its own (``CharSymbols._fallback_splits``)
        self.fallback_splits = bool(edges.get("fallback_splits", False))
        # the merges by left token, then rank (left, rank, right), for ``forbidden_after``
        self._by_left = (edges["merge_left"], edges["merge_rank"], edges["merge_right"])
        self.self_canonical = edges["own"]
        # right-edge classes: tokens with the same right chain cannot be told apart by a pair test
        self.right_class = edges["right_class"]
        self.classes = len(edges["class_lens"]) + 1  # class 0: no chain
        # every token's left chain, flattened (offsets, lengths, token, born, absorbed)
        lens = edges["left_lens"]
        self._left = (np.concatenate([[0], np.cumsum(lens)]), lens, *edges["left"].T)
        # for ``forbidden_pairs``: the merges as sorted keys ``left * vocab + right`` with their
        # ranks, and the left chains; every right-edge class's chain flattened likewise (class 0
        # has none)
        self._flat = (edges["pair_keys"], edges["pair_ranks"], *self._left)
        class_lens = np.concatenate([[0], edges["class_lens"]])
        self._flat_classes = (np.concatenate([[0], np.cumsum(class_lens)]), class_lens, *edges["classes"].T)
        # for each token y: the tokens whose left chain holds y, with the rank absorbing y there,
        # by y, then by absorbing rank, descending (``_left_holding``)
        _, _, y, born, absorbed = self._left
        owner = np.repeat(np.arange(n), lens)
        order = np.lexsort((-owner, -born, -absorbed, y))
        self._holding = (y[order], absorbed[order], born[order], owner[order])

    @functools.cached_property
    def merges(self) -> Dict[Tuple[int, int], Tuple[int, int]]:
        """``(left, right) -> (rank, merged token)`` from the tokenizer's merge list (read where the
        cached tables are built)."""
        piece_id, merges = self._piece_id, {}
        for rank, m in enumerate(self._merge_list):
            a, b = m.split(" ", 1) if isinstance(m, str) else m
            ia, ib, iab = piece_id.get(a), piece_id.get(b), piece_id.get(a + b)
            if ia is not None and ib is not None and iab is not None:
                merges[ia, ib] = (rank, iab)  # a repeated merge keeps its last rank, as tokenizers does
        return merges

    def _edges(self, vocab: Vocabulary) -> Dict[str, np.ndarray]:
        """BPE of every token, kept in the user's cache across runs (about a second in Python for
        a 50,000-token vocabulary): ``own``, whether BPE produces the token for its own bytes; for
        those, ``left_lens`` and ``left``, their left edge chains flattened (token, born,
        absorbed); ``right_class``, their right edge chain's class (from 1, in order of first
        token), and each class's chain flattened (``class_lens``, ``classes``); the merges
        as arrays (``merge_*`` by left token and rank, ``pair_*`` by key); for SentencePiece,
        ``fallback_splits``."""
        n = len(vocab.tokens)

        def build() -> Dict[str, np.ndarray]:
            own = np.zeros(n, bool)
            left_lens, right_class = np.zeros(n, np.int64), np.zeros(n, np.int64)
            left: list = []
            classes: Dict[Chain, int] = {}
            for t, data in enumerate(vocab.tokens):
                if data is None:
                    continue
                ids, lchain, rchain = self.encode_chunk(data)
                if ids == [t]:
                    own[t] = True
                    left_lens[t] = len(lchain)
                    left.extend(lchain)
                    right_class[t] = classes.setdefault(rchain, len(classes) + 1)
            m = np.array([(a, b, rank) for (a, b), (rank, _) in self.merges.items()], np.int64).reshape(-1, 3)
            by_left = np.lexsort((m[:, 1], m[:, 2], m[:, 0]))
            keys = m[:, 0] * n + m[:, 1]
            by_key = np.argsort(keys, kind="stable")
            out = {"own": own, "left_lens": left_lens, "left": np.array(left, np.int64).reshape(-1, 3),
                   "right_class": right_class, "class_lens": np.array([len(c) for c in classes], np.int64),
                   "classes": np.array([e for c in classes for e in c], np.int64).reshape(-1, 3),
                   "merge_left": m[by_left, 0], "merge_rank": m[by_left, 2], "merge_right": m[by_left, 1],
                   "pair_keys": keys[by_key], "pair_ranks": m[by_key, 2]}
            out.update(self.symbols.edge_extras(self.merges, self._piece_id))
            return out

        return cached_arrays(f"bpe-edges-{_SOURCE}-{vocab.fingerprint}", build,
                             versions=f"bpe-edges-*-{vocab.fingerprint}.npz")

    @functools.cached_property
    def class_chain(self) -> List[Chain]:
        """Each right-edge class's chain ((token, born, absorbed), ...); class 0 has none."""
        offsets, lens, *columns = self._flat_classes
        entries = list(zip(*(c.tolist() for c in columns)))
        return [tuple(entries[o:o + k]) for o, k in zip(offsets.tolist(), lens.tolist())]

    def _left_holding(self, y: int) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The tokens whose left chain holds ``y``: (absorbing rank, born, token), by absorbing
        rank descending (None when there are none)."""
        ys, absorbed, born, owner = self._holding
        a, b = np.searchsorted(ys, y), np.searchsorted(ys, y, side="right")
        return (absorbed[a:b], born[a:b], owner[a:b]) if b > a else None

    def units(self, data: bytes) -> Optional[List[int]]:
        """The symbols BPE starts from for ``data`` (None where a character has none)."""
        syms = self.symbols.units(data)
        return None if not syms or any(s < 0 for s in syms) else syms

    @property
    def fallback(self) -> Optional[np.ndarray]:
        """Each byte's byte-fallback token (-1: none), for SentencePiece-style vocabularies."""
        return self.symbols.fallback

    @property
    def char_unit(self) -> Dict[str, int]:
        """The characters a SentencePiece-style vocabulary has as units, and their tokens."""
        return self.symbols.char_unit

    def known(self) -> CodepointSet:
        """The characters a SentencePiece vocabulary has as units, and every ASCII character
        (the rest are spelt with several byte-fallback tokens)."""
        return self.symbols.known()

    def encode_chunk(self, data: bytes) -> Tuple[List[int], Chain, Chain]:
        """BPE of one chunk's bytes, with the chains of tokens covering its first and last unit."""
        syms = self.units(data)
        if syms is None:
            return [], (), ()
        n = len(syms)
        born = [-1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        alive = [True] * n
        first_pos, last_pos = 0, n - 1
        lchain = [(syms[0], -1)]
        rchain = [(syms[-1], -1)]
        heap = []
        for i in range(n - 1):
            m = self.merges.get((syms[i], syms[i + 1]))
            if m:
                heap.append((m[0], i, m[1]))
        heapq.heapify(heap)
        while heap:
            rank, i, new = heapq.heappop(heap)
            if not alive[i] or nxt[i] < 0:
                continue
            j = nxt[i]
            m = self.merges.get((syms[i], syms[j]))
            if m is None or m[1] != new:
                continue
            syms[i], born[i] = new, rank
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] >= 0:
                prev[nxt[j]] = i
            if i == first_pos:
                lchain.append((new, rank))
            if j == last_pos:
                last_pos = i
                rchain.append((new, rank))
            if prev[i] >= 0:
                m = self.merges.get((syms[prev[i]], new))
                if m:
                    heapq.heappush(heap, (m[0], prev[i], m[1]))
            if nxt[i] >= 0:
                m = self.merges.get((new, syms[nxt[i]]))
                if m:
                    heapq.heappush(heap, (m[0], i, m[1]))
        ids = [syms[i] for i in range(n) if alive[i]]
        return ids, _chain(lchain), _chain(rchain)

    @functools.lru_cache(maxsize=512)
    def forbidden_after(self, right_class: int) -> np.ndarray:
        """Boolean mask of the tokens that BPE never puts right after a token of this class
        (within one chunk). Tokens that are not BPE's own encoding of their bytes are included."""
        mask = ~self.self_canonical.copy()
        lefts, ranks, rights = self._by_left
        for x, born_x, absorbed_x in self.class_chain[right_class]:
            a, b = np.searchsorted(lefts, x), np.searchsorted(lefts, x, side="right")
            for rank, y in zip(ranks[a:b].tolist(), rights[a:b].tolist()):
                if rank <= born_x:
                    continue
                if rank >= absorbed_x:
                    break
                entry = self._left_holding(y)
                if entry is None:
                    continue
                absorbed, born, tokens = entry
                k = int(np.searchsorted(-absorbed, -rank, side="right"))  # absorbed >= rank
                mask[tokens[:k][born[:k] < rank]] = True
        mask.flags.writeable = False
        return mask

    @functools.cached_property
    def _merge_ranks(self) -> HashIndex:
        """The merges' ranks by key ``left * vocab + right`` (-1: no such merge)."""
        return HashIndex(*self._flat[:2])

    def forbidden_pairs(self, right_classes: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """``forbidden_after(right_classes[i])[tokens[i]]`` for each i, without the whole masks:
        the cross merges (x, y) of each class's right chain and each token's left chain, looked
        up all at once in a hash table of the merges."""
        tokens = np.asarray(tokens, np.int64)
        right_classes = np.asarray(right_classes, np.int64)
        out = ~self.self_canonical[tokens]
        _, _, offsets, lens, ly, lborn, labs = self._flat
        coffsets, clens, cx, cborn, cabs = self._flat_classes
        own = np.flatnonzero(~out & (clens[right_classes] > 0))
        if not len(own):
            return out
        # every (pair, entry x of the class's chain), then every (pair, x, entry y of the token's chain)
        nc = clens[right_classes[own]]
        pair = np.repeat(own, nc)
        x = np.arange(len(pair)) + np.repeat(coffsets[right_classes[own]] - (np.cumsum(nc) - nc), nc)
        nl = lens[tokens[pair]]
        y = np.arange(int(nl.sum())) + np.repeat(offsets[tokens[pair]] - (np.cumsum(nl) - nl), nl)
        pair, x = np.repeat(pair, nl), np.repeat(x, nl)
        # a merge of x and y forbids the pair if its rank r lies in both chains' windows: born
        # before r, absorbed after (x) or at it (y); only pairs whose windows meet are looked up
        lo, hi = np.maximum(cborn[x], lborn[y]), np.minimum(cabs[x] - 1, labs[y])
        meet = np.flatnonzero(lo < hi)
        r = self._merge_ranks.get(cx[x[meet]] * len(lens) + ly[y[meet]])
        out[pair[meet[(r >= 0) & (r > lo[meet]) & (r <= hi[meet])]]] = True
        return out


def _chain(chain: Sequence[Tuple[int, int]]) -> Chain:
    """((token, born, absorbed), ...) from ((token, born), ...)."""
    out = []
    for k, (tok, born) in enumerate(chain):
        absorbed = chain[k + 1][1] if k + 1 < len(chain) else INF
        out.append((tok, born, absorbed))
    return tuple(out)
