"""A model's cached keys and values: blocks of tokens chained to their beginnings (``KVBlock``),
their slots in one ``KVPool``, and the byte-budgeted least-recently-used record that drops them
(``KVStore``). Nothing here knows the backend (docs/models.md, *Inside the model backend*)."""

from __future__ import annotations

import weakref
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..memory import Lru
from .kvpool import KVPool

NO_LIMIT = 2 ** 62  # the record's own budget: a block is dropped only by ``KVStore.evict``, never while stored


class KVBlock:
    """The keys and values of a run of ``n`` tokens (ending at position ``length``), chained to
    the block before it: ``slots``, their places in the store's ``KVPool``, or None once
    evicted. A state's cache is its last block; sequences that share a beginning share its
    blocks, so a child node stores only its own token. ``cell`` holds the slots, for the weak
    reference that gives them back when the block is dropped (the pool may move them)."""

    __slots__ = ("parent", "n", "length", "cell", "__weakref__")

    def __init__(self, parent: Optional["KVBlock"], slots: Optional[np.ndarray], n: int, length: int):
        self.parent, self.n, self.length, self.cell = parent, n, length, [slots]

    @property
    def slots(self) -> Optional[np.ndarray]:
        return self.cell[0]

    @slots.setter
    def slots(self, value: Optional[np.ndarray]) -> None:
        self.cell[0] = value

    def chain(self) -> List["KVBlock"]:
        out, b = [], self
        while b is not None:
            out.append(b)
            b = b.parent
        out.reverse()
        return out


Lost = Tuple[KVBlock, Sequence[int]]  # an evicted block and its tokens


class KVStore:
    """The keys and values a model holds, within ``budget`` bytes: ``keep`` puts a pass's new
    ones in the pool, ``add`` records the block that holds them, ``take`` gives the slots of the
    blocks a call reads (making them the most recently used), ``evict`` drops the least recently
    used blocks until the pool fits and packs it, and ``restore`` puts dropped blocks back,
    read again by the backend. ``held()``: the bytes of the budget the backend's own buffers
    take (a staging buffer, graphed passes)."""

    def __init__(self, budget: int, held: Callable[[], int] = lambda: 0):
        self.budget = budget  # bytes of keys and values kept, the backend's buffers included
        self.held = held
        self.pool = KVPool()
        self.lru = Lru(NO_LIMIT, keep=0)  # id(block) → weak reference, sized in bytes; the newest may go too

    @property
    def nbytes(self) -> int:
        """Bytes held now: the pool and the backend's buffers."""
        return self.pool.nbytes + self.held()

    def room(self) -> int:
        """Bytes of the budget left to the pool."""
        return self.budget - self.held()

    def keep(self, fresh: torch.Tensor) -> np.ndarray:
        """Put a pass's new keys and values (``fresh``: (2 * layers, kv_heads, n, head_dim)) in
        the pool, grown within the room where it can: their slots (n,)."""
        slots = self.pool.take(fresh.shape[2], fresh, self.room())
        self.pool.write(slots, fresh)
        return slots

    def add(self, block: KVBlock) -> None:
        """Record a block that holds slots, as the most recently used: its slots are given back
        when it is dropped or evicted."""
        key = id(block)
        ref = weakref.ref(block, lambda _, k=key, cell=block.cell: self._forget(k, cell))
        self.lru.put(key, ref, block.n * self.pool.slot_bytes)

    def _forget(self, key: int, cell: list) -> None:
        if self.lru.pop(key) is not None and cell[0] is not None:
            self.pool.give_back(cell[0])
            cell[0] = None

    def take(self, blocks: Iterable[KVBlock]) -> List[np.ndarray]:
        """The slots of the blocks a call reads, in order, each block made the most recently used."""
        out = []
        for blk in blocks:
            self.lru.get(id(blk))
            out.append(blk.slots)
        return out

    def values(self):
        """Weak references to the blocks recorded, least recently used first."""
        return self.lru.items.values()

    def pop(self, key: int):
        """Forget the block ``id`` ``key`` without giving back its slots (the caller does): its weak reference."""
        return self.lru.pop(key)

    def evict(self) -> None:
        """Drop the least recently used blocks while the pool's slots in use (and the padding's)
        pass the room; then pack a pool grown past it (by one call, or a smaller budget)."""
        pool, room = self.pool, self.room()
        size = pool.slot_bytes
        for _, ref in self.lru.shrink(room - size):  # (- size: the padding's slot)
            block = ref()
            if block is not None and block.slots is not None:
                pool.give_back(block.slots)
                block.slots = None
        if pool.nbytes > max(room, 0):
            live = [b for b in (r() for r in self.values()) if b is not None and b.slots is not None]
            live.sort(key=lambda b: b.length)
            pool.resize(max(room // size, 1), live)

    def restore(self, lost: Sequence[Lost], piece: int, read: Callable[[List[Lost]], torch.Tensor]) -> int:
        """Put evicted blocks back: each once, however many sequences it begins, in groups of at
        most ``piece`` tokens, ancestors first (``lost``: (block, its tokens)); ``read(group)``
        computes a group's keys and values (2 * layers, kv_heads, its tokens, head_dim). The
        tokens read again."""
        group, size, done = [], 0, 0
        for blk, toks in lost:
            if group and size + blk.n > piece:
                done += self._put_back(group, read(group))
                group, size = [], 0
            group.append((blk, toks))
            size += blk.n
        if group:
            done += self._put_back(group, read(group))
        return done

    def _put_back(self, group: List[Lost], fresh: torch.Tensor) -> int:
        slots = self.keep(fresh)
        at = 0
        for blk, _ in group:
            blk.slots = slots[at:at + blk.n]
            self.add(blk)
            at += blk.n
        return at
