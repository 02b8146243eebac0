"""Exact acceptors for the patterns whose set of strings depends on Python's backtracking order
(atomic groups, possessive repetitions, conditionals, anchors inside the pattern): an ordered
NFA whose paths carry the obligations of the options they passed, and a subset construction over
those configurations (design: docs/compiler.md, "What a pattern means")."""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, FrozenSet, List, Optional, Tuple

import numpy as np
import pynini

from ..errors import CompileError
from . import regex as rx
from .charset import NEWLINE, CodepointSet, partition
from .primitives import empty_fst
from .utf8dfa import atoms_to_bytes

WORK_BUDGET = 100  # work units of the subset construction per allowed state (about 2.5 million a second)
INTERN_WORK = 30  # the work of interning a new configuration or set, in units of one configuration visited
NODE_BUDGET = 2  # NFA nodes per allowed state

# NFA node kinds
CHAR, EPS, SPLIT, ASSERT, CLOSE, COND, LOOP, ITER, RESET, EXIT, MATCH = range(11)

# what the rest of the input must be, from a "$" already passed: weakest first
FREE, LINE_END, END_OR_NL, END = range(4)  # anything; "" or "\n"...; "" or "\n"; ""
_CONSTRAINT = {"line end": LINE_END, "end": END_OR_NL, "string end": END}
_AFTER_NL = (FREE, FREE, END, -1)  # the constraint after reading "\n" (-1: violated)
_AFTER_OTHER = (FREE, -1, -1, -1)  # after reading any other character

# where the position is, for "^": at 0, after "\n", elsewhere
AT_START, AFTER_NL, ELSEWHERE = range(3)

MAIN = -1  # the goal of the path itself (obligations aim at the end node of an atomic group)


class _TooLarge(Exception):
    def __init__(self, node: Optional[rx.Node], costly: bool = False):
        self.node = node
        self.costly = costly  # the construction's work ran out, not its states


# ---------------------------------------------------------------- the ordered NFA


class _Nfa:
    """Nodes as parallel lists. ``arg[n]`` is the next node (CHAR, EPS, ASSERT, CLOSE, ITER,
    RESET, EXIT), the options in priority order (SPLIT) or (bit, lazy, body, out) (LOOP);
    ``atom[n]`` is the end node of the innermost atomic group around a choice point (-1: none)."""

    def __init__(self, limit: int):
        self.kind: List[int] = []
        self.arg: list = []
        self.extra: list = []  # CHAR: class index; ASSERT: kind; CLOSE, COND, ITER, RESET: bit
        self.atom: List[int] = []
        self.classes: List[CodepointSet] = []
        self.class_index: Dict[CodepointSet, int] = {}
        self.limit = limit
        self.repeats: List[rx.Node] = []  # the repetitions being built, outermost first

    def add(self, kind: int, arg=None, extra=None, atom: int = -1) -> int:
        if len(self.kind) >= self.limit:
            raise _TooLarge(self.repeats[0] if self.repeats else None)
        self.kind.append(kind)
        self.arg.append(arg)
        self.extra.append(extra)
        self.atom.append(atom)
        return len(self.kind) - 1

    def char(self, chars: CodepointSet, nxt: int) -> int:
        k = self.class_index.setdefault(chars, len(self.classes))
        if k == len(self.classes):
            self.classes.append(chars)
        return self.add(CHAR, nxt, k)


