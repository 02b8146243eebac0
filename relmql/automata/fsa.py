"""Byte-level automata with pynini (OpenFST): regex AST → acceptor over UTF-8 bytes, the prefix
split, edits and filters, and the final deterministic ``ByteDFA`` as numpy tables.

Labels: OpenFST reserves 0 for epsilon, so byte ``b`` is label ``b + 1``; ``SPLIT`` (257) marks
the boundary between the prefix and the completion; labels from ``TAG`` up carry the edit count
of a final state until it is moved into ``ByteDFA.final``.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

import numpy as np
import pynini

from ..errors import CompileError
from . import regex as rx
from .charset import CodepointSet, utf8_sequences

EPS = 0
SPLIT = 257
TAG = 300
NBYTES = 256
SPLIT_COL = 256  # column of SPLIT in ByteDFA.delta

_ONE = pynini.Weight.one("tropical")


def lab(byte: int) -> int:
    return byte + 1


# ---------------------------------------------------------------- small builders


def _new(nstates: int = 1) -> pynini.Fst:
    f = pynini.Fst()
    f.add_states(nstates)
    f.set_start(0)
    return f


def epsilon_fst() -> pynini.Fst:
    f = _new()
    f.set_final(0)
    return f


def empty_fst() -> pynini.Fst:
    return _new()


def bytes_fst(data: bytes) -> pynini.Fst:
    """The one string ``data``."""
    f = _new(len(data) + 1)
    for k, b in enumerate(data):
        f.add_arc(k, pynini.Arc(lab(b), lab(b), _ONE, k + 1))
    f.set_final(len(data))
    return f


def concat_all(parts) -> pynini.Fst:
    """The concatenation of ``parts``, joined pairwise so that long sequences stay fast."""
    parts = list(parts) or [epsilon_fst()]
    while len(parts) > 1:
        parts = [parts[i].concat(parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def sigma_star() -> pynini.Fst:
    """Every byte string (no SPLIT)."""
    f = _new()
    for b in range(NBYTES):
        f.add_arc(0, pynini.Arc(lab(b), lab(b), _ONE, 0))
    f.set_final(0)
    return f


@functools.lru_cache(maxsize=256)
def _chars_fst_cached(ranges) -> pynini.Fst:
    f = _new(2)
    f.set_final(1)
    for lo, hi in ranges:
        for seq in utf8_sequences(lo, hi):
            state = 0
            for k, (blo, bhi) in enumerate(seq):
                nxt = 1 if k == len(seq) - 1 else f.add_state()
                for b in range(blo, bhi + 1):
                    f.add_arc(state, pynini.Arc(lab(b), lab(b), _ONE, nxt))
                state = nxt
    return f.optimize()


def chars_fst(chars: CodepointSet) -> pynini.Fst:
    """One character of ``chars`` as its UTF-8 bytes."""
    return _chars_fst_cached(chars.ranges).copy()


# ---------------------------------------------------------------- regex AST → acceptor


def estimate_states(node: rx.Node) -> int:
    """An estimate of the automaton's size, checked before anything is built."""
    return _growth(node) + 1


def _growth(node: rx.Node) -> int:
    """How many states a node adds when chained after another."""
    if isinstance(node, rx.Chars):
        return _chars_fst_cached(node.chars.ranges).num_states() - 1 if node.chars else 0
    if isinstance(node, rx.Seq):
        return sum(_growth(n) for n in node.items)
    if isinstance(node, rx.Alt):
        return sum(_growth(n) for n in node.items) + 1
    if isinstance(node, rx.Group):
        return _growth(node.item)
    if isinstance(node, rx.Repeat):
        copies = node.max if node.max is not None else node.min + 1
        return _growth(node.item) * max(1, copies) + 1
    return 0


def _largest_repeat(node: rx.Node, limit: int) -> rx.Node:
    """The outermost node whose own estimate exceeds ``limit`` but whose children's do not."""
    children = []
    if isinstance(node, (rx.Seq, rx.Alt)):
        children = list(node.items)
    elif isinstance(node, (rx.Group, rx.Repeat)):
        children = [node.item]
    for c in children:
        if estimate_states(c) > limit:
            return _largest_repeat(c, limit)
    return node


def regex_fst(pattern: rx.Pattern, max_states: int) -> pynini.Fst:
    """The acceptor of ``pattern``'s language over bytes (optimized)."""
    est = estimate_states(pattern.root)
    if est > max_states:
        culprit = _largest_repeat(pattern.root, max_states)
        raise CompileError(f"this pattern needs an automaton of about {est:,} states, more than the limit "
                           f"of {max_states:,}", culprit.span, pattern.source,
                           hint="lower the repetition counts, or raise the limit (max_states)")
    root = pattern.root
    while isinstance(root, rx.Group):
        root = root.item
    fst = _build(root, max_states, pattern.source)
    if isinstance(root, (rx.Seq,)):  # the other nodes come out optimized
        fst = optimize(fst, max_states, root.span, pattern.source)
    return fst


