"""A query's memory budget: sizes as users write them, and how the budget is shared.

One number, ``max_memory`` (2 GiB by default), bounds what a query holds beyond the model's
weights. It is shared between the model's cached keys and values (half: the least recently
used are dropped and read again when needed), the automaton's cached transitions (a quarter:
dropped and computed again), and the traversal's own structures, a search's queue and stored
children or a sampler's cached states (a quarter: a search that needs more stops, keeping the
rows it found).
"""

from __future__ import annotations

import ctypes
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, Hashable, List, Optional, Tuple, Union

DEFAULT_MAX_MEMORY = 2 * 2 ** 30

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000 ** 2, "mb": 1000 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3,
          "t": 1000 ** 4, "tb": 1000 ** 4, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def parse_size(value: Union[int, float, str]) -> int:
    """Bytes from a number of bytes or a string such as '2GB', '512 MiB' or '1.5g'; ValueError
    when it is neither."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"not a size: {value!r}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {value!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_size(n: int) -> str:
    """``n`` bytes in binary units: '2 GiB', '512 MiB', '1.5 KiB', '100 bytes'."""
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} bytes"


@dataclass(frozen=True)
class Shares:
    """How ``max_memory`` bytes are shared (see the module's docstring)."""

    kv: int
    automaton: int
    traversal: int


def approx_bytes(values) -> int:
    """About the bytes a tuple of values holds: the tuple, each value, and the items of a value
    that is a list, tuple or dict (one level: token lists, JSON fields)."""
    n = sys.getsizeof(values)
    for v in values:
        n += sys.getsizeof(v)
        if isinstance(v, (list, tuple)):
            n += sum(sys.getsizeof(x) for x in v)
        elif isinstance(v, dict):
            n += sum(sys.getsizeof(k) + sys.getsizeof(x) for k, x in v.items())
    return n


def shares(max_memory: int) -> Shares:
    return Shares(kv=max_memory // 2, automaton=max_memory // 4, traversal=max_memory // 4)


ARC_BYTES = 100  # a child in the arrays of one model call: token, target, scores, key and the temporaries (estimated)


def batch_cap(max_memory: int, vocab: int, every_token: bool) -> int:
    """The most nodes or samples one model call may take: their float32 logits and
    log-probabilities (8 bytes per token of the vocabulary each) and, where the decoding rules
    may keep most tokens (``every_token``: no top-k that keeps few), their children as the
    executor's arrays hold them (``ARC_BYTES`` each, as many as the vocabulary at most) within
    half of ``max_memory``. A larger ``batch_size`` is cut to it: with 2 GiB, 2,730 on SmolLM2
    and 512 on Gemma 3 under top-k, 202 on SmolLM2 without."""
    return max(1, max_memory // 2 // (vocab * (8 + (ARC_BYTES if every_token else 0))))


_M_MMAP_THRESHOLD = -3


def return_large_blocks(threshold: int = 2 ** 20) -> None:
    """Ask glibc to serve every allocation of ``threshold`` bytes or more with its own mapping,
    returned to the system when freed. By default glibc raises that threshold to the size of the
    largest block freed so far (up to 32 MiB), after which a search's many short-lived logits
    tensors come from the heap between long-lived small objects, and its resident memory grows
    to several times what it holds (measured: 2.6 GB instead of 0.84 GB after 5,000 nodes of a
    search on tiny-gpt2). Does nothing on other C libraries."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, threshold)
    except (OSError, AttributeError):  # not glibc
        pass


class Lru:
    """A least-recently-used cache bounded by the total size its entries declare (bytes by
    default; give each entry size 1 for a cache bounded by count). The most recent ``keep``
    entries stay even when they alone pass the budget."""

    def __init__(self, budget: int, keep: int = 1):
        self.budget = budget  # the most the entries' sizes may add up to
        self.keep = keep  # entries never evicted to meet the budget (the newest)
        self.items: "OrderedDict[Hashable, Any]" = OrderedDict()
        self.sizes: Dict[Hashable, int] = {}
        self.total = 0  # the sum of the entries' sizes

    def __len__(self) -> int:
        return len(self.items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.items

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value under ``key``, made the most recent; ``default`` when absent."""
        if key not in self.items:
            return default
        self.items.move_to_end(key)
        return self.items[key]

    def peek(self, key: Hashable, default: Any = None) -> Any:
        """The value under ``key`` without making it recent."""
        return self.items.get(key, default)

    def put(self, key: Hashable, value: Any, size: int = 1) -> List[Tuple[Hashable, Any]]:
        """Store ``value`` as the most recent entry; returns the entries evicted to meet the budget."""
        if key in self.items:
            self.total -= self.sizes[key]
        self.items[key] = value
        self.items.move_to_end(key)
        self.sizes[key] = size
        self.total += size
        return self.shrink()

    def pop(self, key: Hashable, default: Any = None) -> Any:
        """Remove and return the value under ``key`` (``default`` when absent)."""
        if key not in self.items:
            return default
        self.total -= self.sizes.pop(key)
        return self.items.pop(key)

    def shrink(self, budget: Optional[int] = None) -> List[Tuple[Hashable, Any]]:
        """Evict the oldest entries until the sizes fit ``budget`` (the cache's own by default);
        returns them, oldest first."""
        budget = self.budget if budget is None else budget
        out = []
        while self.total > budget and len(self.items) > self.keep:
            key, value = self.items.popitem(last=False)
            self.total -= self.sizes.pop(key)
            out.append((key, value))
        return out

    def clear(self) -> None:
        self.items.clear()
        self.sizes.clear()
        self.total = 0
