"""Regex AST → acceptor over UTF-8 bytes (pynini): size checks before anything is built,
rewrites that make repetitions cheaper, and the construction itself.

Entry points: ``check_source(source, max_states)`` before parsing, ``regex_fst(pattern, max_states)``
after. Each walk of the AST is a table from node class to a function.
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np
import pynini

from ..errors import CompileError
from . import regex as rx
from .backtrack import backtrack_fst
from .primitives import (EPS, bytes_fst, chars_fst, concat_all, empty_fst, epsilon_fst, fst_arrays, fst_from_arrays,
                         is_final, optimize, ranges_fst, _over)

SHORT_ROW = 8  # optional items in a row that are concatenated at once
ROW_BUDGET = 10  # states determinized per allowed state, for longer rows


def check_source(source: str, max_states: int) -> None:
    """Refuse a pattern whose source alone shows that it is over the size limit, before it is
    parsed (a list of a million words would take minutes and gigabytes to parse)."""
    if len(source) < max_states:
        return  # each state is at least one character
    atoms = rx.atom_count(source)
    if atoms >= max_states:
        raise _too_large(f"at least {atoms + 1:,}", max_states, (0, len(source)), source,
                         "use fewer or shorter alternatives, or raise the limit (max_states)")


def regex_fst(pattern: rx.Pattern, max_states: int) -> pynini.Fst:
    """The acceptor of ``pattern``'s language over bytes (optimized)."""
    if rx.is_backtracking(pattern.root):
        return backtrack_fst(pattern, max_states)  # atomic, possessive, conditional or inner anchors
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


def _too_large(size: str, max_states: int, span, source, hint: str) -> CompileError:
    return CompileError(f"this pattern needs an automaton of {size} states, more than the limit of "
                        f"{max_states:,}", span, source, hint=hint)


# ---------------------------------------------------------------- size estimates


def estimate_states(node: rx.Node) -> int:
    """An estimate of the automaton's size, checked before anything is built."""
    return _growth(node) + 1


def _growth(node: rx.Node) -> int:
    """How many states a node adds when chained after another."""
    return _GROWTH[type(node)](node)


def _repeat_growth(node: rx.Repeat) -> int:
    if node.max == 0:
        return 0
    if node.max is not None:
        copies = node.max
    else:  # a nullable item is repeated as its star (see _repeat)
        copies = 1 if _nullable(node.item) else node.min + 1
    return _growth(node.item) * copies + 1


_GROWTH = {
    rx.Chars: lambda node: ranges_fst(node.chars.ranges).num_states() - 1 if node.chars else 0,
    rx.Text: lambda node: len(node.text.encode("utf-8")),
    rx.Seq: lambda node: sum(_growth(n) for n in node.items),
    rx.Alt: lambda node: sum(_growth(n) for n in node.items) + 1,
    rx.Group: lambda node: _growth(node.item),
    rx.Repeat: _repeat_growth,
    rx.Anchor: lambda node: 0,
    rx.Atomic: lambda node: _growth(node.item),
    rx.Cond: lambda node: _growth(node.yes) + _growth(node.no) + 1,
}


def _nullable(node: rx.Node) -> bool:
    """Whether the node matches the empty string."""
    return _NULLABLE[type(node)](node)


_NULLABLE = {
    rx.Chars: lambda node: False,
    rx.Text: lambda node: not node.text,
    rx.Seq: lambda node: all(_nullable(n) for n in node.items),
    rx.Alt: lambda node: any(_nullable(n) for n in node.items),
    rx.Group: lambda node: _nullable(node.item),
    rx.Repeat: lambda node: node.min == 0 or _nullable(node.item),
    rx.Anchor: lambda node: True,
    rx.Atomic: lambda node: _nullable(node.item),
    rx.Cond: lambda node: _nullable(node.yes) or _nullable(node.no),
}


def _largest_repeat(node: rx.Node, limit: int) -> rx.Node:
    """The outermost node whose own estimate exceeds ``limit`` but whose children's do not."""
    for c in rx.children(node):
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
        stack.extend(rx.children(n))
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


# ---------------------------------------------------------------- rewrites: the same language, cheaper repetitions


def simplify(node: rx.Node) -> rx.Node:
    """``node`` with repetitions of repetitions as one repetition where that is exact, and runs
    of equal items in a sequence as one repetition (``a?a?a?`` is ``a{0,3}``)."""
    return _SIMPLIFY[type(node)](node)


def _simplify_seq(node: rx.Seq) -> rx.Node:
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


_SIMPLIFY = {
    rx.Chars: lambda node: node,
    rx.Text: lambda node: node,
    rx.Seq: _simplify_seq,
    rx.Alt: lambda node: rx.Alt(node.span, tuple(simplify(n) for n in node.items)),
    rx.Group: lambda node: rx.Group(node.span, simplify(node.item), node.index, node.name),
    rx.Repeat: lambda node: _unnest(rx.Repeat(node.span, simplify(node.item), node.min, node.max)),
}


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
    """x{i,j} x{k,m} = x{i+k,j+m}; None when ``a`` and ``b`` repeat different items."""
    x, i, j = _counts(a)
    y, k, m = _counts(b)
    if not _same(x, y):
        return None
    hi = None if j is None or m is None else j + m
    return _unnest(rx.Repeat((a.span[0], b.span[1]), x, i + k, hi))


