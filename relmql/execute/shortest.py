"""Exact best-first search: the strings of a token automaton in order of probability (design:
docs/executor.md, "Shortest path" and "Inside the search")."""

from __future__ import annotations

import heapq
import sys
import threading
from dataclasses import replace
from typing import Generator, Iterator, NamedTuple, Optional

from ..automata.tokens import TokenAutomaton
from ..memory import shares
from ..models.base import LanguageModel
from ..records import Cancelled, Decoding, ShortestPath, Stop
from .decoding import RuleScores, batch_limit
from .expansion import Expander, Read
from .frontier import ARG, CHILD, KIND, NODE, RESULT, Frontier, Node
from .ledger import Ledger, SearchStats
from .pipeline import Flight, pipelined
from .prefixtree import prefix_chains
from .rows import Row, make_row

ONE_SORT = 1 << 16  # up to this many children in a batch are sorted at once, more node by node (Expander)
CUT = 64  # nodes cut short, per cause, that a search looks at again once exhausted (Ledger.cut)


def shortest_path(automaton: TokenAutomaton, model: LanguageModel, rules: Decoding, opts: ShortestPath,
                  cancel: Optional[threading.Event] = None, stats: Optional[SearchStats] = None) -> Iterator[Row]:
    """Rows in non-increasing order of ``opts.order``, exactly, as soon as each is certain."""
    yield from ShortestPathSearch(automaton, model, rules, opts, stats).rows(cancel)


class Landed(NamedTuple):
    """A pipelined call taken in as far as the next call needs: its batch read, and its scores."""
    read: Read
    scores: RuleScores


