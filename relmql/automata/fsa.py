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
SUBSET_BUDGET = 100  # subset-construction elements per allowed state, in repetitions
SHORT_ROW = 8  # optional items in a row that are concatenated at once
ROW_BUDGET = 10  # states determinized per allowed state, for longer rows


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


def check_source(source: str, max_states: int) -> None:
    """Refuse a pattern whose source alone shows that it is over the size limit, before it is
    parsed (a list of a million words would take minutes and gigabytes to parse)."""
    if len(source) < max_states:
        return  # each state is at least one character
    atoms = rx.atom_count(source)
    if atoms >= max_states:
        raise _too_large(f"at least {atoms + 1:,}", max_states, (0, len(source)), source,
                         "use fewer or shorter alternatives, or raise the limit (max_states)")


def _too_large(size: str, max_states: int, span, source, hint: str) -> CompileError:
    return CompileError(f"this pattern needs an automaton of {size} states, more than the limit of "
                        f"{max_states:,}", span, source, hint=hint)


def estimate_states(node: rx.Node) -> int:
    """An estimate of the automaton's size, checked before anything is built."""
    return _growth(node) + 1


def _growth(node: rx.Node) -> int:
    """How many states a node adds when chained after another."""
    if isinstance(node, rx.Chars):
        return _chars_fst_cached(node.chars.ranges).num_states() - 1 if node.chars else 0
    if isinstance(node, rx.Text):
        return len(node.text.encode("utf-8"))
    if isinstance(node, rx.Seq):
        return sum(_growth(n) for n in node.items)
    if isinstance(node, rx.Alt):
        return sum(_growth(n) for n in node.items) + 1
    if isinstance(node, rx.Group):
        return _growth(node.item)
    if isinstance(node, rx.Repeat):
        if node.max == 0:
            return 0
        if node.max is not None:
            copies = node.max
        else:  # a nullable item is repeated as its star (see _build)
            copies = 1 if _nullable(node.item) else node.min + 1
        return _growth(node.item) * copies + 1
    return 0


def _nullable(node: rx.Node) -> bool:
    """Whether the node matches the empty string."""
    if isinstance(node, rx.Text):
        return not node.text
    if isinstance(node, rx.Seq):
        return all(_nullable(n) for n in node.items)
    if isinstance(node, rx.Alt):
        return any(_nullable(n) for n in node.items)
    if isinstance(node, rx.Group):
        return _nullable(node.item)
    if isinstance(node, rx.Repeat):
        return node.min == 0 or _nullable(node.item)
    return not isinstance(node, rx.Chars)


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


def _row_cost(node: rx.Node):
    """The work of building the long rows of optional items (see ``_in_a_row``: each part
    determinizes the row so far), and the costliest row."""
    total, worst, worst_cost = 0, (), -1
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (rx.Seq, rx.Alt)):
            stack.extend(n.items)
        elif isinstance(n, (rx.Group, rx.Repeat)):
            stack.append(n.item)
        if not isinstance(n, rx.Seq):
            continue
        row = []
        for item in n.items + (None,):
            if item is not None and _nullable(item):
                row.append(item)
                continue
            if len(row) > SHORT_ROW:
                cost = len(row) * sum(_growth(x) for x in row) // 2
                total += cost
                if cost > worst_cost:
                    worst, worst_cost = tuple(row), cost
            row = []
    return total, worst


# ---- rewrites that keep the language and make repetitions cheaper to build


def simplify(node: rx.Node) -> rx.Node:
    """``node`` with repetitions of repetitions as one repetition where that is exact, and runs
    of equal items in a sequence as one repetition (``a?a?a?`` is ``a{0,3}``)."""
    if isinstance(node, rx.Seq):
        items = []
        for item in (simplify(n) for n in node.items):
            if items:
                merged = _merge(items[-1], item)
                if merged is not None:
                    items[-1] = merged
                    continue
            items.append(item)
        items = _fold(items)
        return items[0] if len(items) == 1 else rx.Seq(node.span, tuple(items))
    if isinstance(node, rx.Alt):
        return rx.Alt(node.span, tuple(simplify(n) for n in node.items))
    if isinstance(node, rx.Group):
        return rx.Group(node.span, simplify(node.item), node.index, node.name)
    if isinstance(node, rx.Repeat):
        return _unnest(rx.Repeat(node.span, simplify(node.item), node.min, node.max))
    return node