class _Builder:
    """AST → ordered NFA, built from the end: ``build(node, nxt, atom)`` is the entry of
    ``node`` followed by ``nxt``, inside the atomic group whose end node is ``atom``."""

    def __init__(self, pattern: rx.Pattern, nfa: _Nfa):
        self.nfa = nfa
        tested = sorted({n.group for n in _walk(pattern.root) if isinstance(n, rx.Cond)})
        self.cap_bit = {g: 1 << k for k, g in enumerate(tested)}
        self.nbits = 0

    def build(self, node: rx.Node, nxt: int, atom: int) -> int:
        return getattr(self, "_" + type(node).__name__.lower())(node, nxt, atom)

    def _chars(self, node: rx.Chars, nxt: int, atom: int) -> int:
        return self.nfa.char(node.chars, nxt)

    def _text(self, node: rx.Text, nxt: int, atom: int) -> int:
        for ch in reversed(node.text):
            nxt = self.nfa.char(CodepointSet.of(ord(ch)), nxt)
        return nxt

    def _seq(self, node: rx.Seq, nxt: int, atom: int) -> int:
        for item in reversed(node.items):
            nxt = self.build(item, nxt, atom)
        return nxt

    def _alt(self, node: rx.Alt, nxt: int, atom: int) -> int:
        options = tuple(self.build(item, nxt, atom) for item in node.items)
        return self.nfa.add(SPLIT, options, None, atom)

    def _group(self, node: rx.Group, nxt: int, atom: int) -> int:
        bit = self.cap_bit.get(node.index) if node.index else None
        if bit:
            nxt = self.nfa.add(CLOSE, nxt, bit)
        return self.build(node.item, nxt, atom)

    def _anchor(self, node: rx.Anchor, nxt: int, atom: int) -> int:
        return self.nfa.add(ASSERT, nxt, node.kind)

    def _atomic(self, node: rx.Atomic, nxt: int, atom: int) -> int:
        end = self.nfa.add(EXIT, nxt)
        return self.build(node.item, end, end)

    def _cond(self, node: rx.Cond, nxt: int, atom: int) -> int:
        yes = self.build(node.yes, nxt, atom)
        no = self.build(node.no, nxt, atom)
        return self.nfa.add(COND, (yes, no), self.cap_bit[node.group])

    def _repeat(self, node: rx.Repeat, nxt: int, atom: int) -> int:
        self.nfa.repeats.append(node)
        try:
            if node.possessive:  # x{m,n}+ is (?>(?>x){m,n})
                end = self.nfa.add(EXIT, nxt)
                return self._loop(node, end, end, _possessive_item)
            return self._loop(node, nxt, atom, None)
        finally:
            self.nfa.repeats.pop()

    def _loop(self, node: rx.Repeat, nxt: int, atom: int, wrap) -> int:
        lo, hi = node.min, node.max
        if hi == 0:
            return nxt

        def item(after: int) -> int:
            if wrap is None:
                return self.build(node.item, after, atom)
            end = self.nfa.add(EXIT, after)
            return self.build(node.item, end, end)

        bit = 0
        if (hi is None or hi > lo) and _nullable(node.item):
            bit = 1 << self.nbits  # set by an optional iteration, cleared by a character
            self.nbits += 1
        lazy = node.lazy
        if hi is None:
            loop = self.nfa.add(LOOP, None, None, atom)
            body = self.nfa.add(ITER, item(loop), bit)
            self.nfa.arg[loop] = (bit, lazy, body, nxt)
            cur = loop
        else:
            cur = nxt
            for _ in range(hi - lo):
                body = self.nfa.add(ITER, item(cur), bit)
                cur = self.nfa.add(LOOP, (bit, lazy, body, nxt), None, atom)
        for _ in range(lo):
            cur = item(cur)
        if bit:
            cur = self.nfa.add(RESET, cur, bit)
        return cur


_possessive_item = object()


def _walk(node: rx.Node):
    yield node
    for c in rx.children(node):
        yield from _walk(c)


def _nullable(node: rx.Node) -> bool:
    """Whether ``node`` may match without reading a character (anchors and conditionals
    taken as passable)."""
    if isinstance(node, rx.Chars):
        return False
    if isinstance(node, rx.Text):
        return not node.text
    if isinstance(node, rx.Seq):
        return all(_nullable(n) for n in node.items)
    if isinstance(node, rx.Alt):
        return any(_nullable(n) for n in node.items)
    if isinstance(node, rx.Cond):
        return _nullable(node.yes) or _nullable(node.no)
    if isinstance(node, rx.Repeat):
        return node.min == 0 or node.max == 0 or _nullable(node.item)
    if isinstance(node, (rx.Group, rx.Atomic)):
        return _nullable(node.item)
    return True  # Anchor