def _same(a: rx.Node, b: rx.Node) -> bool:
    """Whether two nodes are the same pattern (groups and spans aside)."""
    while isinstance(a, rx.Group):
        a = a.item
    while isinstance(b, rx.Group):
        b = b.item
    return type(a) is type(b) and _SAME[type(a)](a, b)


def _same_items(a, b) -> bool:
    return len(a.items) == len(b.items) and all(_same(x, y) for x, y in zip(a.items, b.items))


_SAME = {  # two nodes of the same class, groups unwrapped
    rx.Chars: lambda a, b: a.chars == b.chars,
    rx.Text: lambda a, b: a.text == b.text,
    rx.Seq: _same_items,
    rx.Alt: _same_items,
    rx.Repeat: lambda a, b: (a.min, a.max) == (b.min, b.max) and _same(a.item, b.item),
}


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


# ---------------------------------------------------------------- construction


def _build(node: rx.Node, max_states: int, source: str) -> pynini.Fst:
    """The acceptor of ``node`` (sequences and text come out unoptimized)."""
    return _BUILD[type(node)](node, max_states, source)


def _build_seq(node: rx.Seq, max_states: int, source: str) -> pynini.Fst:
    parts, text = [], []  # (fst, nullable)
    for item in node.items:  # runs of literal characters become one chain
        if isinstance(item, rx.Text):
            text.append(item.text)
        elif (isinstance(item, rx.Chars) and len(item.chars.ranges) == 1
              and item.chars.ranges[0][0] == item.chars.ranges[0][1]):
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


def _build_alt(node: rx.Alt, max_states: int, source: str) -> pynini.Fst:
    return optimize(pynini.union(*[_build(n, max_states, source) for n in node.items]), max_states,
                    node.span, source)


def _build_repeat(node: rx.Repeat, max_states: int, source: str) -> pynini.Fst:
    if node.max == 0:
        return epsilon_fst()  # pynini reads an upper bound of 0 as "unbounded"
    item = optimize(_build(node.item, max_states, source), max_states, node.span, source)
    # a bounded run of one character class is a chain of copies: already minimal
    chain = isinstance(node.item, rx.Chars) and node.max is not None
    return _repeat(item, node.min, node.max, max_states, node.span, source, chain)


_BUILD = {
    rx.Chars: lambda node, max_states, source: chars_fst(node.chars) if node.chars else empty_fst(),
    rx.Text: lambda node, max_states, source: bytes_fst(node.text.encode("utf-8")),
    rx.Seq: _build_seq,
    rx.Alt: _build_alt,
    rx.Group: lambda node, max_states, source: _build(node.item, max_states, source),
    rx.Repeat: _build_repeat,
}


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
    if start >= 0 and is_final(item, start):
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
    finals = [s for s in range(item.num_states()) if is_final(item, s)]
    if hi is not None and not any(item.num_arcs(s) for s in finals):
        # copies of an item whose strings are no prefix of one another chain deterministically
        return optimize(_copies(item, lo, hi, max_states, span, source), max_states, span, source, minimal=chain)
    if hi is None or hi - lo < 2:
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


def _copies(item: pynini.Fst, lo: int, hi: int, max_states: int, span, source: str) -> pynini.Fst:
    """``item{lo,hi}`` of a deterministic ``item`` whose final states have no arcs (none of its
    strings begins another), laid out copy after copy in one pass: a final state of copy j is the
    start of copy j + 1 (OpenFST's bounded closure concatenates copies one at a time, in time
    quadratic in ``hi``: 38 s for a{1,90000}). Refused at once past ``max_states``."""
    start, final, src, ilabel, _, dst = fst_arrays(item)
    ends = final != np.inf
    if start < 0 or not ends.any():  # no string: only the empty run
        return epsilon_fst() if lo == 0 else empty_fst()
    if (dst == start).any():  # a copy's start is final where a run may end: one that a loop comes back to
        out = np.flatnonzero(src == start)  # is started afresh ((a*b)? must not take "a")
        start = len(final)
        final, ends = np.append(final, np.inf), np.append(ends, False)
        src, ilabel, dst = (np.concatenate([src, np.full(len(out), start)]), np.concatenate([ilabel, ilabel[out]]),
                            np.concatenate([dst, dst[out]]))
    inner = np.flatnonzero(~ends)
    inner = np.concatenate([[start], inner[inner != start]])  # the start first: copy j begins at j * m
    m = len(inner)
    if hi * m + 1 > max_states:
        raise _over(max_states, span, source)
    pos = np.full(len(final), -1, np.int64)
    pos[inner] = np.arange(m)
    copy = np.arange(hi)[:, None] * m
    to = np.where(ends[dst], m, pos[dst])  # into the next copy's start
    return fst_from_arrays(hi * m + 1, 0, np.isin(np.arange(hi * m + 1), np.arange(lo, hi + 1) * m),
                           (copy + pos[src]).ravel(), np.broadcast_to(ilabel, (hi, len(ilabel))).ravel(),
                           (copy + to).ravel())


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
    start, final, src, ilabel, weight, dst = fst_arrays(det)
    nstates = len(final)
    weight = np.rint(weight).astype(np.int64)  # copies started on each arc
    layer = np.arange(layers)[:, None]
    keep = layer + weight <= n
    used = np.where(final == np.inf, layers, np.rint(np.where(final == np.inf, 0, final))).astype(np.int64)
    return fst_from_arrays(nstates * layers, start, (layer + used <= n).ravel(),
                            (src + nstates * layer)[keep], np.broadcast_to(ilabel, keep.shape)[keep],
                            (dst + nstates * (layer + weight))[keep])
