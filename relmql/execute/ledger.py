"""The best-first search's bounds and accounts: the statistics it keeps, what it remembers of the
automaton's states, the ways it cut short and the probability it lost (design: docs/executor.md,
"Inside the search")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import numpy as np

from ..automata.tokens import TokenAutomaton
from ..memory import Shares
from ..records import Decoding, ExecutionError, ShortestPath, Stop
from .frontier import Node

STATE_BYTES = 100  # what a search remembers of an automaton state it met (a dict entry)
# why a search may end with no row, or with fewer than its language holds (SearchStats.no_row, .cut)
NO_ROW = ("rules", "eos", "max_tokens", "max_prefix_tokens", "prefix_context", "context")


@dataclass
class SearchStats:
    """What a search did and why it ended (docs/executor.md, "Inside the search", spells out
    ``no_row`` and ``cut``)."""
    expanded: int = 0  # nodes expanded (each costs the model one token: the start-of-text token for the root)
    prefix: int = 0  # how many of them were prefix nodes
    rows: int = 0  # rows released
    row_at: int = 0  # nodes expanded at the last row released (0 before; a reader that drops the row sets it back)
    prefix_at: int = 0  # prefix nodes expanded by then (likewise)
    held: int = 0  # the most bytes held in the queue and stored children (estimated before each model call)
    stop: Optional[Stop] = None  # the bound that ended the search with the language not exhausted
    no_row: Tuple[str, ...] = ()  # why a search with no row found none, or what had cut ways short by a stop (NO_ROW)
    cut: Tuple[str, ...] = ()  # the bounds that cut a way short in a search that exhausted its language with rows
    fewest: Optional[int] = None  # where no string fits in max_tokens: a lower bound on the tokens each takes
    floor: Optional[float] = None  # the canonical tokenizations' probability, where an estimate fell below it
    watch: Optional[Callable[["SearchStats", ShortestPath], None]] = field(
        default=None, repr=False, compare=False)  # called after each model call (a progress display)

    @property
    def stopped(self) -> bool:
        return self.stop is not None

    @property
    def since_row(self) -> int:
        """Completion nodes expanded since the last row, which ``max_nodes_per_row`` bounds (the
        prefix's, its tokenizations and edited variants, count against ``max_prefix_nodes``)."""
        return self.expanded - self.row_at - (self.prefix - self.prefix_at)


class Ledger:
    """A search's bounds (``stop``, ``check_prefix_paths``) and its accounts: what it remembers of
    the automaton states it met, the first ``most`` states cut short per cause (``NO_ROW``) and,
    with ``first_match``, the completion probability ``lost``."""

    def __init__(self, automaton: TokenAutomaton, rules: Decoding, opts: ShortestPath, stats: SearchStats,
                 budget: Shares, context: int, most: int):
        self.automaton, self.rules, self.opts, self.stats = automaton, rules, opts, stats
        self.budget = budget  # the query's memory shares: the search holds at most ``budget.traversal``
        self.context = context  # tokens the model reads at most
        self.most = most  # states remembered per cause of a cut
        self._finals: dict = {}     # state -> automaton.final_edits(state)
        self._continues: dict = {}  # state -> whether a token can follow it
        self._starts: dict = {}  # state -> whether a prefix path ends there (a completion may start)
        self._cut: dict = {c: [] for c in NO_ROW}  # the states of the first ``most`` nodes cut short, by cause
        # with first_match (probability()): the completion probability, summed over prefix paths, known
        # to fall outside the language within the bounds (``execute.bounds``); the language's
        # probability is at most (prefix paths) - lost at every point of the search
        self.lost = 0.0

    def held(self) -> int:
        """Bytes held by what the search remembers of automaton states (an estimate)."""
        return (len(self._finals) + len(self._continues)) * STATE_BYTES

    def stop(self, held: int, found: int) -> Optional[Stop]:
        """The bound that stops the search before its next model call, if one does (and the most
        bytes held, in ``stats.held``)."""
        opts, stats = self.opts, self.stats
        stats.held = max(stats.held, held)
        if opts.max_nodes is not None and stats.expanded >= opts.max_nodes:
            return Stop("max_nodes", opts.max_nodes, found)
        if opts.max_nodes_per_row is not None and stats.since_row >= opts.max_nodes_per_row:
            return Stop("max_nodes_per_row", opts.max_nodes_per_row, found)
        if opts.order == "total_prob" and stats.prefix >= opts.max_prefix_nodes:
            return Stop("max_prefix_nodes", opts.max_prefix_nodes, found)
        if held > self.budget.traversal:
            return Stop("max_memory", opts.max_memory, found)
        return None

    def check_prefix_paths(self) -> None:
        """Under ``prob``, refuse before the first model call a prefix whose token tree has more
        nodes than ``max_prefix_nodes``: each would be expanded before the first row."""
        if self.opts.order != "prob":
            return
        if self.automaton.prefix_nodes(self.opts.max_prefix_tokens, self.opts.max_prefix_nodes) is None:
            raise self.too_many_prefix_paths(f"more than {self.opts.max_prefix_nodes:,}")

    def too_many_prefix_paths(self, count: str) -> ExecutionError:
        return ExecutionError(
            f"ORDER BY prob needs the distribution after every prefix, and the "
            f"{'strings' if self.automaton.canonical[0] else 'tokenizations'} of this prefix "
            f"make {count} token sequences to read first (max_prefix_nodes is {self.opts.max_prefix_nodes:,})",
            hint="use ORDER BY total_prob (it reads only the likely tokenizations of the prefix), " + (
                "or a narrower PREFIX: it matches many strings (text with characters such as . ? ( ) read as "
                "itself is written escape('...'))" if self.automaton.canonical[0] else
                "a canonical prefix tokenization, or a narrower PREFIX"))

    def final_edits(self, state: int) -> int:
        """``automaton.final_edits(state)``, remembered (a search meets each state many times)."""
        got = self._finals.get(state)
        if got is None:
            got = self._finals[state] = self.automaton.final_edits(state)
        return got

    def stops(self, state: int) -> bool:
        """With ``first_match``: the generation begins with a string of the language here, so the
        search goes no further (only on to other prefixes)."""
        return self.opts.first_match and not self.rules.eos and self.final_edits(state) >= 0

    def expandable(self, node: Node) -> bool:
        """Whether a node can have a child or, with ``eos``, a result that needs its distribution."""
        automaton, opts, state = self.automaton, self.opts, node.state
        if 1 + node.npre + node.ncomp > self.context:  # its tokens (and the start token) fill the model's context
            self.cut("context" if node.ncomp else "prefix_context", [state])
            return False
        if self.rules.eos and self.final_edits(state) >= 0:
            return True
        if node.ncomp >= opts.max_tokens and node.npre >= opts.max_prefix_tokens:
            if not self.stops(state):  # (with first_match, what follows a string does not count)
                self.cut("max_tokens", [state])
                self.cut("max_prefix_tokens", [state])
            return False
        if self.stops(state):
            # (a completion read no prefix token after it: its arcs, costly in a wide language, are not read)
            return not node.ncomp and node.npre < opts.max_prefix_tokens and automaton.arcs(state).n_prefix > 0
        got = self._continues.get(state)
        if got is None:
            # rules that keep a few tokens read a new state's arcs for those alone (arcs_of)
            got = self._continues[state] = (automaton.may_continue(state) if self.rules.truncates
                                            else len(automaton.arcs(state)) > 0)
        return got

    def cut(self, cause: str, states: List[int]) -> None:
        """Remember ``states`` as those of nodes cut short by ``cause``: the first ``most`` distinct
        ones that a token may follow (a cheap test; whether the language goes on the way the cause
        blocked is checked once the search is exhausted), or for ``eos``, whose token is the one
        cut, any. A string that ends where nothing follows, as many do under ``eos``, takes no
        place otherwise."""
        kept = self._cut[cause]
        for s in states:
            if len(kept) >= self.most:
                return
            if s not in kept and (cause == "eos" or self.automaton.may_continue(s)):
                kept.append(s)

    def cutting(self, cause: str) -> bool:
        """Whether ``cause`` still has room for states cut short."""
        return len(self._cut[cause]) < self.most

    def went_on(self, asked) -> Tuple[str, ...]:
        """The causes (``NO_ROW``, less those ``asked``) that cut a way on short: a state with an
        arc of the kind it could not take (BPE's rules may leave a canonical state that the byte
        automaton reads on from with none)."""
        arcs = self.automaton.arcs

        def completes(s: int) -> bool:
            return bool((~arcs(s).prefix).any())

        def reads_on(s: int) -> bool:
            return len(arcs(s)) > 0
        goes_on = {"rules": completes, "eos": lambda s: True, "max_tokens": completes,
                   "max_prefix_tokens": lambda s: arcs(s).n_prefix > 0, "prefix_context": reads_on,
                   "context": reads_on}
        return tuple(c for c in NO_ROW if c not in asked and any(goes_on[c](s) for s in self._cut[c]))

    def completes(self, node: Node) -> bool:
        """Whether ``node`` carries completion probability: a completion token read, or a prefix path
        ending at it."""
        if node.ncomp:
            return True
        got = self._starts.get(node.state)
        if got is None:
            got = self._starts[node.state] = bool(self.automaton._ends_here(node.state, True))
        return got

    def lose(self, node: Node, share: float) -> None:
        """``share`` of ``node``'s completion probability is known to fall outside the language."""
        if self.completes(node):
            self.lost += math.exp(node.cond) * share

    def lose_outside(self, nodes: List[Node], fresh: np.ndarray, owner: np.ndarray, scores: np.ndarray,
                     eos_rule: Optional[np.ndarray]) -> None:
        """What each node just read for the first time (``fresh``) leaves out of the language: all but
        its kept completion children (``owner``: the node of each, ``scores``: their log-probabilities)
        and, under eos where it ends a string, its end of text."""
        share = np.bincount(owner, weights=np.exp(scores), minlength=len(nodes))
        for b in np.flatnonzero(fresh).tolist():
            node = nodes[b]
            if self.stops(node.state):  # a string: its probability is a result's
                continue
            ends = eos_rule is not None and self.final_edits(node.state) >= 0 and eos_rule[b] > -math.inf
            self.lose(node, 1.0 - share[b] - (math.exp(eos_rule[b]) if ends else 0.0))