# ---------------------------------------------------------------- the subset construction


class _Subsets:
    """Configurations (node, groups matched, constraint, goal, obligations) and sets of them,
    interned as ints. A configuration waits at a CHAR node, or has reached its goal (the end of
    its atomic group, or MATCH for the path itself). ``obligations`` is the id of a set of
    configurations aiming at atomic-group ends: the configuration dies when one of them
    *succeeds* (reaches its goal with no constraint and no obligation left)."""

    def __init__(self, nfa: _Nfa, atom_of_class: List[FrozenSet[int]], newline_atom: int, budget: int):
        self.nfa = nfa
        self.atom_of_class = atom_of_class
        self.newline_atom = newline_atom
        self.work = 0  # configurations visited, stepped, compared or interned: the construction's time and memory
        self.budget = budget
        self.configs: List[tuple] = []
        self.config_id: Dict[tuple, int] = {}
        self.sets: List[FrozenSet[int]] = [frozenset()]
        self.set_id: Dict[FrozenSet[int], int] = {frozenset(): 0}
        self.closures: Dict[tuple, Tuple[int, bool]] = {}
        self.steps: Dict[Tuple[int, int], Tuple[int, bool]] = {}
        self.ends: Dict[int, bool] = {}

    # -- interning
    def config(self, key: tuple) -> int:
        return self._number(key, self.config_id, self.configs, INTERN_WORK)

    def intern(self, members) -> int:
        members = self._prune(members)
        return self._number(members, self.set_id, self.sets, INTERN_WORK + len(members))

    def _number(self, key, ids: dict, items: list, work: int) -> int:
        """``key``'s number in ``items``, appended (and its ``work`` counted against the budget) if new."""
        n = ids.get(key)
        if n is None:
            n = ids[key] = len(items)
            items.append(key)
            self._spend(work)
        return n

    def _spend(self, work: int):
        self.work += work
        if self.work > self.budget:
            raise _TooLarge(None, costly=True)

    def _prune(self, members) -> FrozenSet[int]:
        """Without the configurations that another one of the set makes redundant: the same
        but for more obligations (wherever the one with more survives, so does the other)."""
        members = frozenset(members)
        if len(members) < 2:
            return members
        groups = defaultdict(list)
        for c in members:
            groups[self.configs[c][:4]].append(c)
        if all(len(g) == 1 for g in groups.values()):
            return members
        keep = []
        for g in groups.values():
            if len(g) == 1:
                keep.extend(g)
                continue
            g.sort(key=lambda c: len(self.sets[self.configs[c][4]]))
            kept = []
            for c in g:
                obl = self.sets[self.configs[c][4]]
                if not any(self.sets[self.configs[k][4]] <= obl for k in kept):
                    kept.append(c)
            keep.extend(kept)
            self._spend(len(g) * len(kept))
        return frozenset(keep)

    # -- epsilon closure
    def closure(self, node: int, caps: int, bits: int, cons: int, goal: int, obl: int,
                where: int) -> Tuple[int, bool]:
        """The configurations waiting for a character (or at their goal) that the epsilon
        paths from ``node`` reach, as a set id, and whether one of them succeeds."""
        key = (node, caps, bits, cons, goal, obl, where)
        hit = self.closures.get(key)
        if hit is not None:
            return hit
        kind = self.nfa.kind
        out = []
        seen = set()
        stack = [(node, caps, bits, cons, obl)]  # items (node, caps, bits, cons, obl), depth first
        result = None
        while stack:
            item = stack.pop()
            if item in seen:
                continue
            seen.add(item)
            n, caps, bits, cons, obl = item
            k = kind[n]
            if k == CHAR:
                out.append(self.config((n, caps, cons, goal, obl)))
            elif k == SPLIT or k == LOOP:
                self._choose(item, goal, where, stack)
            elif k == EXIT and n == goal:
                if cons == FREE and obl == 0:
                    result = (0, True)
                    break
                out.append(self.config((n, 0, cons, goal, obl)))
            elif k == MATCH:  # only the path itself gets here (obligations stop at their goal)
                out.append(self.config((n, 0, FREE, goal, obl)))
            else:
                nxt = self._follow(item, where)
                if nxt is not None:
                    stack.append(nxt)
        self._spend(len(seen))
        if result is None:
            result = (self.intern(out), False)
        self.closures[key] = result
        return result

    def _choose(self, item: tuple, goal: int, where: int, stack: list) -> None:
        """Push the options of a choice point (SPLIT or LOOP) onto ``stack`` in the order Python's
        engine tries them; inside an atomic group short of its end, each option with the
        obligations of the options before it (none past an option that reaches the end at once)."""
        n, caps, bits, cons, obl = item
        nfa = self.nfa
        if nfa.kind[n] == SPLIT:
            options = nfa.arg[n]
        else:
            bit, lazy, body, exit_ = nfa.arg[n]
            if bits & bit:  # the last optional iteration was empty: Python stops here
                options = (exit_,)
            else:
                options = (exit_, body) if lazy else (body, exit_)
        end = nfa.atom[n]
        if end < 0 or end == goal or len(options) == 1:
            for o in options:
                stack.append((o, caps, bits, cons, obl))
            return
        # inside atomic group `end`: option t needs every earlier option to fail
        acc = obl
        for o in options:
            stack.append((o, caps, bits, cons, acc))
            first, fires = self.closure(o, caps, bits, cons, end, 0, where)
            if fires:
                break  # the engine never gets past this option
            if self.sets[first]:
                acc = self.intern(self.sets[acc] | self.sets[first])

    def _follow(self, item: tuple, where: int) -> Optional[tuple]:
        """The item after an epsilon node with one way on (EPS, ASSERT, CLOSE, COND, ITER, RESET,
        or EXIT short of the goal); None where an anchor fails at ``where``."""
        n, caps, bits, cons, obl = item
        nfa = self.nfa
        k, arg, extra = nfa.kind[n], nfa.arg[n], nfa.extra[n]
        if k == ASSERT:
            if extra == "start":
                return (arg, caps, bits, cons, obl) if where == AT_START else None
            if extra == "line start":
                return (arg, caps, bits, cons, obl) if where != ELSEWHERE else None
            return (arg, caps, bits, max(cons, _CONSTRAINT[extra]), obl)
        if k == CLOSE:
            return (arg, caps | extra, bits, cons, obl)
        if k == COND:
            yes, no = arg
            return (yes if caps & extra else no, caps, bits, cons, obl)
        if k == ITER:
            return (arg, caps, bits | extra, cons, obl)
        if k == RESET:
            return (arg, caps, bits & ~extra, cons, obl)
        return (arg, caps, bits, cons, obl)  # EPS, or EXIT short of its goal

    # -- reading one character
    def step(self, c: int, atom: int) -> Tuple[int, bool]:
        """The configurations after ``c`` reads a character of ``atom``, and whether one succeeds."""
        key = (c, atom)
        hit = self.steps.get(key)
        if hit is not None:
            return hit
        node, caps, cons, goal, obl = self.configs[c]
        newline = atom == self.newline_atom
        cons = (_AFTER_NL if newline else _AFTER_OTHER)[cons]
        result = (0, False)
        if cons >= 0:
            at_char = self.nfa.kind[node] == CHAR
            if at_char and atom in self.atom_of_class[self.nfa.extra[node]]:
                obl, fires = self.step_set(obl, atom)
                if not fires:
                    result = self.closure(self.nfa.arg[node], caps, 0, cons, goal, obl,
                                          AFTER_NL if newline else ELSEWHERE)
            elif not at_char and goal != MAIN:  # at its goal: only the constraint and obligations remain
                obl, fires = self.step_set(obl, atom)
                if not fires:
                    done = cons == FREE and obl == 0
                    result = (0, True) if done else (self.intern([self.config((node, 0, cons, goal, obl))]), False)
        self.steps[key] = result
        return result

    def step_set(self, s: int, atom: int) -> Tuple[int, bool]:
        """``step`` for every configuration of set ``s``: the union, and whether one succeeds."""
        if s == 0:
            return 0, False
        key = (~s, atom)
        hit = self.steps.get(key)
        if hit is not None:
            return hit
        out = set()
        result = None
        for c in self.sets[s]:
            t, fires = self.step(c, atom)
            if fires:
                result = (0, True)
                break
            out |= self.sets[t]
        self._spend(len(self.sets[s]))
        if result is None:
            result = (self.intern(out), False)
        self.steps[key] = result
        return result

    def succeeds_at_end(self, s: int) -> bool:
        """Whether a configuration of set ``s`` succeeds when the input ends here."""
        hit = self.ends.get(s)
        if hit is None:
            hit = any(self.configs[c][0] == self.configs[c][3] and not self.succeeds_at_end(self.configs[c][4])
                      for c in self.sets[s])
            self.ends[s] = hit
        return hit

    def accepts(self, s: int) -> bool:
        """Whether the path itself ends here, in a DFA state ``s``."""
        return any(self.nfa.kind[self.configs[c][0]] == MATCH and not self.succeeds_at_end(self.configs[c][4])
                   for c in self.sets[s])

    def atoms(self, s: int) -> List[int]:
        """The atoms some configuration of the path in state ``s`` can read."""
        out = set()
        for c in self.sets[s]:
            node = self.configs[c][0]
            if self.nfa.kind[node] == CHAR:
                out |= self.atom_of_class[self.nfa.extra[node]]
        return sorted(out)


