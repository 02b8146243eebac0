"""Exact best-first search: the strings of a token automaton in order of probability.

The search tree's nodes are token sequences. A node's cost is -log of the probability being
ranked: the completion's, given the prefix ("prob"), or the whole sequence's ("total_prob").
Costs never decrease along a path, so a result is certain once nothing cheaper is left.

- Children are enumerated lazily: an expanded node keeps its children sorted by cost and only
  its next-best child sits in the priority queue, so a node with 50,000 children costs one
  queue entry, not 50,000 (children beyond a chunk are recomputed only if ever needed).
- Up to ``batch_size`` nodes are expanded per model call (more, up to ``max_batch_size``, while
  rows are far apart); a result is released only when every node cheaper than it has been
  expanded, so batching never changes the order.
- A node's distribution costs one token through the model: its parent's keys and values are
  reused (``LanguageModel.extend``), so the prefix is read once.
- Order "prob": prefix tokens are given, so every prefix's distribution is needed before the
  first row is certain. Prefix nodes are therefore expanded first, most probable prefix first,
  in batches; then completion nodes by the completion's probability.
"""

from __future__ import annotations

import heapq
import itertools
import math
import sys
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Generator, Iterator, List, Optional, Tuple

import numpy as np
import torch

from ..automata.tokens import TokenAutomaton
from ..memory import shares
from ..models.base import LanguageModel, ModelState
from ..records import Cancelled, Decoding, ExecutionError, ShortestPath, Stop
from .decoding import RuleScores, batch_limit
from .prefixtree import prefix_chains
from .rows import Row, make_row

CHUNK = 256  # children kept per node; more are recomputed when needed
NODE_BYTES = 400  # a search node and its queue entry, as Python objects (measured: about 330)
SEQ_BYTES = 84, 8  # an expanded node's token tuple: a tuple and its token's int, and 8 bytes a token
STATE_BYTES = 100  # what a search remembers of an automaton state it met (a dict entry)

CHILD, RESULT, MORE = 0, 1, 2  # kinds of queue entries (see ShortestPathSearch)
# a node's stored children, sorted by (tier, val): its queue key is (tier, val)
KID = np.dtype([("token", np.int64), ("state", np.int64), ("prefix", bool), ("raw", np.float64),
                ("rule", np.float64), ("tier", np.int8), ("val", np.float64)])
ONE_SORT = 1 << 16  # up to this many children in a batch are sorted at once, more node by node
CUT = 64  # nodes cut short, per cause, that a search looks at again once exhausted (ShortestPathSearch._cut)
# why a search may end with no row, or with fewer than its language holds (SearchStats.no_row, .cut)
NO_ROW = ("rules", "eos", "max_tokens", "max_prefix_tokens", "prefix_context", "context")


class _Node:
    __slots__ = ("parent", "token", "state", "prefix", "npre", "ncomp", "pre_raw", "cond", "key", "cache",
                 "seq", "kids", "more")

    def __init__(self, parent, token, state, prefix, npre, ncomp, pre_raw, cond, key):
        self.parent, self.token, self.state, self.prefix = parent, token, state, prefix
        self.npre, self.ncomp, self.pre_raw, self.cond, self.key = npre, ncomp, pre_raw, cond, key
        self.cache = None   # the model's KV block for this node's tokens
        self.seq = None     # once expanded: every token read, the start-of-text token first (the
        #                     model's own tuple, kept so that children need not walk the path)
        self.kids = None    # the stored children (a KID array, sorted by key); dropped once all are
        #                     in the queue
        self.more = 0       # where the next chunk of children starts, 0 when there is none

    def tokens(self) -> List[int]:
        out, n = [], self
        while n is not None and n.token is not None:
            out.append(n.token)
            n = n.parent
        out.reverse()
        return out