def _build(node: rx.Node, max_states: int, source: str) -> pynini.Fst:
    if isinstance(node, rx.Chars):
        return chars_fst(node.chars) if node.chars else empty_fst()
    if isinstance(node, rx.Seq):
        parts, run = [], []
        for item in node.items:  # runs of literal characters become one chain
            if isinstance(item, rx.Chars) and len(item.chars.ranges) == 1 and item.chars.ranges[0][0] == item.chars.ranges[0][1]:
                run.append(chr(item.chars.ranges[0][0]))
                continue
            if run:
                parts.append(bytes_fst("".join(run).encode("utf-8")))
                run = []
            parts.append(_build(item, max_states, source))
        if run:
            parts.append(bytes_fst("".join(run).encode("utf-8")))
        return concat_all(parts)
    if isinstance(node, rx.Alt):
        return optimize(pynini.union(*[_build(n, max_states, source) for n in node.items]), max_states,
                        node.span, source)
    if isinstance(node, rx.Group):
        return _build(node.item, max_states, source)
    if isinstance(node, rx.Repeat):
        if node.max == 0:
            return epsilon_fst()  # pynini reads an upper bound of 0 as "unbounded"
        item = optimize(_build(node.item, max_states, source), max_states, node.span, source)
        rep = item.closure(node.min) if node.max is None else item.closure(node.min, node.max)
        # a bounded run of one character class is a chain of copies: already minimal
        chain = isinstance(node.item, rx.Chars) and node.max is not None
        return optimize(rep, max_states, node.span, source, minimal=chain)
    raise AssertionError(node)  # pragma: no cover


def optimize(fst: pynini.Fst, max_states: int, span=None, source: Optional[str] = None,
             minimal: bool = False) -> pynini.Fst:
    """Remove epsilons, determinize and minimize an unweighted acceptor, within ``max_states``
    (``minimal``: the caller knows that a deterministic result is minimal already)."""
    fst = fst.rmepsilon()
    if fst.properties(pynini.I_DETERMINISTIC, True) == pynini.I_DETERMINISTIC:
        det = fst  # e.g. bounded repetitions of a character class
        if minimal:
            if det.num_states() > max_states:
                raise CompileError(f"the automaton has more than {max_states:,} states", span, source,
                                   hint="simplify the pattern, or raise the limit (max_states)")
            return det
    else:
        det = pynini.determinize(fst, nstate=max_states + 1)
    if det.num_states() > max_states:
        raise CompileError(f"the automaton has more than {max_states:,} states", span, source,
                           hint="simplify the pattern, or raise the limit (max_states)")
    return det.minimize()


# ---------------------------------------------------------------- prefix split, edits, filters


def _copy_arcs(f: pynini.Fst, state: int, target: int, labels: Iterable[int]):
    for x in labels:
        f.add_arc(state, pynini.Arc(x, x, _ONE, target))


def insert_split_transducer() -> pynini.Fst:
    """Σ* (ε:SPLIT) Σ*: insert one SPLIT anywhere."""
    f = _new(2)
    f.set_final(1)
    for s in (0, 1):
        _copy_arcs(f, s, s, range(1, NBYTES + 1))
    f.add_arc(0, pynini.Arc(EPS, SPLIT, _ONE, 1))
    return f


def move_split_left_transducer() -> pynini.Fst:
    """u d SPLIT v → u SPLIT d v for a non-empty d: maps a split string to every split that is
    strictly shorter on the prefix side."""
    f = _new(4)
    f.set_final(3)
    _copy_arcs(f, 0, 0, range(1, NBYTES + 1))
    f.add_arc(0, pynini.Arc(EPS, SPLIT, _ONE, 1))
    _copy_arcs(f, 1, 2, range(1, NBYTES + 1))
    _copy_arcs(f, 2, 2, range(1, NBYTES + 1))
    f.add_arc(2, pynini.Arc(SPLIT, EPS, _ONE, 3))
    _copy_arcs(f, 3, 3, range(1, NBYTES + 1))
    return f


def intersect(a: pynini.Fst, b: pynini.Fst) -> pynini.Fst:
    return pynini.intersect(a.copy().arcsort("olabel"), b.copy().arcsort("ilabel"))


def difference(a: pynini.Fst, b: pynini.Fst) -> pynini.Fst:
    return pynini.difference(a.copy().arcsort("olabel"), b.copy().arcsort("ilabel"))


def apply(fst: pynini.Fst, transducer: pynini.Fst) -> pynini.Fst:
    """The output language of ``transducer`` on the strings of ``fst``."""
    fst = fst.copy().arcsort("olabel")
    out = pynini.compose(fst, transducer.copy().arcsort("ilabel"))
    return out.project("output")


def split_language(matching: pynini.Fst, prefix: Optional[pynini.Fst], max_states: int) -> pynini.Fst:
    """{p SPLIT c : p in PREFIX, pc in MATCHING}; without a prefix, SPLIT · MATCHING."""
    split_arc = _new(2)
    split_arc.set_final(1)
    split_arc.add_arc(0, pynini.Arc(SPLIT, SPLIT, _ONE, 1))
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


