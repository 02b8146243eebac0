"""One pool of keys and values per model: every cached token's keys and values at a slot of one
buffer, written once, when the forward pass that computed them returns. A call reads its
sequences' pasts with one gather over the pool (the slots of each sequence's blocks, one index)
instead of copying block after block: on a GPU one kernel, not one per block (a batch of 256
nodes at depth 12 copied 3,000 blocks a call)."""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch

PAD = 0  # the slot of zeros that padding reads (never given out)
RUNS = 8  # a write of slots in fewer runs of consecutive ones copies slices


class KVPool:
    """Keys and values ``[2 * layers, kv_heads, capacity, head_dim]`` (keys of layer l at 2l,
    values at 2l + 1), one token per slot. ``take`` gives out free slots, growing the buffer by
    half when short; ``give_back`` returns a block's slots (from a weak reference's callback, at
    any allocation, so it only appends to a list that ``take`` swaps for an empty one before
    reading); ``resize`` with the live blocks packs their slots at the front of a smaller
    buffer."""

    def __init__(self):
        self.data: Optional[torch.Tensor] = None
        self._free: List[int] = []   # free slots; the last ones are given out first
        self._dead: List[int] = []   # slots given back since the last take, not yet free

    @property
    def capacity(self) -> int:
        """Slots of the buffer, the padding's included."""
        return 0 if self.data is None else self.data.shape[2]

    @property
    def slot_bytes(self) -> int:
        """Bytes of one token's keys and values (0 before the first)."""
        d = self.data
        return 0 if d is None else d.shape[0] * d.shape[1] * d.shape[3] * d.element_size()

    @property
    def nbytes(self) -> int:
        """Bytes of the buffer."""
        return self.capacity * self.slot_bytes

    @property
    def used(self) -> int:
        """Slots holding a block's keys and values."""
        return max(self.capacity - 1 - len(self._free) - len(self._dead), 0)

    def take(self, n: int, like: torch.Tensor, room: Optional[int] = None) -> np.ndarray:
        """``n`` free slots (a new buffer shaped for ``like`` where the pool has none), the buffer
        grown by half when short, to at most ``room`` bytes unless ``n`` needs more."""
        if self.data is None:
            self.data = like.new_zeros(like.shape[:2] + (max(n + 1, 256),) + like.shape[3:])
            self._free = list(range(self.capacity - 1, PAD, -1))
        dead, self._dead = self._dead, []
        self._free += dead
        if len(self._free) < n:
            need = self.capacity + n - len(self._free)
            grown = max(self.capacity * 3 // 2, 256)
            if room is not None:
                grown = min(grown, max(room // self.slot_bytes, 1))
            self.resize(max(need, grown))
        have = len(self._free)
        got = np.array(self._free[have - n:have][::-1], dtype=np.int64)  # ascending: a fresh pool's are one run
        del self._free[have - n:have]
        return got

    def resize(self, capacity: int, live: Sequence = ()) -> None:
        """A buffer of ``capacity`` slots: grown, its slots kept; or packed (``live``: every
        block with slots, each with a settable ``slots``), each live block's slots moved to the
        front, in order."""
        old = self.data
        if capacity >= self.capacity:
            self.data = old.new_empty(old.shape[:2] + (capacity,) + old.shape[3:])
            self.data[:, :, :old.shape[2]] = old
            self._free = list(range(capacity - 1, old.shape[2] - 1, -1)) + self._free
            return
        at = 1
        moves = []
        for blk in live:
            moves.append(blk.slots)
            blk.slots = np.arange(at, at + len(blk.slots))
            at += len(blk.slots)
        capacity = max(capacity, at)
        self.data = old.new_zeros(old.shape[:2] + (capacity,) + old.shape[3:])
        if moves:
            self.data[:, :, 1:at] = old.index_select(2, self.index(np.concatenate(moves)))
        self._free, self._dead = list(range(capacity - 1, at - 1, -1)), []

    def give_back(self, slots: np.ndarray) -> None:
        """Slots no block holds any more (``extend``: a list method, so that a callback in
        another thread never stores back a list ``take`` has emptied)."""
        self._dead.extend(slots.tolist())

    def index(self, slots: np.ndarray) -> torch.Tensor:
        """``slots`` as an index on the buffer's device."""
        return torch.from_numpy(np.ascontiguousarray(slots, dtype=np.int64)).to(self.data.device)

    def write(self, slots: np.ndarray, kv: torch.Tensor) -> None:
        """Put ``kv`` (``[2 * layers, kv_heads, len(slots), head_dim]``) at ``slots``."""
        breaks = np.flatnonzero(np.diff(slots) != 1) + 1
        if len(breaks) < RUNS:  # a few runs of consecutive slots: a slice copy each (on a CPU,
            at = 0              # index_copy_ along a middle dimension took 6 times as long)
            for end in breaks.tolist() + [len(slots)]:
                first = int(slots[at])
                self.data[:, :, first:first + end - at] = kv[:, :, at:end]
                at = end
            return
        self.data.index_copy_(2, self.index(slots), kv)

    def read(self, slots: np.ndarray, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The keys and values at ``slots`` (``PAD``: zeros), one after another, as
        ``[2 * layers, kv_heads, len(slots), head_dim]`` (into ``out``, contiguous, if given)."""
        if out is None:
            return self.data.index_select(2, self.index(slots))
        return torch.index_select(self.data, 2, self.index(slots), out=out)
