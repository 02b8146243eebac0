"""Forward passes replayed as CUDA graphs, padded to a few shapes, their inputs copied into buffers
of their own (docs/models.md, *Inside the model backend*: CUDA graphs)."""

from __future__ import annotations

import weakref
from typing import Dict, Optional

import torch

from ..memory import Lru
from .attention import preloaded_cache
from .kvstore import NO_LIMIT

MAX_NEW = 4  # new tokens per sequence in a graphed padded pass, at most (a search reads one per node)
PAST_STEP = 32  # past positions are padded to a multiple of this
MAX_GRAPHS = 8  # shapes kept; the least recently used is dropped (also to keep within the budget)
PADDED, TREE = "padded", "tree"


def bucket(n: int) -> int:
    """Rows of a graphed pass: ``n`` rounded up to 8, 12, 16, 24, 32, 48, ... (at most half again)."""
    size = 8
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 else size * 4 // 3
    return size


def capture(forward, device: torch.device, pool=None):
    """``forward()`` captured as a CUDA graph: warmed up, then captured on a side stream (as torch
    asks); the graph and the output it writes on each replay."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        forward()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            out = forward()
    torch.cuda.current_stream(device).wait_stream(stream)
    return graph, out


class Pass:
    """One forward pass of fixed shape. Fill ``ids``, ``pos``, ``mask`` (padded: ``[rows, past +
    new]`` of 0/1; tree: a 4D additive mask per mask kind, in ``masks``) and ``kv`` (every layer's
    keys and values: padded, laid out as ``ForwardPasses._batch_cache`` lays them; tree,
    ``[2 * layers, kv_heads, past + rows, head_dim]``), then ``run``: its output lives in the
    graph's memory (read it before the next run)."""

    def __init__(self, model, kind: str, rows: int, past: int, new: int, kv: torch.Tensor,
                 mask_kinds, graphed: bool, pool=None):
        """``kv``: a flat buffer of at least the pass's keys and values (its beginning is used)."""
        self.model, self.rows, self.past, self.new = model, rows, past, new
        dev, (layers2, heads, dim) = model.device, model.passes.kv_shape
        seqs, length = (rows, new) if kind == PADDED else (1, rows)
        self.ids = torch.zeros((seqs, length), dtype=torch.long, device=dev)
        self.pos = torch.zeros((seqs, length), dtype=torch.long, device=dev)
        if kind == PADDED:
            self.mask = torch.ones((rows, past + new), dtype=torch.long, device=dev)
            self.kv = kv[:layers2 * heads * rows * (past + new) * dim].view(layers2, heads, rows * (past + new), dim)
            full = self.kv.view(layers2, heads, rows, past + new, dim)
            self.layers = [(full[2 * i].transpose(0, 1), full[2 * i + 1].transpose(0, 1)) for i in range(layers2 // 2)]
        else:
            self.masks: Dict = {k: torch.zeros((1, 1, rows, past + rows), dtype=model.dtype, device=dev)
                                for k, _ in mask_kinds}
            self.mask = self.masks[None] if None in self.masks else self.masks
            self.kv = kv[:layers2 * heads * (past + rows) * dim].view(layers2, heads, past + rows, dim)
            self.layers = [(self.kv[2 * i].unsqueeze(0), self.kv[2 * i + 1].unsqueeze(0)) for i in range(layers2 // 2)]
        self.graph, self.out = capture(self._forward, dev, pool) if graphed else (None, None)

    @property
    def logits_bytes(self) -> int:
        """What the pass's output holds between calls (its logits)."""
        return self.rows * self.new * len(self.model.vocabulary) * self.model.dtype.itemsize

    def _forward(self):
        m = self.model
        return m.model(input_ids=self.ids, attention_mask=self.mask, position_ids=self.pos, use_cache=True,
                       **{m.passes.cache_arg: preloaded_cache(self.layers, self.past)})

    def run(self):
        """The pass over the buffers' present contents: its output."""
        if self.graph is None:
            self.out = self._forward()
        else:
            self.graph.replay()
        return self.out


class Graphs:
    """The graphed passes of one model, by kind and shape. A shape is captured the second time a
    call needs it (``defer``; one-off shapes stay eager); the least recently used is dropped
    beyond ``MAX_GRAPHS``, or beyond half the model's key/value budget, which their bytes count
    in; a shape whose capture fails runs eagerly from then on (``failure`` says why). ``capture``
    False runs the same padded shapes eagerly (a CPU checks them)."""

    def __init__(self, model, capture: bool = True, defer: Optional[bool] = None):
        self.model, self.capture = weakref.proxy(model), capture  # the model owns these passes
        self.defer = capture if defer is None else defer
        # (kind, rows, past, new) → Pass, sized by its logits' bytes; dropped only by get and shrink
        self.kept = Lru(NO_LIMIT, keep=0)
        self.seen: set = set()
        self.never: set = set()  # shapes whose capture failed
        self.failure: Optional[str] = None
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.arena: Optional[torch.Tensor] = None  # the keys and values of every pass

    @property
    def passes(self):
        """The passes kept, by (kind, rows, past, new), least recently used first (to read)."""
        return self.kept.items

    @property
    def _arena_bytes(self) -> int:
        return 0 if self.arena is None else self.arena.numel() * self.arena.element_size()

    @property
    def nbytes(self) -> int:
        return self._arena_bytes + self.kept.total

    def shrink(self, room: int) -> None:
        """Drop the least recently used passes while they hold more than ``room`` bytes (the
        shared key/value buffer with the last of them)."""
        self.kept.shrink(room - self._arena_bytes)
        if not self.kept:
            self.arena = None

    def get(self, kind: str, rows: int, past: int, new: int, logits_bytes: int) -> Optional[Pass]:
        """The pass of ``kind`` for ``rows`` sequences (tree: new tokens) of at most ``past``
        cached and ``new`` new tokens; None where it runs eagerly (first seen, its capture
        failed, or too large: its logits over ``logits_bytes``, its bytes over half the
        key/value budget)."""
        if not past or new > MAX_NEW:
            return None
        key = (kind, bucket(rows), -(-past // PAST_STEP) * PAST_STEP, new)
        got = self.kept.get(key)
        if got is not None:
            return got
        if key in self.never or (self.defer and key not in self.seen):
            self.seen.add(key)
            return None
        m, (layers2, heads, dim) = self.model, self.model.passes.kv_shape
        _, rows, past, new = key
        size = m.dtype.itemsize
        logits = rows * new * len(m.vocabulary) * size
        cells = layers2 * heads * dim * (rows * (past + new) if kind == PADDED else past + rows)
        have = 0 if self.arena is None else self.arena.numel()
        room = m.store.budget // 2
        if logits * 4 // size > logits_bytes or (max(cells, have) * size + logits) > room:
            return None
        if cells > have:  # a larger buffer: the passes reading the old one go (grown by half, room permitting)
            self.kept.clear()
            self.arena = None
            cells = max(cells, min(have * 3 // 2, (room - logits) // size))
            self.arena = torch.zeros(cells, dtype=m.dtype, device=m.device)
        while len(self.kept) >= MAX_GRAPHS:
            self.kept.pop(next(iter(self.passes)))
        self.kept.shrink(room - logits - self._arena_bytes)
        try:
            got = Pass(m, kind, rows, past, new, self.arena, m.passes.mask_kinds, self.capture, self.pool)
        except Exception as e:  # this shape could not be captured: it runs eagerly
            self.never.add(key)
            self.failure = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}".rstrip(": ")
            if not self.kept:
                self.arena = None
            return None
        self.kept.put(key, got, got.logits_bytes)
        return got
