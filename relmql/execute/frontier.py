"""The best-first search's frontier: its nodes, the priority queue and the children each node
stores (design: docs/executor.md, "Inside the search")."""

from __future__ import annotations

import heapq
import itertools
from typing import List, Optional

import numpy as np

CHUNK = 256  # children kept per node; more are recomputed when needed
NODE_BYTES = 400  # a search node and its queue entry, as Python objects (measured: about 330)
SEQ_BYTES = 84, 8  # an expanded node's token tuple: a tuple and its token's int, and 8 bytes a token

# a queue entry is a plain tuple (heapq compares it): its key spread out (TIER, VAL), a TIE
# breaker (first in, first out), its KIND, the NODE and the kind's ARG
TIER, VAL, TIE, KIND, NODE, ARG = range(6)
CHILD, RESULT, MORE = 0, 1, 2  # kinds of queue entries (see Frontier)
# a node's stored children, sorted by (tier, val): its queue key is (tier, val)
KID = np.dtype([("token", np.int64), ("state", np.int64), ("prefix", bool), ("raw", np.float64),
                ("rule", np.float64), ("tier", np.int8), ("val", np.float64)])
KID_TIER, KID_VAL = KID.names.index("tier"), KID.names.index("val")  # places in a stored child read as a tuple


class Node:
    """A node of the search tree: a token sequence, read up to its parent's."""

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
        """The node's tokens from the root (the start-of-text token left out)."""
        out, n = [], self
        while n is not None and n.token is not None:
            out.append(n.token)
            n = n.parent
        out.reverse()
        return out


class Frontier:
    """The priority ``queue`` of entries ``(tier, val, tie, kind, node, arg)`` (kind CHILD: ``arg``
    is ``(i, row)``, child ``i`` of the stored children of ``node`` and its fields as a tuple, read
    once; MORE: the chunk of ``node``'s children from ``arg`` on, to be made again; RESULT:
    ``node``'s string, with ``arg`` edits), the children the expanded nodes store and what they
    hold: nodes made, bytes of stored children and of the expanded nodes' token tuples."""

    def __init__(self, by_prob: bool):
        self.by_prob = by_prob  # order "prob": prefix nodes first, then completions by their own probability
        self.queue: list = []
        self.nodes = 0            # nodes made (an upper bound on those alive)
        self.kid_bytes = 0        # stored children
        self.seq_bytes = 0        # expanded nodes' token tuples
        self._bases: dict = {}    # id of an array of stored children -> [nodes holding a view, the array]
        self._tie = itertools.count()

    def node_key(self, pre_raw: float, cond: float, prefix_phase: bool) -> tuple:
        """The queue key of a node: prefix nodes first under ``prob``."""
        if self.by_prob:
            return (0, -pre_raw) if prefix_phase else (1, -cond)
        return (0, -(pre_raw + cond))

    def result_key(self, pre_raw: float, cond: float) -> tuple:
        """The queue key of a result."""
        return (1, -cond) if self.by_prob else (0, -(pre_raw + cond))

    def push(self, key: tuple, kind: int, node: Node, arg=0) -> None:
        """Queue an entry (ties go first in, first out)."""
        heapq.heappush(self.queue, (key[0], key[1], next(self._tie), kind, node, arg))

    def held(self) -> int:
        """Bytes held by the queue, the stored children, the nodes made and the expanded ones' token
        tuples (an estimate)."""
        return self.kid_bytes + self.seq_bytes + (self.nodes + len(self.queue)) * NODE_BYTES

    def child_entry(self, node: Node, i: int, row: Optional[tuple] = None) -> tuple:
        """The queue entry of stored child ``i`` of ``node`` (``row``: that child as a tuple, if
        read already)."""
        if row is None:
            row = node.kids[i].tolist()
        return row[KID_TIER], row[KID_VAL], next(self._tie), CHILD, node, (i, row)

    def materialize(self, parent: Node, row: tuple) -> Node:
        """A stored child of ``parent``, given as a tuple of its fields, as a node."""
        tok, state, is_pre, raw, rule, tier, val = row
        self.nodes += 1
        return Node(parent, tok, state, is_pre, parent.npre + is_pre, parent.ncomp + (not is_pre),
                    parent.pre_raw + (raw if is_pre else 0.0), parent.cond + (0.0 if is_pre else rule), (tier, val))

    def prefix_child(self, parent: Node, token: int, state: int) -> Node:
        """A child on a prefix token, its probability to be read with the chain it ends."""
        self.nodes += 1
        return Node(parent, token, state, True, parent.npre + 1, 0, parent.pre_raw, 0.0, None)

    def store_kids(self, node: Node, kids) -> None:
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

    def next_sibling(self, parent: Node, i: int) -> None:
        """Child ``i`` of ``parent``, first in the queue, leaves it: the next one takes its place
        (one sift of the heap, not two), or the next chunk is queued."""
        if i + 1 < len(parent.kids):
            heapq.heapreplace(self.queue, self.child_entry(parent, i + 1))
            return
        heapq.heappop(self.queue)
        if parent.more:  # made again, from the next chunk on, if ever needed
            self.push(tuple(parent.kids[i].tolist()[KID_TIER:KID_VAL + 1]), MORE, parent, parent.more)
        self.store_kids(parent, None)  # every child is in the queue or expanded, or will be made again
