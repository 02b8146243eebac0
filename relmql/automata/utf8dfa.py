"""A deterministic automaton over classes of code points, spelled out over UTF-8 bytes: built
deterministically and counted against ``max_states`` as it grows, so that a class such as ``\\w``
(310 byte states on its own) behind thousands of states is refused at once, not expanded first."""

from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple

import numpy as np
import pynini

from .charset import SURROGATES, CodepointSet
from .primitives import fst_arrays, fst_from_arrays, _over

# (first lead byte, last lead byte, continuation bytes, lowest and highest code point) per length
_LENGTHS = ((0xC2, 0xDF, 1, 0x80, 0x7FF), (0xE0, 0xEF, 2, 0x800, 0xFFFF), (0xF0, 0xF4, 3, 0x10000, 0x10FFFF))
_CONT = 64  # continuation bytes 0x80-0xBF, 6 bits each


class _Segments:
    """The code points as consecutive segments, each of one atom or of none (the label ``dead``),
    and the runs of labels under each block of the UTF-8 byte tree: a block (the code points
    whose encodings share their first bytes) is uniform (one label) or a *layout*, its runs
    relative to the block's start, interned so that blocks with the same runs share it."""

    def __init__(self, atoms: List[CodepointSet]):
        self.dead = len(atoms)
        spans = sorted((lo, hi, a) for a, cps in enumerate(atoms) for lo, hi in cps.ranges)
        starts, labels = [0], [self.dead]
        for lo, hi, a in spans:  # the last segment is dead, up to any code point
            if lo > starts[-1]:
                starts.append(lo)
                labels.append(a)
            else:
                labels[-1] = a
            starts.append(hi + 1)
            labels.append(self.dead)
        self.starts, self.labels = starts, labels
        self.layouts: List[Tuple[int, Tuple[Tuple[int, int], ...]]] = []  # (level, runs)
        self.layout_id: Dict[tuple, int] = {}
        self.layout_labels: List[Tuple[int, ...]] = []  # the distinct labels of each layout, in order
        self._children: Dict[int, list] = {}

    def runs(self, lo: int, size: int, valid: Tuple[int, int]) -> Tuple[Tuple[int, int], ...]:
        """The runs (start relative to ``lo``, label) of code points ``lo`` to ``lo + size - 1``,
        those outside ``valid`` or among the surrogates dead."""
        hi = lo + size
        cuts = {lo, *self.starts[bisect.bisect_right(self.starts, lo):bisect.bisect_left(self.starts, hi)]}
        cuts.update(x for x in (valid[0], valid[1] + 1, SURROGATES[0], SURROGATES[1] + 1) if lo < x < hi)
        out: List[Tuple[int, int]] = []
        for p in sorted(cuts):
            ok = valid[0] <= p <= valid[1] and not SURROGATES[0] <= p <= SURROGATES[1]
            self._append(out, p - lo, self.labels[bisect.bisect_right(self.starts, p) - 1] if ok else self.dead)
        return tuple(out)

    @staticmethod
    def _append(out: List[Tuple[int, int]], at: int, label: int):
        if not out or out[-1][1] != label:
            out.append((at, label))

    def block(self, level: int, runs: Tuple[Tuple[int, int], ...]) -> Tuple[bool, int]:
        """(True, label) for a uniform block, (False, layout id) for a mixed one."""
        if len(runs) == 1:
            return True, runs[0][1]
        key = (level, runs)
        lid = self.layout_id.get(key)
        if lid is None:
            lid = self.layout_id[key] = len(self.layouts)
            self.layouts.append(key)
            self.layout_labels.append(tuple(dict.fromkeys(label for _, label in runs)))
        return False, lid

    def children(self, lid: int) -> list:
        """The 64 blocks one continuation byte below layout ``lid``."""
        got = self._children.get(lid)
        if got is None:
            level, runs = self.layouts[lid]
            size = _CONT ** (level - 1)
            starts = [r[0] for r in runs]
            got = []
            for c in range(_CONT):
                lo = c * size
                k = bisect.bisect_right(starts, lo) - 1
                sub: List[Tuple[int, int]] = []
                while k < len(runs) and runs[k][0] < lo + size:
                    self._append(sub, max(runs[k][0], lo) - lo, runs[k][1])
                    k += 1
                got.append(self.block(level - 1, tuple(sub)))
            self._children[lid] = got
        return got