# ---------------------------------------------------------------- entry point


def backtrack_fst(pattern: rx.Pattern, max_states: int) -> pynini.Fst:
    """The acceptor over UTF-8 bytes (optimized) of the strings ``re.fullmatch`` accepts, for a
    pattern with atomic groups, possessive repetitions, conditionals or inner anchors."""
    source = pattern.source
    nfa = _Nfa(max(NODE_BUDGET * max_states, 1000))
    try:
        match = nfa.add(MATCH)
        start = _Builder(pattern, nfa).build(pattern.root, match, -1)
    except _TooLarge as e:
        span = e.node.span if e.node is not None else (0, len(source))
        raise CompileError(f"this pattern needs more than {nfa.limit:,} automaton nodes (limit: "
                           f"{max_states:,} states)", span, source,
                           hint="lower the repetition counts, or raise the limit (max_states)") from None
    atoms, atom_of_class = partition(nfa.classes + [NEWLINE])
    newline_atom = next(iter(atom_of_class[-1]))
    sub = _Subsets(nfa, atom_of_class[:-1], newline_atom, WORK_BUDGET * max_states)
    try:
        first, _ = sub.closure(start, 0, 0, FREE, MAIN, 0, AT_START)
        states = {first: 0}
        order = [first]
        src, lbl, dst = [], [], []
        for s in order:
            if s == 0:
                continue
            for a in sub.atoms(s):
                t, _ = sub.step_set(s, a)
                if t == 0:
                    continue
                if t not in states:
                    if len(states) >= max_states:
                        raise _TooLarge(None)
                    states[t] = len(order)
                    order.append(t)
                src.append(states[s])
                lbl.append(a)
                dst.append(states[t])
    except _TooLarge as e:
        what = (f"is too costly to build within the limit of {max_states:,} states (the work allowed grows "
                f"with the limit)") if e.costly else f"has more than {max_states:,} states"
        raise CompileError(f"the automaton {what}", (0, len(source)), source,
                           hint="atomic groups, possessive repetitions and conditionals can multiply states; "
                                "simplify the pattern, or raise the limit (max_states)") from None
    final = np.array([sub.accepts(s) for s in order], bool)
    if not final.any():
        return empty_fst()
    return atoms_to_bytes(len(order), final, np.array(src, np.int64), np.array(lbl, np.int64),
                          np.array(dst, np.int64), atoms, max_states, source)