def _fold(items: List[rx.Node]) -> List[rx.Node]:
    """Long rows of optional items with a repeated block, ``x?y?x?y?x?y?...``, as repetitions
    of the block (which are built in linear time, unlike the row; see ``_in_a_row``)."""
    out, i = [], 0
    nullable = [_nullable(n) for n in items] + [False]
    while i < len(items):
        end = i
        while nullable[end]:
            end += 1
        if end - i <= SHORT_ROW:
            out.extend(items[i:end + 1])
            i = end + 1
            continue
        while i < end:
            for p in range(2, SHORT_ROW + 1):
                k = 1
                while i + (k + 1) * p <= end and all(_same(items[i + j], items[i + k * p + j]) for j in range(p)):
                    k += 1
                if k > 1:
                    block = rx.Seq((items[i].span[0], items[i + p - 1].span[1]), tuple(items[i:i + p]))
                    out.append(rx.Repeat((block.span[0], items[i + k * p - 1].span[1]), block, k, k))
                    i += k * p
                    break
            else:
                out.append(items[i])
                i += 1
    return out


def _counts(node: rx.Node):
    """(item, min, max): ``node`` as a repetition."""
    if isinstance(node, rx.Repeat):
        return node.item, node.min, node.max
    return node, 1, 1


def _merge(a: rx.Node, b: rx.Node) -> Optional[rx.Node]:
    """x{i,j} x{k,l} = x{i+k,j+l}; None when ``a`` and ``b`` repeat different items."""
    x, i, j = _counts(a)
    y, k, l = _counts(b)
    if not _same(x, y):
        return None
    hi = None if j is None or l is None else j + l
    return _unnest(rx.Repeat((a.span[0], b.span[1]), x, i + k, hi))


def _same(a: rx.Node, b: rx.Node) -> bool:
    """Whether two nodes are the same pattern (groups and spans aside)."""
    while isinstance(a, rx.Group):
        a = a.item
    while isinstance(b, rx.Group):
        b = b.item
    if type(a) is not type(b):
        return False
    if isinstance(a, rx.Chars):
        return a.chars == b.chars
    if isinstance(a, rx.Text):
        return a.text == b.text
    if isinstance(a, (rx.Seq, rx.Alt)):
        return len(a.items) == len(b.items) and all(_same(x, y) for x, y in zip(a.items, b.items))
    if isinstance(a, rx.Repeat):
        return (a.min, a.max) == (b.min, b.max) and _same(a.item, b.item)
    return False


def _unnest(node: rx.Repeat) -> rx.Node:
    """(y{a,b}){m,n} as y{ma,nb}: exact when the counts ja..jb for j = m..n leave no gap, since
    y{i} y{k} = y{i+k} for any y."""
    inner = node.item
    while isinstance(inner, rx.Group):
        inner = inner.item
    if not isinstance(inner, rx.Repeat) or node.max == 0 or inner.max == 0:
        return node
    a, b, m, n = inner.min, inner.max, node.min, node.max
    if b is None:
        joined = m == n or m >= 1 or a <= 1
    else:
        joined = m == n or (m + 1) * a <= m * b + 1  # if j = m meets j = m+1, every larger j does
    if not joined:
        return node
    hi = None if b is None or n is None else n * b
    return _unnest(rx.Repeat(node.span, inner.item, m * a, hi))