def atoms_to_bytes(nstates: int, final: np.ndarray, src: np.ndarray, atom: np.ndarray, dst: np.ndarray,
                   atoms: List[CodepointSet], max_states: int, source: str) -> pynini.Fst:
    """The DFA over atoms (``atom[i]`` the atom of arc i, state 0 the start; the atoms disjoint)
    as a minimal acceptor over UTF-8 bytes. Raises the compiler's size error, under the whole
    pattern, as soon as the byte automaton grows past ``max_states``."""
    dfa = fst_from_arrays(nstates, 0, final, src, atom + 1, dst).connect().minimize()
    start, weights, src, ilabel, _, dst = fst_arrays(dfa)
    n = len(weights)
    if n > max_states:
        raise _over(max_states, (0, len(source)), source)
    seg = _Segments(atoms)
    table = np.full((n, len(atoms) + 1), -1, np.int64)  # state, label -> next state (-1: none)
    table[src, ilabel - 1] = dst
    builder = _Builder(seg, n, max_states, source)
    ascii_labels = np.array([seg.labels[bisect.bisect_right(seg.starts, b) - 1] for b in range(0x80)])
    builder.arcs_from_all(np.arange(0x80), table[:, ascii_labels])
    for first, last, level, low, high in _LENGTHS:
        size = _CONT ** level
        for lead in range(first, last + 1):
            base = (lead & (0x3F >> level)) * size
            uniform, which = seg.block(level, seg.runs(base, size, (low, high)))
            if uniform:
                builder.uniform_arcs(lead, level, table[:, which])
            else:
                builder.mixed_arcs(lead, which, table[:, list(seg.layout_labels[which])])
    byte_final = np.zeros(builder.count, bool)
    byte_final[:n] = weights != np.inf
    fst = fst_from_arrays(builder.count, start, byte_final, *builder.arrays())
    return fst.minimize()


class _Builder:
    """The byte automaton's states beyond the atom DFA's, each a block of the byte tree with the
    next state of each label in it, interned; and its arcs."""

    def __init__(self, seg: _Segments, n: int, max_states: int, source: str):
        self.seg = seg
        self.count = n
        self.max_states = max_states
        self.source = source
        self.nodes: Dict[tuple, int] = {}
        self.src: List[np.ndarray] = []
        self.byte: List[np.ndarray] = []
        self.dst: List[np.ndarray] = []

    def arrays(self):
        cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.int64)  # noqa: E731
        return cat(self.src), cat(self.byte) + 1, cat(self.dst)

    def _arcs(self, src, byte, dst):
        self.src.append(np.asarray(src, np.int64))
        self.byte.append(np.asarray(byte, np.int64))
        self.dst.append(np.asarray(dst, np.int64))

    def arcs_from_all(self, byte: np.ndarray, to: np.ndarray):
        """Arcs on ``byte[j]`` from every atom-DFA state ``s`` to ``to[s, j]`` (where not -1)."""
        s, j = np.nonzero(to >= 0)
        self._arcs(s, byte[j], to[s, j])

    def uniform_arcs(self, lead: int, level: int, targets: np.ndarray):
        live = np.flatnonzero(targets >= 0)
        nodes = {t: self.uniform(level, t) for t in np.unique(targets[live]).tolist()}
        self._arcs(live, np.full(len(live), lead), [nodes[t] for t in targets[live].tolist()])

    def mixed_arcs(self, lead: int, lid: int, targets: np.ndarray):
        live = np.flatnonzero((targets >= 0).any(axis=1))
        if not len(live):
            return
        rows, inverse = np.unique(targets[live], axis=0, return_inverse=True)
        nodes = np.array([self.mixed(lid, tuple(r)) for r in rows.tolist()], np.int64)
        self._arcs(live, np.full(len(live), lead), nodes[inverse.ravel()])

    def _new(self, key) -> int:
        if self.count >= self.max_states:
            raise _over(self.max_states, (0, len(self.source)), self.source)
        node = self.nodes[key] = self.count
        self.count += 1
        return node

    def uniform(self, level: int, target: int) -> int:
        """The state that reads ``level`` more continuation bytes, any of them, then is at ``target``."""
        if level == 0:
            return target
        key = (level, target)
        node = self.nodes.get(key)
        if node is None:
            below = self.uniform(level - 1, target)
            node = self._new(key)
            self._arcs(np.full(_CONT, node), np.arange(0x80, 0xC0), np.full(_CONT, below))
        return node

    def mixed(self, lid: int, targets: Tuple[int, ...]) -> Optional[int]:
        """The state of layout ``lid`` whose labels (in ``layout_labels`` order) lead to ``targets``."""
        if all(t < 0 for t in targets):
            return None
        labels = self.seg.layout_labels[lid]
        if self.seg.dead not in labels and len(set(targets)) == 1:
            return self.uniform(self.seg.layouts[lid][0], targets[0])
        key = (~lid, targets)
        node = self.nodes.get(key)
        if node is None:
            node = self._new(key)
            to = dict(zip(labels, targets))
            to[self.seg.dead] = -1
            level = self.seg.layouts[lid][0]
            bytes_, dsts = [], []
            for c, (uniform, which) in enumerate(self.seg.children(lid)):
                if uniform:
                    t = to[which]
                    child = self.uniform(level - 1, t) if t >= 0 else None
                else:
                    child = self.mixed(which, tuple(to[label] for label in self.seg.layout_labels[which]))
                if child is not None:
                    bytes_.append(0x80 + c)
                    dsts.append(child)
            self._arcs(np.full(len(dsts), node), bytes_, dsts)
        return node
