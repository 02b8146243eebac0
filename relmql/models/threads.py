"""How many CPU threads a model call runs on."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

SMALL_CALL = 8  # new tokens: a pass this small reads the weights more than it computes


@contextlib.contextmanager
def threads_for(device: torch.device, tokens: int) -> Iterator[None]:
    """Within this block, a CPU forward pass of at most ``SMALL_CALL`` new tokens runs on one
    thread: it is bound by reading the weights, which a second thread hardly speeds up, and
    beside other work the threads of an OpenMP team wait on each other (docs/executor.md,
    *Threads*). Larger passes keep the session's threads (``SET threads``)."""
    n = torch.get_num_threads()
    if device.type != "cpu" or tokens > SMALL_CALL or n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)