def regex_fst(pattern: rx.Pattern, max_states: int) -> pynini.Fst:
    """The acceptor of ``pattern``'s language over bytes (optimized)."""
    root = simplify(pattern.root)
    est = estimate_states(root)
    if est > max_states:
        culprit = _largest_repeat(root, max_states)
        raise _too_large(f"about {est:,}", max_states, culprit.span, pattern.source,
                         "lower the repetition counts, or raise the limit (max_states)")
    cost, row = _row_cost(root)
    if cost > ROW_BUDGET * max_states:
        raise CompileError(f"{len(row):,} optional items in a row are too costly to build",
                           (row[0].span[0], row[-1].span[1]), pattern.source,
                           hint="write repeated items as one repetition (x{m,n}), or raise the limit (max_states)")
    while isinstance(root, rx.Group):
        root = root.item
    fst = _build(root, max_states, pattern.source)
    if isinstance(root, (rx.Seq, rx.Text)):  # the other nodes come out optimized
        fst = optimize(fst, max_states, root.span, pattern.source)
    return fst


def _is_final(fst: pynini.Fst, state: int) -> bool:
    return fst.final(state) != pynini.Weight.zero("tropical")


def _build(node: rx.Node, max_states: int, source: str) -> pynini.Fst:
    if isinstance(node, rx.Chars):
        return chars_fst(node.chars) if node.chars else empty_fst()
    if isinstance(node, rx.Text):
        return bytes_fst(node.text.encode("utf-8"))
    if isinstance(node, rx.Seq):
        parts, text = [], []  # (fst, nullable)
        for item in node.items:  # runs of literal characters become one chain
            if isinstance(item, rx.Text):
                text.append(item.text)
            elif isinstance(item, rx.Chars) and len(item.chars.ranges) == 1 and item.chars.ranges[0][0] == item.chars.ranges[0][1]:
                text.append(chr(item.chars.ranges[0][0]))
            else:
                if text:
                    parts.append((bytes_fst("".join(text).encode("utf-8")), False))
                    text = []
                parts.append((_build(item, max_states, source), _nullable(item)))
        if text:
            parts.append((bytes_fst("".join(text).encode("utf-8")), False))
        out, row = [], []
        for fst, nullable in parts + [(None, False)]:
            if nullable:
                row.append(fst)
                continue
            if len(row) > SHORT_ROW:
                out.append(_in_a_row(row, max_states, node.span, source))
            else:
                out.extend(row)
            row = []
            if fst is not None:
                out.append(fst)
        return concat_all(out)
    if isinstance(node, rx.Alt):
        return optimize(pynini.union(*[_build(n, max_states, source) for n in node.items]), max_states,
                        node.span, source)
    if isinstance(node, rx.Group):
        return _build(node.item, max_states, source)
    if isinstance(node, rx.Repeat):
        if node.max == 0:
            return epsilon_fst()  # pynini reads an upper bound of 0 as "unbounded"
        item = optimize(_build(node.item, max_states, source), max_states, node.span, source)
        # a bounded run of one character class is a chain of copies: already minimal
        chain = isinstance(node.item, rx.Chars) and node.max is not None
        return _repeat(item, node.min, node.max, max_states, node.span, source, chain)
    raise AssertionError(node)  # pragma: no cover


def _in_a_row(parts: List[pynini.Fst], max_states: int, span, source: str) -> pynini.Fst:
    """The concatenation of many optional parts, determinized one part at a time. (All at once,
    a state of the subset construction may hold any set of positions in the row: exponential.)"""
    acc = parts[0]
    for part in parts[1:]:
        acc = optimize(acc.concat(part), max_states, span, source)
    return acc


