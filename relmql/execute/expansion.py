"""One model call of the best-first search: the batch's nodes read, their children scored and
stored (design: docs/executor.md, "Inside the search")."""

from __future__ import annotations

import heapq
import math
from typing import List, NamedTuple, Optional

import numpy as np
import torch

from ..automata.tokens import TokenAutomaton
from ..models.base import LanguageModel, ModelState
from ..records import Decoding, ShortestPath
from .decoding import RuleScores
from .frontier import CHUNK, KID, RESULT, SEQ_BYTES, Frontier, Node
from .ledger import Ledger, SearchStats


class Read(NamedTuple):
    """A batch after its model call, one entry per chain (its last node)."""
    outs: List[ModelState]  # the model's states
    nodes: List[Node]  # the node expanded
    chunks: List[int]  # where the children to store begin (0: the node is read for the first time)
    states: List[int]  # the node's automaton state
    fields: List[tuple]  # (may read a prefix token, may read a completion token, pre_raw, cond)


class Sent(NamedTuple):
    """A batch's model call: what ``LanguageModel.extend`` reads, one entry per chain."""
    batch: list  # the chains and the child each is read from (0: the first)
    parents: List[Optional[ModelState]]  # the state each chain extends (None: the start)
    tokens: List[List[int]]  # the chain's new tokens


class Children(NamedTuple):
    """The children a batch's nodes may have, found and keyed at once (``[children]`` arrays unless
    said; ``kept`` picks, from the candidate arcs, those the bounds and rules keep)."""
    cols: np.ndarray  # [arcs] each candidate's token
    targets: np.ndarray  # [arcs] its automaton state
    pre: np.ndarray  # [arcs] whether it is a prefix token
    raw: np.ndarray  # [arcs] the model's log-probability of it
    rule: np.ndarray  # [arcs] its log-probability under the decoding rules
    kept: np.ndarray  # the kept children's arcs
    owner: np.ndarray  # the node of each (its place in the batch)
    tier: np.ndarray  # int8 queue key: prefix children first under prob
    val: np.ndarray  # float64 queue key: -log of the probability ranked
    count: np.ndarray  # [batch] kept children per node
    first: np.ndarray  # [batch] where each node's children begin in owner order
    comp_ok: np.ndarray  # [batch] whether a node may read a completion token
    pre_ok: np.ndarray  # [batch] whether a node may read a prefix token
    eos_rule: Optional[np.ndarray]  # [batch] under eos: the end of text's log-probability under the rules


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


def kid_array(kids: Children, at: np.ndarray) -> np.ndarray:
    """The kept children at positions ``at``, as a KID array."""
    out, arc = np.empty(len(at), KID), kids.kept[at]
    for name, column in zip(KID.names[:5], (kids.cols, kids.targets, kids.pre, kids.raw, kids.rule)):
        out[name] = column[arc]
    out["tier"], out["val"] = kids.tier[at], kids.val[at]
    return out


