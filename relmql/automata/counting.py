"""Counting over a token automaton: its strings, its token paths and the nodes of its prefix's
token tree, the fewest tokens a string takes, and the sizes of an eager build (design:
docs/compiler.md, "Counting")."""

from __future__ import annotations

import functools
import time
import weakref
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from ..errors import CompileError
from .bytedfa import SPLIT_COL, count_strings

FEWEST_STATES = 4096  # byte states read at most to bound a language's fewest tokens (fewest_tokens)


@dataclass
class Stats:
    """Sizes of an eagerly built token automaton."""
    states: int  # reachable states
    arcs: int  # their transitions
    seconds: float  # the time the build took


class Counting:
    """The counts of one ``TokenAutomaton`` (``automaton``), each remembered where it is asked
    again: the automaton's methods of the same names call these."""

    def __init__(self, automaton):
        self.automaton = weakref.proxy(automaton)  # the TokenAutomaton counted (a proxy: it owns this)
        self._counts: Dict[Tuple[int, int, int], int] = {}  # (state, max tokens, prefix only) -> paths
        self._too_long: Dict[int, Optional[int]] = {}  # max_tokens -> too_long(max_tokens)

    @functools.cached_property
    def num_strings(self) -> Optional[int]:
        """How many strings this model can produce (None: infinitely many)."""
        return count_strings(self.automaton.dfa)

    def build_eager(self, max_states: int = 1_000_000) -> Stats:
        """Compute every reachable state's arcs (all-tokenization automata are built in one
        vectorized pass over all DFA states)."""
        a = self.automaton
        t0 = time.perf_counter()
        if not any(a.canonical):
            a.bytes.fill()
        seen = {int(a.start)}
        todo = [int(a.start)]
        narcs = 0
        while todo:
            s = todo.pop()
            arcs = a.arcs(s)
            narcs += len(arcs)
            for t in np.unique(arcs.targets).tolist():
                if t not in seen:
                    if len(seen) >= max_states:
                        raise CompileError(f"the token automaton has more than {max_states:,} states")
                    seen.add(t)
                    todo.append(t)
        return Stats(len(seen), narcs, time.perf_counter() - t0)

    def paths(self):
        """Every accepted (tokens, number of prefix tokens) of a finite automaton, depth first
        (an infinite one never ends: bound it with ``itertools.islice``)."""
        a = self.automaton
        stack = [(a.start, (), 0)]
        while stack:
            state, toks, npre = stack.pop()
            if a.is_final(state):
                yield toks, npre
            arcs = a.arcs(state)
            for t, n, p in zip(arcs.tokens.tolist(), arcs.targets.tolist(), arcs.prefix.tolist()):
                stack.append((n, toks + (t,), npre + p))

    def count_paths(self, state: int, max_tokens: int, prefix_only: bool = False) -> int:
        """The number of accepted token paths of at most ``max_tokens`` tokens from ``state``
        (with ``prefix_only``: paths to the end of the prefix). Cycles are unrolled."""
        memo = self._counts
        pre = bool(prefix_only)
        root = (int(state), int(max_tokens), pre)
        stack = [root]
        while stack:  # depth-first, without recursion: a child's count before its parent's
            key = stack[-1]
            if key in memo:
                stack.pop()
                continue
            s, budget, pre = key
            targets = self._targets(s, pre) if budget else ([], [])
            missing = [(t, budget - 1, pre) for t in targets[0] if (t, budget - 1, pre) not in memo]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            memo[key] = self.ends_here(s, pre) + sum(
                c * memo[(t, budget - 1, pre)] for t, c in zip(*targets))
        return memo[root]

    def prefix_nodes(self, max_tokens: int, limit: int) -> Optional[int]:
        """The nodes of the prefix's token tree within ``max_tokens`` tokens (every token sequence
        that begins the prefix, the empty one included), or None as soon as they are known to be
        more than ``limit``: counted level by level, so that a prefix with astronomically many
        tokenizations (text pasted with unescaped dots) is refused after its first levels, not
        after every state's arcs."""
        frontier, total = {self.automaton.start: 1}, 1
        for _ in range(max_tokens):
            nxt: Dict[int, int] = {}
            for s, c in frontier.items():
                for t, k in zip(*self._targets(s, True)):
                    nxt[t] = nxt.get(t, 0) + c * k
            if not nxt:
                break
            total += sum(nxt.values())
            if total > limit:
                return None
            frontier = nxt
        return total

    def fewest_tokens(self, most: int, budget: int = FEWEST_STATES) -> int:
        """A lower bound on the completion tokens of every string: the fewest with which any
        sequence of steps spells one, a step being a token of the vocabulary, a single byte (byte
        fallback) or an added token (every tokenization counts, so the canonical one takes at
        least as many), from any place the prefix may end, whatever its length. Breadth first over
        the byte automaton; where ``most`` tokens or ``budget`` byte states are reached first, the
        depth it got to (at most ``most + 1``)."""
        a = self.automaton
        delta, dead, final = a.delta, a.dead, a.dfa.final
        frontier = np.unique(delta[np.flatnonzero(a.phase[:dead] == 0), SPLIT_COL])
        frontier = frontier[frontier != dead]
        seen = np.zeros(len(delta), bool)
        seen[frontier] = True
        read = 0
        for depth in range(most + 1):
            if (final[frontier] >= 0).any():
                return depth
            read += len(frontier)
            if depth == most or read > budget:
                return depth + 1
            if not len(frontier):  # no string at all
                return most + 1
            steps = [delta[frontier, :256].ravel()]
            for q in frontier.tolist():
                steps.append(a.bytes.arcs(q)[1])
                if a.tags is not None:
                    steps.append(a.steps.tag_step(q, 1)[1])
            frontier = np.unique(np.concatenate(steps))
            frontier = frontier[(frontier != dead) & ~seen[frontier]]
            seen[frontier] = True
        return most + 1

    def too_long(self, max_tokens: int) -> Optional[int]:
        """Where no string can be spelt in ``max_tokens`` completion tokens, a lower bound on the
        tokens each takes (``fewest_tokens``, looked for up to twice as deep); else None."""
        got = self._too_long.get(max_tokens, ())
        if got == ():
            need = self.fewest_tokens(max(2 * max_tokens, max_tokens + 16))
            got = self._too_long[max_tokens] = need if need > max_tokens else None
        return got

    def ends_here(self, state: int, prefix_only: bool) -> int:
        """1 where a counted path may end at ``state`` (with ``prefix_only``: the prefix may end
        there), else 0."""
        a = self.automaton
        if not prefix_only:
            return int(a.is_final(state))
        q, tau, _ = a.unpack(state)
        return int(a.phase[q] == 0 and a.delta[q, SPLIT_COL] != a.dead
                   and (not a.canonical[0] or a.tracker.accepts_end(tau)))

    def _targets(self, state: int, prefix_only: bool):
        """The distinct targets of ``state``'s arcs (prefix arcs alone with ``prefix_only``) and
        how many arcs lead to each."""
        a = self.automaton
        if prefix_only and a.phase[a.unpack(state)[0]] != 0:
            return [], []
        arcs = a.arcs(state)
        targets = arcs.targets[arcs.prefix] if prefix_only else arcs.targets
        uniq, counts = np.unique(targets, return_counts=True)
        return uniq.tolist(), counts.tolist()