class ShortestPathSearch:
    """One exact best-first search: it takes entries from its ``frontier`` (the priority queue and
    the children stored), releasing the results nothing cheaper is left before and gathering the
    ``batch`` of ``(chain, first child)`` that the next model call (its ``expander``) reads; its
    ``ledger`` holds the bounds and the accounts (states cut short, probability lost)."""

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
        self.batch: list = []
        self.flight: Optional[Flight] = None  # the model call in flight (pipelined)
        self.found = 0  # rows released
        self.frontier = Frontier(self.by_prob)
        self.ledger = Ledger(automaton, self.rules, self.opts, self.stats, self.budget, self.context, CUT)
        self.expander = Expander(automaton, model, self.rules, self.opts, self.stats, self.frontier, self.ledger,
                                 ONE_SORT)
        self.final_edits = self.ledger.final_edits  # (bound once: asked for every node)

    @property
    def queue(self) -> list:
        """The frontier's priority queue (``Frontier``)."""
        return self.frontier.queue

    @property
    def kid_bytes(self) -> int:
        """Bytes of the children stored."""
        return self.frontier.kid_bytes

    def rows(self, cancel: Optional[threading.Event] = None) -> Iterator[Row]:
        """The rows in order, until the language is exhausted, the limit is reached or a bound
        stops the search (``stats.stop``)."""
        if self.opts.limit == 0:
            return
        self.ledger.check_prefix_paths()
        need = self.automaton.too_long(self.opts.max_tokens)
        if need is not None:  # no string fits: known at once, where the search would run into a bound
            self.stats.no_row, self.stats.fewest = ("max_tokens",), need
            return
        root_key = self.frontier.node_key(0.0, 0.0, True)
        self.consider(Node(None, None, self.automaton.start, True, 0, 0, 0.0, 0.0, root_key))
        self.flight = Flight(self.model, self.rules) if pipelined(self.opts, self.model) else None
        try:
            yield from self.search(cancel)
        finally:
            if self.flight is not None:
                self.flight.close()

    def search(self, cancel: Optional[threading.Event]) -> Iterator[Row]:
        """The loop of ``rows``: fill the batch, expand it; pipelined, the next batch is filled and
        the last call's results taken in while a model call is in flight."""
        flight = self.flight
        while self.batch or self.frontier.queue or (flight is not None and flight.busy):
            if cancel is not None and cancel.is_set():
                raise Cancelled("the query was cancelled")
            if (yield from self.fill(cancel)):
                return
            landed = self.land() if flight is not None and flight.busy else None
            if self.batch:
                stop = self.bound()
                if stop is not None:
                    if landed is not None:  # taken in, as the serial search takes in its last call
                        self.expander.absorb(landed.read, self.found, landed.scores)
                    self.stats.stop = stop  # a budget, not an order: rows released so far are exact
                    if not self.found:  # what had cut ways short may be why none was found (max_tokens 5
                        self.stats.no_row = self.ledger.went_on(())  # of a language of 200-letter strings)
                    return
                if flight is None:
                    self.expand()
                else:
                    batch, self.batch = self.batch, []
                    flight.start(self.expander.send(batch))
            if landed is not None:
                self.expander.absorb(landed.read, self.found, landed.scores)
            if self.stats.watch is not None and (flight is None or landed is not None):
                self.stats.watch(self.stats, self.opts)
        # the language is exhausted under the rules and bounds. With rows, the rules' cuts are
        # what was asked for
        if self.found:
            self.stats.cut = self.ledger.went_on(("rules", "eos"))
        else:
            self.stats.no_row = self.ledger.went_on(())

    def land(self) -> Landed:
        """The call in flight, once made, taken in as far as the next call needs (its nodes' keys
        and values), with its scores: its children are stored while the next call is in flight."""
        sent, outs, scores = self.flight.land()
        read = self.expander.receive(sent, outs)
        self.count_prefixes()
        return Landed(read, scores)

    def fill(self, cancel: Optional[threading.Event] = None) -> Generator[Row, None, bool]:
        """Take entries from the queue until the batch is full: release the results nothing in the
        batch is cheaper than, as rows, and put nodes in the batch. True once the limit is reached."""
        opts, frontier = self.opts, self.frontier
        queue = frontier.queue
        held = []
        size = self.batch_target()
        pop, batch = heapq.heappop, self.batch
        while queue and len(batch) < size:
            entry = queue[0]
            if entry[KIND] == CHILD:
                node, (i, row) = entry[NODE], entry[ARG]
                frontier.next_sibling(node, i)  # takes the entry's place in the queue
                self.consider(frontier.materialize(node, row))
                continue
            entry = pop(queue)
            _, val, _, kind, node, arg = entry
            if kind == RESULT:
                if not (batch or held) and self.flight is not None and self.flight.busy:
                    heapq.heappush(queue, entry)  # released once the call in flight is taken in, if still first
                    break
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
                self.stats.row_at, self.stats.prefix_at = self.stats.expanded, self.stats.prefix
                yield row
                if opts.limit is not None and self.found >= opts.limit:
                    return True
                continue
            batch.append(([node], arg))  # MORE: the next chunk of node's children, made again
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
            size = min(size, opts.max_nodes_per_row - self.stats.since_row)
        return max(opts.batch_size, size)

    def forced(self, node: Node):
        """The token and state of a prefix node's only way on, if it has exactly one, the text
        cannot end at it and the token fits the model's context."""
        return self._only_way(node) if 2 + node.npre <= self.context else None

    def _only_way(self, node: Node):
        automaton = self.automaton
        if not node.prefix or node.npre >= self.opts.max_prefix_tokens or self.final_edits(node.state) >= 0:
            return None
        arcs = automaton.arcs(node.state)
        if len(arcs) != 1 or not arcs.prefix[0]:
            return None
        return int(arcs.tokens[0]), int(arcs.targets[0])

    def past_context(self, node: Node) -> bool:
        """Whether a prefix node's only way on does not fit the model's context: nothing below it
        can be read, so neither it nor the forced chain to it is (a prompt longer than the context
        is refused before any model call)."""
        if 2 + node.npre <= self.context or self._only_way(node) is None:
            return False
        self.ledger.cut("prefix_context", [node.state])
        return True

    def consider(self, node: Node) -> None:
        """A node just taken from the queue: queue its result (without eos) and put its expansion
        in the batch, through any chain of forced prefix tokens below it (one model call for all)."""
        if not self.rules.eos:
            edits = self.final_edits(node.state)
            if edits >= 0:
                self.frontier.push(self.frontier.result_key(node.pre_raw, node.cond), RESULT, node, edits)
        # Under prob every prefix node is read before the first row: a forced chain is read whole, in
        # one call. Under total_prob its later tokens may cost more than the rows found by then (an
        # edit that makes the rest of the prefix improbable): it is read whole only when nothing else
        # waits (a long prompt, read at once), else token by token, best first like the rest
        whole = node.prefix and (self.by_prob or not (self.frontier.queue or self.batch))
        if whole and self.by_prob and node.parent is None:
            chains = prefix_chains(self.automaton, node, self.frontier.prefix_child, lambda s: self.final_edits(s) >= 0,
                                   self.opts.max_prefix_tokens, self.context, self.opts.batch_size)
            if chains is not None:
                self.batch.extend((chain, 0) for chain in chains)
                return
        step = self.forced(node) if whole else None
        if step is None:
            if not (whole and self.past_context(node)) and self.ledger.expandable(node):
                self.batch.append(([node], 0))
            elif self.opts.first_match and not (not self.rules.eos and self.final_edits(node.state) >= 0):
                self.ledger.lose(node, 1.0)  # neither a string nor read on: outside the language within the bounds
            return
        chain = [node]
        while step is not None:
            nxt = Node(chain[-1], step[0], step[1], True, chain[-1].npre + 1, 0, chain[-1].pre_raw, 0.0, None)
            chain.append(nxt)
            step = self.forced(nxt)
        if self.past_context(chain[-1]):
            return
        if len(chain) > 1 or self.ledger.expandable(node):
            self.batch.append((chain, 0))  # a chain is read even to its end, for its probabilities

    def expand(self) -> None:
        """One model call for the batch: queue each node's results with ``eos`` and its best child,
        keeping a chunk of its children sorted."""
        batch, self.batch = self.batch, []
        self.expander.expand(batch, self.found)
        self.count_prefixes()

    def count_prefixes(self) -> None:
        """The prefix nodes expanded so far, under the bound "prob" order puts on them."""
        self.stats.prefix = prefixes = self.expander.prefix_expanded
        if self.by_prob and prefixes > self.opts.max_prefix_nodes:
            raise self.ledger.too_many_prefix_paths(f"more than {self.opts.max_prefix_nodes:,}")

    def held(self) -> int:
        """Bytes held by the queue, the stored children, the nodes made and the expanded ones' token
        tuples and what it remembers of automaton states (an estimate)."""
        return self.frontier.held() + self.ledger.held()

    def bound(self) -> Optional[Stop]:
        """The bound that stops the search before its next model call, if one does (and the most
        bytes held, in ``stats.held``)."""
        return self.ledger.stop(self.held(), self.found)