def _repeat(item: pynini.Fst, lo: int, hi: Optional[int], max_states: int, span, source: str,
            chain: bool = False) -> pynini.Fst:
    """``item{lo,hi}`` (``hi`` None: unbounded) of an optimized acceptor, optimized."""
    start = item.start()
    if start >= 0 and _is_final(item, start):
        # r{m,n} = (r without "")^{0,n}: the m copies may be empty. (pynini's closure of a
        # nullable item chains epsilon closures through every copy: cubic determinization.)
        arcs = list(item.arcs(start))
        if not arcs:
            return epsilon_fst()  # r is ""
        start = item.add_state()
        for arc in arcs:
            item.add_arc(start, arc)
        item.set_start(start)
        item.connect()  # the old start, unless a copy comes back to it
        lo = 0
    finals = [s for s in range(item.num_states()) if _is_final(item, s)]
    if hi is None or hi - lo < 2 or not any(item.num_arcs(s) for s in finals):
        # copies of an item whose strings are no prefix of one another chain deterministically
        rep = item.closure(lo) if hi is None else item.closure(lo, hi)
        return optimize(rep, max_states, span, source, minimal=chain, copies=hi or lo + 1)
    tail = _at_most(item, finals, hi - lo, max_states)
    if tail is None:
        tail = item.copy().closure(0, hi - lo)
    tail = optimize(tail, max_states, span, source, copies=hi - lo)
    if lo:
        head = optimize(item.closure(lo, lo), max_states, span, source, copies=lo)
        tail = optimize(head.concat(tail), max_states, span, source)
    return tail


def _at_most(item: pynini.Fst, finals: List[int], n: int, max_states: int) -> Optional[pynini.Fst]:
    """``item{0,n}`` of a deterministic ``item`` without the empty string; None when the
    construction does not apply.

    Where a copy of ``item`` can end in the middle of a string, the subset construction keeps,
    for each state of ``item``, every number of copies used so far: quadratic in ``n``. Without a
    lower bound only the fewest matters. Starting a copy costs 1 in the tropical semiring, and a
    weighted determinization keeps exactly the fewest, as a weight on the arcs; the result is then
    laid out in ``n + 1`` layers, one per number of copies, dropping what needs more than ``n``.
    That fails where the difference between two ways of reading a string grows without bound
    (``(a*b|a){0,n}``): no weighted automaton is then found below the size limit.
    """
    w = item.copy()
    restart = w.add_state()
    for arc in list(w.arcs(w.start())):
        w.add_arc(restart, arc)
    one = pynini.Weight("tropical", 1)
    for s in finals:
        w.add_arc(s, pynini.Arc(EPS, EPS, one, restart))
    first = w.add_state()
    w.add_arc(first, pynini.Arc(EPS, EPS, one, restart))
    w.set_final(first)
    w.set_start(first)
    layers = n + 1
    bound = max_states // layers + 1
    det = pynini.determinize(w.rmepsilon(), nstate=bound)
    if det.num_states() >= bound:
        return None
    start, final, src, ilabel, weight, dst = _fst_arrays(det)
    nstates = len(final)
    weight = np.rint(weight).astype(np.int64)  # copies started on each arc
    layer = np.arange(layers)[:, None]
    keep = layer + weight <= n
    used = np.where(final == np.inf, layers, np.rint(np.where(final == np.inf, 0, final))).astype(np.int64)
    return _fst_from_arrays(nstates * layers, start, (layer + used <= n).ravel(),
                            (src + nstates * layer)[keep], np.broadcast_to(ilabel, keep.shape)[keep],
                            (dst + nstates * (layer + weight))[keep])


def optimize(fst: pynini.Fst, max_states: int, span=None, source: Optional[str] = None,
             minimal: bool = False, copies: int = 0) -> pynini.Fst:
    """Remove epsilons, determinize and minimize an unweighted acceptor, within ``max_states``
    (``minimal``: the caller knows that a deterministic result is minimal already; ``copies``:
    the acceptor chains that many copies of one item, and a state of the subset construction
    holds about one state per copy, so its memory is bounded to ``SUBSET_BUDGET * max_states``)."""
    fst = fst.rmepsilon().connect()
    if fst.properties(pynini.I_DETERMINISTIC, True) == pynini.I_DETERMINISTIC:
        det = fst  # e.g. bounded repetitions of a character class
        if minimal:
            if det.num_states() > max_states:
                raise _over(max_states, span, source)
            return det
    else:
        affordable = SUBSET_BUDGET * max_states // copies if copies else max_states
        det = pynini.determinize(fst, nstate=min(max_states, affordable) + 1)
        if affordable < max_states and det.num_states() > affordable:
            raise CompileError("this repetition is too costly to build (a string can be split into its "
                               "copies in too many ways)", span, source,
                               hint="lower the repetition counts, or raise the limit (max_states)")
    if det.num_states() > max_states:
        raise _over(max_states, span, source)
    return det.minimize()