@dataclass
class SearchStats:
    """Nodes expanded (each costs the model one token: the start-of-text token for the root),
    how many of them were prefix nodes, rows released, the most bytes the search held in its
    queue and stored children (estimated before each model call), the ``Stop`` when a bound
    ended the search with the language not exhausted, and ``no_row``: why a search that ended with
    no row found none, or, where a bound stopped it first, what had cut ways short by then
    (``NO_ROW``: the decoding rules kept none of the tokens the language allowed
    next, or, under ``eos``, ruled out the end-of-text token where a string ended; a completion
    or a prefix reached ``max_tokens`` or ``max_prefix_tokens``, or the text the model's
    context length, where the language went on: ``prefix_context`` where no completion token had
    been read yet, ``context`` where some had); ``cut``: the bounds among those
    that cut a way on short in a search that exhausted its language with rows (its rows are
    every string within the bounds, not every string of the language). ``row_at``: nodes expanded
    when the last row was released (0 before the first; a reader that drops the row, as WHERE
    does, sets it back, so that ``max_nodes_per_row`` counts from the last row kept);
    ``watch(stats, opts)``, when given, is called after each model call (a progress display).
    ``fewest``: where no string of the language fits in ``max_tokens`` (``no_row`` is then
    ``("max_tokens",)`` and the search made no model call), a lower bound on the tokens each takes.
    ``floor``: where a local estimate over every tokenization fell below it, the probability of
    its strings' canonical tokenizations (``measure.canonical_floor``)."""
    expanded: int = 0
    prefix: int = 0
    rows: int = 0
    row_at: int = 0
    held: int = 0
    stop: Optional[Stop] = None
    no_row: Tuple[str, ...] = ()
    cut: Tuple[str, ...] = ()
    fewest: Optional[int] = None
    floor: Optional[float] = None
    watch: Optional[Callable[["SearchStats", ShortestPath], None]] = field(default=None, repr=False, compare=False)

    @property
    def stopped(self) -> bool:
        return self.stop is not None


def first_sorted(tier: np.ndarray, val: np.ndarray, n: int) -> np.ndarray:
    """``np.lexsort((val, tier))[:n]`` (ties in position order) without sorting the rest: each
    tier's smallest values are found by ``np.partition``, tier by tier, and only those sorted
    (a node with 49,152 children stores 256)."""
    if len(val) <= 2 * n:
        return np.lexsort((val, tier))[:n]
    picked, left = [], n
    for t in np.unique(tier).tolist():
        at = np.flatnonzero(tier == t)
        if len(at) > left:
            v = val[at]
            cut = np.partition(v, left - 1)[left - 1]
            if np.isnan(cut):
                return np.lexsort((val, tier))[:n]
            below = at[v < cut]
            at = np.concatenate([below, at[v == cut][:left - len(below)]])
        picked.append(at)
        left -= len(at)
        if not left:
            break
    at = np.sort(np.concatenate(picked))  # in position order: the stable sort keeps ties so
    return at[np.lexsort((val[at], tier[at]))]


def stacked(states: List[ModelState]) -> torch.Tensor:
    """The states' next-token log-probabilities as one ``[batch, vocab]`` tensor: a view of the
    one they are consecutive rows of, when a single model call made them, else a copy."""
    first = states[0].logprobs
    n = first.shape[0]
    ptr, off = first.untyped_storage().data_ptr(), first.storage_offset()
    if first.stride() == (1,) and all(s.logprobs.untyped_storage().data_ptr() == ptr and s.logprobs.stride() == (1,)
                                      and s.logprobs.storage_offset() == off + i * n for i, s in enumerate(states)):
        return first.as_strided((len(states), n), (n, 1))
    return torch.stack([s.logprobs for s in states])


def shortest_path(automaton: TokenAutomaton, model: LanguageModel, rules: Decoding, opts: ShortestPath,
                  cancel: Optional[threading.Event] = None, stats: Optional[SearchStats] = None) -> Iterator[Row]:
    """Rows in non-increasing order of ``opts.order``, exactly, as soon as each is certain."""
    yield from ShortestPathSearch(automaton, model, rules, opts, stats).rows(cancel)