class Expander:
    """The search's model calls: each reads a batch of ``(chain, first child)``, queues each node's
    results with ``eos`` and its best child, keeping a chunk of its children sorted (``one_sort``:
    up to this many children in a batch are sorted at once, more node by node)."""

    def __init__(self, automaton: TokenAutomaton, model: LanguageModel, rules: Decoding, opts: ShortestPath,
                 stats: SearchStats, frontier: Frontier, ledger: Ledger, one_sort: int):
        self.automaton, self.model, self.rules, self.opts, self.stats = automaton, model, rules, opts, stats
        self.frontier, self.ledger, self.one_sort = frontier, ledger, one_sort
        self.prefix_expanded = 0  # prefix nodes (and the root) expanded

    def expand(self, batch: list, found: int) -> None:
        """One model call for ``batch`` (``found``: rows released so far)."""
        sent = self.send(batch)
        self.absorb(self.receive(sent, self.model.extend(sent.parents, sent.tokens)), found)

    def absorb(self, read: Read, found: int, scores: Optional[RuleScores] = None) -> None:
        """A model call's results taken in: the children scored (``scores``: the rules' scores of its
        distributions, where the model's side made them), the cuts noted, the children stored."""
        kids = self.score_children(read, scores)
        self.note_cuts(read, kids, found)
        self.store_children(read, kids, found)

    def send(self, batch: list) -> "Sent":
        """The model call that reads the batch's chains: each chain's parent state and new tokens."""
        model = self.model
        parents, toks_in = [], []
        for chain, _ in batch:
            head = chain[0]
            if len(chain) == 1:
                toks_in.append([head.token] if head.token is not None else [])
            else:
                toks_in.append([n.token for n in chain if n.token is not None])
            p = head.parent
            parents.append(None if p is None else ModelState(
                p.seq if p.seq is not None else (*model.start_tokens, *p.tokens()), None, None, p.cache))
        return Sent(batch, parents, toks_in)

    def receive(self, sent: "Sent", outs: List[ModelState]) -> Read:
        """A call's states taken in: count the nodes expanded, give a chain's forced prefix nodes
        their probabilities (and the result at its end, without eos) and each node its keys and
        values."""
        rules, opts, stats, frontier, batch = self.rules, self.opts, self.stats, self.frontier, sent.batch
        nodes, chunks, states, fields = [], [], [], []
        fixed, per_token = SEQ_BYTES
        counted = set()  # the chains of a prefix tree share their first nodes: each is counted once
        for (chain, chunk), out in zip(batch, outs):
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
                    n.key = frontier.node_key(n.pre_raw, 0.0, True)
                self.prefix_expanded += len(new) - 1
                if not rules.eos:
                    edits = self.ledger.final_edits(node.state)
                    if edits >= 0:
                        frontier.push(frontier.result_key(node.pre_raw, 0.0), RESULT, node, edits)
            if node.cache is None:
                node.cache, node.seq = out.cache, out.tokens
                frontier.seq_bytes += fixed + per_token * len(out.tokens)
            nodes.append(node)
            chunks.append(chunk)
            states.append(node.state)
            fields.append((node.npre < opts.max_prefix_tokens,
                           node.ncomp < opts.max_tokens and not self.ledger.stops(node.state), node.pre_raw,
                           node.cond))
        return Read(outs, nodes, chunks, states, fields)

    def score_children(self, read: Read, scores: Optional[RuleScores] = None) -> Children:
        """Every node's candidate children at once (node, token, target, is prefix), the rules'
        scores and the keys of those kept: prefix tokens by the prefix's probability (first, under
        prob), completion tokens by the completion's (or the whole text's, under total_prob)."""
        rules, size = self.rules, len(read.nodes)
        if scores is None:
            scores = RuleScores(stacked(read.outs), rules)
        raw = scores.logprobs
        rows_idx, cols, targets, pre = self.automaton.arcs_of(read.states, scores.kept)
        raw_all, rule_all = scores.pick(rows_idx, cols)
        eos_rule = None
        if rules.eos:
            every = torch.arange(size, device=raw.device)
            eos_rule = scores.at(every, torch.full_like(every, self.model.eos_id)).double().cpu().numpy()
        pre_ok, comp_ok, base_pre, base_cond = (np.array(x) for x in zip(*read.fields))
        # the kept children's keys; their other fields are read only for the children stored (a
        # node of a wide language has tens of thousands, of which a chunk is stored)
        kept = np.flatnonzero(np.where(pre, pre_ok[rows_idx], (rule_all > -math.inf) & comp_ok[rows_idx]))
        r, pre_k = rows_idx[kept], pre[kept]
        on_prefix = np.flatnonzero(pre_k)
        if self.frontier.by_prob:
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
        count = np.bincount(r, minlength=size)
        first = np.cumsum(count) - count
        return Children(cols, targets, pre, raw_all, rule_all, kept, r, tier, val, count, first, comp_ok, pre_ok,
                        eos_rule)

    def note_cuts(self, read: Read, kids: Children, found: int) -> None:
        """The ways the nodes read for the first time were cut short (the rules kept no child;
        max_tokens, max_prefix_tokens) and, with ``first_match``, the probability they lose."""
        opts, ledger, states = self.opts, self.ledger, read.states
        fresh = np.array(read.chunks) == 0
        long = ~kids.comp_ok  # at max_tokens, or at a string that stops the search (first_match), which cuts nothing
        if opts.first_match:
            long &= np.array([not ledger.stops(s) for s in states], bool)
        for cause, cut in (("rules", (kids.count == 0) & kids.comp_ok & self.rules.truncates), ("max_tokens", long),
                           ("max_prefix_tokens", ~kids.pre_ok)):
            if ledger.cutting(cause) and (cause != "rules" or not found):  # with rows, asked for
                ledger.cut(cause, [states[i] for i in np.flatnonzero(fresh & cut).tolist()])
        if opts.first_match:
            comp = ~kids.pre[kids.kept]
            ledger.lose_outside(read.nodes, fresh, kids.owner[comp], kids.rule[kids.kept[comp]], kids.eos_rule)

    def store_children(self, read: Read, kids: Children, found: int) -> None:
        """Queue each node's result with eos and its first stored child, storing the chunk of its
        children it reads next, sorted: for the batch in one sort when they are few, else node by
        node, only the chunk's."""
        rules, frontier, ledger = self.rules, self.frontier, self.ledger
        tier, val, count, first = kids.tier, kids.val, kids.count, kids.first
        chunks = np.array(read.chunks)
        one_sort = len(kids.owner) <= self.one_sort
        starts = first + chunks  # where each node's stored children begin
        if one_sort:  # one sort for the batch: by node, then key (stable: ties keep arc order)
            stored = kid_array(kids, np.lexsort((val, tier, kids.owner)))
            heads = iter(stored[starts[count > chunks]].tolist())  # each node's first stored child
        counts, starts, first = count.tolist(), starts.tolist(), first.tolist()
        for b, (node, chunk) in enumerate(zip(read.nodes, read.chunks)):
            if chunk == 0 and rules.eos:
                edits = ledger.final_edits(node.state)
                if edits >= 0 and kids.eos_rule[b] > -math.inf:
                    frontier.push(frontier.result_key(node.pre_raw, node.cond + kids.eos_rule[b]), RESULT, node,
                                  edits)
                elif edits >= 0 and not found:  # a string whose end of text the rules rule out
                    ledger.cut("eos", [node.state])
            n = counts[b]
            if n <= chunk:
                continue
            if one_sort:
                mine, head = stored[starts[b]:first[b] + min(n, chunk + CHUNK)], next(heads)
            else:  # many children: only the chunk's are sorted and stored
                a, e = first[b], first[b] + n
                mine, head = kid_array(kids, a + first_sorted(tier[a:e], val[a:e], chunk + CHUNK)[chunk:]), None
            frontier.store_kids(node, mine)
            node.more = chunk + CHUNK if chunk + CHUNK < n else 0
            heapq.heappush(frontier.queue, frontier.child_entry(node, 0, head))