def _over(max_states: int, span, source) -> CompileError:
    return CompileError(f"the automaton has more than {max_states:,} states", span, source,
                        hint="simplify the pattern, or raise the limit (max_states)")


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
    """(start, final weight, src, ilabel, weight, dst) of an acceptor (a final weight of inf:
    not final), read from OpenFST's binary vector format (one vectorized pass; the text format
    is the fallback)."""
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
        final = np.empty(nstates, np.float32)
        offsets = np.empty(nstates, np.int64)
        counts = np.empty(nstates, np.int64)
        for st in range(nstates):
            final[st], n = struct.unpack_from("<fq", data, o)
            offsets[st], counts[st] = o + 12, n
            o += 12 + 16 * n
        # arc records (ilabel, olabel, weight, nextstate) all start at the same offset modulo 4
        shift = int(offsets[0]) % 4 if nstates else 0
        words = np.frombuffer(data, np.int32, count=(len(data) - shift) // 4, offset=shift)
        first = (np.repeat(offsets, counts) - shift) // 4
        first += 4 * (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))
        src = np.repeat(np.arange(nstates), counts)
        return (int(start), final, src, words[first].astype(np.int64), words[first + 2].view(np.float32),
                words[first + 3].astype(np.int64))
    except (struct.error, ValueError):  # pragma: no cover - a different OpenFST build
        return _fst_arrays_text(fst)


def _fst_arrays_text(fst: pynini.Fst):
    n = fst.num_states()
    final = np.array([float(fst.final(s)) for s in range(n)], np.float32)
    rows = [(s, a.ilabel, a.nextstate, float(a.weight)) for s in range(n) for a in fst.arcs(s)]
    arr = np.array(rows, np.float64).reshape(-1, 4)
    ints = arr[:, :3].astype(np.int64)
    return fst.start(), final, ints[:, 0], ints[:, 1], arr[:, 3].astype(np.float32), ints[:, 2]


def _fst_from_arrays(nstates: int, start: int, final: np.ndarray, src: np.ndarray, ilabel: np.ndarray,
                     dst: np.ndarray) -> pynini.Fst:
    """An unweighted acceptor from its arrays, written in the binary format ``_fst_arrays`` reads."""
    order = np.argsort(src, kind="stable")
    src, ilabel, dst = src[order], ilabel[order], dst[order]
    counts = np.bincount(src, minlength=nstates)
    before = np.cumsum(counts) - counts
    at = 3 * np.arange(nstates) + 4 * before  # each state: final weight, int64 number of arcs
    words = np.zeros(3 * nstates + 4 * len(src), np.int32)
    words[at] = np.where(final, 0, 0x7F800000)  # float32 0 and inf
    words[at + 1] = counts
    arc = np.repeat(at + 3, counts) + 4 * (np.arange(len(src)) - np.repeat(before, counts))
    words[arc] = words[arc + 1] = ilabel
    words[arc + 3] = dst
    kind = b"".join(struct.pack("<i", len(k)) + k for k in (b"vector", b"standard"))
    header = (struct.pack("<i", _FST_MAGIC) + kind + struct.pack("<ii", 2, 0)
              + struct.pack("<Qqqq", 3, start, nstates, len(src)))  # properties: expanded, mutable
    return pynini.Fst.read_from_string(header + words.tobytes())


def to_dfa(fst: pynini.Fst) -> ByteDFA:
    """Convert an optimized acceptor (labels: bytes, SPLIT, TAG+j) into a ``ByteDFA``."""
    n = fst.num_states()
    if n == 0 or fst.start() < 0:
        return ByteDFA(np.zeros((1, NBYTES + 1), np.int32), np.full(1, -1, np.int16))
    start, final_weight, src, ilab, _, dst = _fst_arrays(fst)
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