class ShortestPathSearch:
    """One exact best-first search and its state: the priority ``queue`` of entries ``(tier, val,
    tie, kind, node, arg)``, the key ``(tier, val)`` spread out so that comparing entries compares
    no inner tuple (kind CHILD: ``arg`` is ``(i, row)``, child ``i`` of the stored children of
    ``node`` and its fields as a tuple, read once; MORE: the
    chunk of ``node``'s children from ``arg`` on, to be made again; RESULT: ``node``'s string,
    with ``arg`` edits), the ``batch`` of ``(chain, first child)`` that the next model call
    expands, and what the bounds read: nodes made, bytes of stored children, rows ``found``."""

    def __init__(self, automaton: TokenAutomaton, model: LanguageModel, rules: Decoding, opts: ShortestPath,
                 stats: Optional[SearchStats] = None):
        self.automaton, self.model = automaton, model
        self.rules, self.opts = rules.check(), opts.check()
        cap = batch_limit(self.rules, len(model.vocabulary), self.opts.max_memory)
        self.opts = replace(self.opts, batch_size=min(self.opts.batch_size, cap),
                            max_batch_size=self.opts.max_batch_size and min(self.opts.max_batch_size, cap))
        self.stats = stats if stats is not None else SearchStats()
        self.budget = shares(self.opts.max_memory)
        model.set_cache_budget(self.budget.kv)
        automaton.set_cache_budget(self.budget.automaton)
        self.by_prob = self.opts.order == "prob"
        self.context = getattr(model, "max_length", None) or sys.maxsize  # tokens the model reads at most
        # a grown call's next-token scores (float32 logits and log-probabilities) stay within a
        # quarter of the search's share of max_memory
        grow = min(self.opts.max_batch_size or self.opts.batch_size,
                   self.budget.traversal // 4 // (8 * len(model.vocabulary)))
        self.max_batch = max(self.opts.batch_size, grow)
        self.queue: list = []
        self.batch: list = []
        self.found = 0            # rows released
        self.prefix_expanded = 0  # prefix nodes (and the root) expanded
        self.kid_bytes = 0        # stored children
        self._bases: dict = {}    # id of an array of stored children -> [nodes holding a view, the array]
        self.seq_bytes = 0        # expanded nodes' token tuples
        self.nodes = 0            # nodes made (an upper bound on those alive)
        self._tie = itertools.count()
        self._finals: dict = {}     # state -> automaton.final_edits(state)
        self._continues: dict = {}  # state -> whether a token can follow it
        self._cut: dict = {c: [] for c in NO_ROW}  # the states of the first CUT nodes cut short, by cause
        # with first_match (probability()): the completion probability, summed over prefix paths, known
        # to fall outside the language within the bounds (``execute.bounds``); the language's
        # probability is at most (prefix paths) - lost at every point of the search
        self.lost = 0.0
        self._starts: dict = {}  # state -> whether a prefix path ends there (a completion may start)

    def rows(self, cancel: Optional[threading.Event] = None) -> Iterator[Row]:
        """The rows in order, until the language is exhausted, the limit is reached or a bound
        stops the search (``stats.stop``)."""
        if self.opts.limit == 0:
            return
        self.check_prefix_paths()
        need = self.automaton.too_long(self.opts.max_tokens)
        if need is not None:  # no string fits: known at once, where the search would run into a bound
            self.stats.no_row, self.stats.fewest = ("max_tokens",), need
            return
        self.consider(_Node(None, None, self.automaton.start, True, 0, 0, 0.0, 0.0, self.node_key(0.0, 0.0, True)))
        while self.batch or self.queue:
            if cancel is not None and cancel.is_set():
                raise Cancelled("the query was cancelled")
            if (yield from self.fill(cancel)):
                return
            if self.batch:
                stop = self.bound()
                if stop is not None:
                    self.stats.stop = stop  # a budget, not an order: rows released so far are exact
                    if not self.found:  # what had cut ways short may be why none was found (max_tokens 5
                        self.stats.no_row = self.went_on(())  # of a language of 200-letter strings)
                    return
                self.expand()
                if self.stats.watch is not None:
                    self.stats.watch(self.stats, self.opts)
        # the language is exhausted under the rules and bounds. With rows, the rules' cuts are
        # what was asked for
        if self.found:
            self.stats.cut = self.went_on(("rules", "eos"))
        else:
            self.stats.no_row = self.went_on(())

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

    def fill(self, cancel: Optional[threading.Event] = None) -> Generator[Row, None, bool]:
        """Take entries from the queue until the batch is full: release the results nothing in the
        batch is cheaper than, as rows, and put nodes in the batch. True once the limit is reached."""
        opts, queue = self.opts, self.queue
        held = []
        size = self.batch_target()
        pop, batch = heapq.heappop, self.batch
        while queue and len(batch) < size:
            entry = queue[0]
            if entry[3] == CHILD:
                node, (i, row) = entry[4], entry[5]
                self.next_sibling(node, i)  # takes the entry's place in the queue
                self.consider(self.materialize(node, row))
                continue
            entry = pop(queue)
            _, val, _, kind, node, arg = entry
            if kind == RESULT:
                if batch or held:
                    # cheaper nodes in the batch must be expanded first; meanwhile fill the batch
                    # with the next nodes (the model call costs about the same)
                    held.append(entry)
                    continue
                if cancel is not None and cancel.is_set():
                    raise Cancelled("the query was cancelled")
                cond = -val if self.by_prob else -val - node.pre_raw
                row = make_row(self.model.vocabulary, node.tokens(), node.npre, cond, node.pre_raw + cond, arg,
                               self.found + 1, context=self.model.context)
                self.found += 1  # counted before the row goes out: its reader may take it back (stats.row_at)
                self.stats.rows = self.found
                self.stats.row_at = self.stats.expanded
                yield row
                if opts.limit is not None and self.found >= opts.limit:
                    return True
                continue
            batch.append(([node], arg))  # MORE
        for entry in held:
            heapq.heappush(queue, entry)
        return False

    def batch_target(self) -> int:
        """Nodes for the next model call: ``batch_size``, or with ``max_batch_size`` a quarter of
        the nodes expanded since the last row when that is more (a wide search, such as every
        edit of a prefix, needs thousands of nodes per row, and a model call costs less per node
        with more of them; a narrow one keeps small calls, which read few nodes past its next
        row), never past a node bound that a ``batch_size`` call would not pass nor with scores
        larger than a quarter of the search's memory share."""
        opts = self.opts
        if self.max_batch == opts.batch_size:
            return opts.batch_size
        since = self.stats.expanded - self.stats.row_at
        size = min(self.max_batch, since // 4)
        if opts.max_nodes is not None:
            size = min(size, opts.max_nodes - self.stats.expanded)
        if opts.max_nodes_per_row is not None:
            size = min(size, opts.max_nodes_per_row - since)
        return max(opts.batch_size, size)

    def node_key(self, pre_raw: float, cond: float, prefix_phase: bool) -> tuple:
        """The queue key of a node: prefix nodes first under ``prob``."""
        if self.by_prob:
            return (0, -pre_raw) if prefix_phase else (1, -cond)
        return (0, -(pre_raw + cond))

    def result_key(self, pre_raw: float, cond: float) -> tuple:
        """The queue key of a result."""
        return (1, -cond) if self.by_prob else (0, -(pre_raw + cond))

    def push(self, key: tuple, kind: int, node: _Node, arg=0) -> None:
        """Queue an entry (ties go first in, first out)."""
        heapq.heappush(self.queue, (key[0], key[1], next(self._tie), kind, node, arg))

    def held(self) -> int:
        """Bytes held by the queue, the stored children, the nodes made and the expanded ones' token
        tuples and what it remembers of automaton states (an estimate)."""
        return (self.kid_bytes + self.seq_bytes + (self.nodes + len(self.queue)) * NODE_BYTES
                + (len(self._finals) + len(self._continues)) * STATE_BYTES)

    def child_entry(self, node: _Node, i: int, row: Optional[tuple] = None) -> tuple:
        """The queue entry of stored child ``i`` of ``node`` (``row``: that child as a tuple, if
        read already)."""
        if row is None:
            row = node.kids[i].tolist()
        return row[5], row[6], next(self._tie), CHILD, node, (i, row)

    def materialize(self, parent: _Node, row: tuple) -> _Node:
        """A stored child of ``parent``, given as a tuple of its fields, as a node."""
        tok, state, is_pre, raw, rule, tier, val = row
        self.nodes += 1
        return _Node(parent, tok, state, is_pre, parent.npre + is_pre, parent.ncomp + (not is_pre),
                     parent.pre_raw + (raw if is_pre else 0.0), parent.cond + (0.0 if is_pre else rule), (tier, val))

    def store_kids(self, node: _Node, kids) -> None:
        """Replace a node's stored children (None: drop them), keeping ``kid_bytes``: the bytes of
        the arrays they are views of (a batch's children are one array, each node's a slice of
        it), counted while any node holds a view of one."""
        old = node.kids
        if old is not None:
            base = old if old.base is None else old.base
            held = self._bases[id(base)]
            held[0] -= 1
            if not held[0]:
                del self._bases[id(base)]
                self.kid_bytes -= base.nbytes
        node.kids = kids
        if kids is not None:
            base = kids if kids.base is None else kids.base
            held = self._bases.get(id(base))
            if held is None:
                self._bases[id(base)] = [1, base]
                self.kid_bytes += base.nbytes
            else:
                held[0] += 1

    def next_sibling(self, parent: _Node, i: int) -> None:
        """Child ``i`` of ``parent``, first in the queue, leaves it: the next one takes its place
        (one sift of the heap, not two), or the next chunk is queued."""
        if i + 1 < len(parent.kids):
            heapq.heapreplace(self.queue, self.child_entry(parent, i + 1))
            return
        heapq.heappop(self.queue)
        if parent.more:  # made again, from the next chunk on, if ever needed
            self.push(tuple(parent.kids[i].tolist()[5:7]), MORE, parent, parent.more)
        self.store_kids(parent, None)  # every child is in the queue or expanded, or will be made again

    def cut(self, cause: str, states: List[int]) -> None:
        """Remember ``states`` as those of nodes cut short by ``cause``: the first CUT distinct ones
        that a token may follow (a cheap test; whether the language goes on the way the cause
        blocked is checked once the search is exhausted), or for ``eos``, whose token is the one
        cut, any. A string that ends where nothing follows, as many do under ``eos``, takes no
        place otherwise."""
        kept = self._cut[cause]
        for s in states:
            if len(kept) >= CUT:
                return
            if s not in kept and (cause == "eos" or self.automaton.may_continue(s)):
                kept.append(s)

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

    def expandable(self, node: _Node) -> bool:
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

    def forced(self, node: _Node):
        """The token and state of a prefix node's only way on, if it has exactly one, the text
        cannot end at it and the token fits the model's context."""
        return self._only_way(node) if 2 + node.npre <= self.context else None

    def _only_way(self, node: _Node):
        automaton = self.automaton
        if not node.prefix or node.npre >= self.opts.max_prefix_tokens or self.final_edits(node.state) >= 0:
            return None
        arcs = automaton.arcs(node.state)
        if len(arcs) != 1 or not arcs.prefix[0]:
            return None
        return int(arcs.tokens[0]), int(arcs.targets[0])

    def past_context(self, node: _Node) -> bool:
        """Whether a prefix node's only way on does not fit the model's context: nothing below it
        can be read, so neither it nor the forced chain to it is (a prompt longer than the context
        is refused before any model call)."""
        if 2 + node.npre <= self.context or self._only_way(node) is None:
            return False
        self.cut("prefix_context", [node.state])
        return True

    def consider(self, node: _Node) -> None:
        """A node just taken from the queue: queue its result (without eos) and put its expansion
        in the batch, through any chain of forced prefix tokens below it (one model call for all)."""
        if not self.rules.eos:
            edits = self.final_edits(node.state)
            if edits >= 0:
                self.push(self.result_key(node.pre_raw, node.cond), RESULT, node, edits)
        # Under prob every prefix node is read before the first row: a forced chain is read whole, in
        # one call. Under total_prob its later tokens may cost more than the rows found by then (an
        # edit that makes the rest of the prefix improbable): it is read whole only when nothing else
        # waits (a long prompt, read at once), else token by token, best first like the rest
        whole = node.prefix and (self.by_prob or not (self.queue or self.batch))
        if whole and self.by_prob and node.parent is None:
            chains = prefix_chains(self.automaton, node, self.prefix_child, lambda s: self.final_edits(s) >= 0,
                                   self.opts.max_prefix_tokens, self.context, self.opts.batch_size)
            if chains is not None:
                self.batch.extend((chain, 0) for chain in chains)
                return
        step = self.forced(node) if whole else None
        if step is None:
            if not (whole and self.past_context(node)) and self.expandable(node):
                self.batch.append(([node], 0))
            elif self.opts.first_match and not (not self.rules.eos and self.final_edits(node.state) >= 0):
                self.lose(node, 1.0)  # neither a string nor read on: outside the language within the bounds
            return
        chain = [node]
        while step is not None:
            nxt = _Node(chain[-1], step[0], step[1], True, chain[-1].npre + 1, 0, chain[-1].pre_raw, 0.0, None)
            chain.append(nxt)
            step = self.forced(nxt)
        if self.past_context(chain[-1]):
            return
        if len(chain) > 1 or self.expandable(node):
            self.batch.append((chain, 0))  # a chain is read even to its end, for its probabilities

    def completes(self, node: _Node) -> bool:
        """Whether ``node`` carries completion probability: a completion token read, or a prefix path
        ending at it."""
        if node.ncomp:
            return True
        got = self._starts.get(node.state)
        if got is None:
            got = self._starts[node.state] = bool(self.automaton._ends_here(node.state, True))
        return got

    def lose(self, node: _Node, share: float) -> None:
        """``share`` of ``node``'s completion probability is known to fall outside the language."""
        if self.completes(node):
            self.lost += math.exp(node.cond) * share

    def lose_outside(self, nodes: List[_Node], fresh: np.ndarray, owner: np.ndarray, scores: np.ndarray,
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

    def prefix_child(self, parent: _Node, token: int, state: int) -> _Node:
        """A child on a prefix token, its probability to be read with the chain it ends."""
        self.nodes += 1
        return _Node(parent, token, state, True, parent.npre + 1, 0, parent.pre_raw, 0.0, None)

    def expand(self) -> None:
        """One model call for the batch: queue each node's results with ``eos`` and its best child,
        keeping a chunk of its children sorted."""
        automaton, model, rules, opts, stats = self.automaton, self.model, self.rules, self.opts, self.stats
        eos = model.eos_id
        parents, toks_in = [], []
        for chain, _ in self.batch:
            head = chain[0]
            if len(chain) == 1:
                toks_in.append([head.token] if head.token is not None else [])
            else:
                toks_in.append([n.token for n in chain if n.token is not None])
            p = head.parent
            parents.append(None if p is None else ModelState(
                p.seq if p.seq is not None else (*model.start_tokens, *p.tokens()), None, None, p.cache))
        outs = model.extend(parents, toks_in)
        # each node of the batch (the last of its chain) in one pass: what the arrays below read
        nodes, chunks, states, fields = [], [], [], []
        fixed, per_token = SEQ_BYTES
        counted = set()  # the chains of a prefix tree share their first nodes: each is counted once
        for (chain, chunk), out in zip(self.batch, outs):
            node = chain[-1]
            new = [n for n in chain if id(n) not in counted]
            if len(outs) > 1 and len(chain) > 1:
                counted.update(id(n) for n in chain)
            if chunk == 0:
                stats.expanded += len(new)
                self.prefix_expanded += node.prefix or node.parent is None
            if len(chain) > 1:  # forced prefix tokens read in one go: their probabilities
                for n, lp in zip(chain[1:], out.token_logprobs[-(len(chain) - 1):]):
                    n.pre_raw = n.parent.pre_raw + float(lp)
                    n.key = self.node_key(n.pre_raw, 0.0, True)
                self.prefix_expanded += len(new) - 1
                if not rules.eos:
                    edits = self.final_edits(node.state)
                    if edits >= 0:
                        self.push(self.result_key(node.pre_raw, 0.0), RESULT, node, edits)
            if node.cache is None:
                node.cache, node.seq = out.cache, out.tokens
                self.seq_bytes += fixed + per_token * len(out.tokens)
            nodes.append(node)
            chunks.append(chunk)
            states.append(node.state)
            fields.append((node.npre < opts.max_prefix_tokens,
                           node.ncomp < opts.max_tokens and not self.stops(node.state), node.pre_raw, node.cond))
        batch = list(zip(nodes, chunks))
        self.batch = []
        raw = stacked(outs)
        scores = RuleScores(raw, rules)
        # every node's candidate children at once: (node, token, target, is prefix), their scores
        rows_idx, cols, targets, pre = automaton.arcs_of(states, scores.kept)
        raw_all, rule_all = scores.pick(rows_idx, cols)
        if rules.eos:
            every = torch.arange(len(batch), device=raw.device)
            eos_rule = scores.at(every, torch.full_like(every, eos)).double().cpu().numpy()
        # the children each node may have, keyed: prefix tokens by the prefix's probability (first,
        # under prob), completion tokens by the completion's (or the whole text's, under total_prob)
        pre_ok, comp_ok, base_pre, base_cond = (np.array(x) for x in zip(*fields))
        # the kept children's keys; their other fields are read only for the children stored (a
        # node of a wide language has tens of thousands, of which a chunk is stored)
        kept = np.flatnonzero(np.where(pre, pre_ok[rows_idx], (rule_all > -math.inf) & comp_ok[rows_idx]))
        r, pre_k = rows_idx[kept], pre[kept]
        on_prefix = np.flatnonzero(pre_k)
        if self.by_prob:
            tier = (~pre_k).astype(np.int8)
            val = base_cond[r]
            val += rule_all[kept]
            val[on_prefix] = base_pre[r[on_prefix]] + raw_all[kept[on_prefix]]
        else:
            tier = np.zeros(len(r), np.int8)
            step = rule_all[kept]
            step[on_prefix] = raw_all[kept[on_prefix]]
            val = base_pre[r] + base_cond[r]
            val += step
        np.negative(val, out=val)
        count = np.bincount(r, minlength=len(batch))
        first = np.cumsum(count) - count
        one_sort = len(r) <= ONE_SORT
        chunks = np.array(chunks)
        fresh = chunks == 0
        long = ~comp_ok  # at max_tokens, or at a string that stops the search (first_match), which cuts nothing
        if opts.first_match:
            long &= np.array([not self.stops(s) for s in states], bool)
        for cause, cut in (("rules", (count == 0) & comp_ok & rules.truncates), ("max_tokens", long),
                           ("max_prefix_tokens", ~pre_ok)):
            if len(self._cut[cause]) < CUT and (cause != "rules" or not self.found):  # with rows, asked for
                self.cut(cause, [states[i] for i in np.flatnonzero(fresh & cut).tolist()])

        def kid_array(at: np.ndarray) -> np.ndarray:
            """The kept children at positions ``at``, as a KID array."""
            out, arc = np.empty(len(at), KID), kept[at]
            for name, column in zip(KID.names[:5], (cols, targets, pre, raw_all, rule_all)):
                out[name] = column[arc]
            out["tier"], out["val"] = tier[at], val[at]
            return out

        if opts.first_match:
            comp = ~pre_k
            self.lose_outside(nodes, fresh, r[comp], rule_all[kept[comp]], eos_rule if rules.eos else None)
        starts = first + chunks  # where each node's stored children begin
        if one_sort:  # one sort for the batch: by node, then key (stable: ties keep arc order)
            kids = kid_array(np.lexsort((val, tier, r)))
            heads = iter(kids[starts[count > chunks]].tolist())  # each node's first stored child
        counts, starts, first = count.tolist(), starts.tolist(), first.tolist()
        for b, (node, chunk) in enumerate(batch):
            if chunk == 0 and rules.eos:
                edits = self.final_edits(node.state)
                if edits >= 0 and eos_rule[b] > -math.inf:
                    self.push(self.result_key(node.pre_raw, node.cond + eos_rule[b]), RESULT, node, edits)
                elif edits >= 0 and not self.found:  # a string whose end of text the rules rule out
                    self.cut("eos", [node.state])
            n = counts[b]
            if n <= chunk:
                continue
            if one_sort:
                mine, head = kids[starts[b]:first[b] + min(n, chunk + CHUNK)], next(heads)
            else:  # many children: only the chunk's are sorted and stored
                a, e = first[b], first[b] + n
                mine, head = kid_array(a + first_sorted(tier[a:e], val[a:e], chunk + CHUNK)[chunk:]), None
            self.store_kids(node, mine)
            node.more = chunk + CHUNK if chunk + CHUNK < n else 0
            heapq.heappush(self.queue, self.child_entry(node, 0, head))
        stats.prefix = self.prefix_expanded
        if self.by_prob and self.prefix_expanded > opts.max_prefix_nodes:
            raise self.too_many_prefix_paths(f"more than {opts.max_prefix_nodes:,}")

    def check_prefix_paths(self) -> None:
        """Under ``prob``, refuse before the first model call a prefix whose token tree has more
        nodes than ``max_prefix_nodes``: each would be expanded before the first row."""
        if not self.by_prob:
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

    def bound(self) -> Optional[Stop]:
        """The bound that stops the search before its next model call, if one does (and the most
        bytes held, in ``stats.held``)."""
        opts, stats = self.opts, self.stats
        held = self.held()
        stats.held = max(stats.held, held)
        if opts.max_nodes is not None and stats.expanded >= opts.max_nodes:
            return Stop("max_nodes", opts.max_nodes, self.found)
        if opts.max_nodes_per_row is not None and stats.expanded - stats.row_at >= opts.max_nodes_per_row:
            return Stop("max_nodes_per_row", opts.max_nodes_per_row, self.found)
        if held > self.budget.traversal:
            return Stop("max_memory", opts.max_memory, self.found)
        return None