PRINTABLE_ASCII = "".join(chr(c) for c in range(0x20, 0x7F))
EDIT_SCOPES = ("all", "prefix", "completion")


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
            f.add_arc(state, pynini.Arc(a, b, _ONE, nxt))
            state = nxt

    copy_char = _chars_fst_cached(((0, 0x10FFFF),))
    for (phase, e), s in boundary.items():
        # copy one whole character: graft the UTF-8 automaton between s and s
        mapping = {copy_char.start(): s}
        for st in copy_char.states():
            if st not in mapping:
                mapping[st] = s if copy_char.final(st) != pynini.Weight.zero("tropical") else f.add_state()
        for st in copy_char.states():
            for arc in copy_char.arcs(st):
                f.add_arc(mapping[st], pynini.Arc(arc.ilabel, arc.olabel, _ONE, mapping[arc.nextstate]))
        if phase == 0:
            f.add_arc(s, pynini.Arc(SPLIT, SPLIT, _ONE, boundary[1, e]))
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
    """``[E_0, ..., E_k]``: the strings at edit distance exactly j from ``lang``."""
    levels, previous = [], None
    for j in range(k + 1):
        within = lang if j == 0 else optimize(apply(lang, edit_transducer(j, alphabet, scope)), max_states)
        exact = within if previous is None else optimize(difference(within, previous), max_states)
        levels.append(exact)
        previous = within
    return levels


def tag_levels(levels: Sequence[pynini.Fst], max_states: int) -> pynini.Fst:
    """One acceptor whose strings end with the TAG label of their level."""
    parts = []
    for j, level in enumerate(levels):
        t = _new(2)
        t.set_final(1)
        t.add_arc(0, pynini.Arc(TAG + j, TAG + j, _ONE, 1))
        parts.append(level.copy().concat(t))
    return optimize(pynini.union(*parts), max_states)


# ---------------------------------------------------------------- the DFA as numpy tables


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
        return self.delta.shape[0] - 1

    @property
    def dead(self) -> int:
        return self.num_states  # the last row

    @property
    def num_arcs(self) -> int:
        return int((self.delta[:-1] != self.dead).sum())

    def is_empty(self) -> bool:
        return self.num_states == 0 or not (self.final[:-1] >= 0).any()

    def walk(self, data: bytes, state: int = 0) -> int:
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


_FST_MAGIC = 2125659606


def _fst_arrays(fst: pynini.Fst):
    """(start, final?, src, ilabel, dst) of an acceptor, read from OpenFST's binary vector format
    (one vectorized pass; the text format is the fallback)."""
    data = fst.write_to_string()
    try:
        o = 0
        magic, = struct.unpack_from("<i", data, o)
        o += 4
        kinds = []
        for _ in range(2):
            n, = struct.unpack_from("<i", data, o)
            kinds.append(data[o + 4:o + 4 + n])
            o += 4 + n
        _, flags = struct.unpack_from("<ii", data, o)
        o += 8
        _, start, nstates, _ = struct.unpack_from("<Qqqq", data, o)
        o += 32
        if magic != _FST_MAGIC or kinds != [b"vector", b"standard"] or flags & 3:
            raise ValueError("unexpected FST format")
        final = np.zeros(nstates, bool)
        offsets = np.empty(nstates, np.int64)
        counts = np.empty(nstates, np.int64)
        for st in range(nstates):
            w, n = struct.unpack_from("<fq", data, o)
            final[st] = w != math.inf
            offsets[st], counts[st] = o + 12, n
            o += 12 + 16 * n
        # arc records (ilabel, olabel, weight, nextstate) all start at the same offset modulo 4
        shift = int(offsets[0]) % 4 if nstates else 0
        words = np.frombuffer(data, np.int32, count=(len(data) - shift) // 4, offset=shift)
        first = (np.repeat(offsets, counts) - shift) // 4
        first += 4 * (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))
        src = np.repeat(np.arange(nstates), counts)
        return int(start), final, src, words[first].astype(np.int64), words[first + 3].astype(np.int64)
    except (struct.error, ValueError):  # pragma: no cover - a different OpenFST build
        return _fst_arrays_text(fst)


def _fst_arrays_text(fst: pynini.Fst):
    n = fst.num_states()
    final = np.array([fst.final(s) != pynini.Weight.zero("tropical") for s in range(n)], bool)
    rows = [(s, a.ilabel, a.nextstate) for s in range(n) for a in fst.arcs(s)]
    arr = np.array(rows, np.int64).reshape(-1, 3)
    return fst.start(), final, arr[:, 0], arr[:, 1], arr[:, 2]


def to_dfa(fst: pynini.Fst) -> ByteDFA:
    """Convert an optimized acceptor (labels: bytes, SPLIT, TAG+j) into a ``ByteDFA``."""
    n = fst.num_states()
    if n == 0 or fst.start() < 0:
        return ByteDFA(np.zeros((1, NBYTES + 1), np.int32), np.full(1, -1, np.int16))
    start, is_final, src, ilab, dst = _fst_arrays(fst)
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
        final[new_id[np.flatnonzero(is_final)]] = 0
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
