"""The worker side of the Ray engine: an actor that loads its models once and runs query plans.

``Worker.run(call, plans)`` is a streaming generator: for each plan in turn it yields ``Piece``s
(the plan's result rows, a few at a time, then one that ends the plan), so that rows stream back
while a long query is still running and a worker that dies mid-plan loses only what it had not
yet sent. This module does not import Ray: ``relmql.cluster`` wraps ``Worker`` as an actor.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Set, Tuple

from ..errors import Error
from ..execute import Mass, Row

ROWS_PER_PIECE = 256
SECONDS_PER_PIECE = 0.2


@dataclass
class Piece:
    """Part of one plan's result: ``rows`` (each with its rank) continue those sent before;
    ``done`` ends the plan, with what it printed on stderr (``warnings``), whether its search
    stopped at ``max_nodes``, and the ``Error`` it raised, if any."""

    unit: int  # position of the plan in the call
    rows: List[Tuple[Row, int]] = field(default_factory=list)
    mass: Optional[Mass] = None
    done: bool = False
    stopped: bool = False
    warnings: str = ""
    error: Optional[Error] = None


class Worker:
    """One model process. ``threads``: torch threads; ``preload``: a ``ModelRef`` to load now so
    that the first query does not wait for it (a model that fails to load fails its queries)."""

    def __init__(self, threads: int, preload=None):
        import torch

        from ..api import Connection
        torch.set_num_threads(max(1, int(threads)))
        self.con = Connection()
        self._call: Optional[int] = None
        self._cancel = threading.Event()
        self._cancelled: Set[int] = set()
        if preload is not None:
            try:
                self.con.model(preload)
            except Error:
                pass

    def run(self, call: int, plans: Sequence[Tuple[object, int]]) -> Iterator[Piece]:
        """The pieces of each ``(plan, skip)`` in order; the first ``skip`` rows of a plan are not
        sent (a retried plan whose first rows the driver already holds)."""
        if call in self._cancelled:
            return
        self._call, self._cancel = call, threading.Event()
        for unit, (plan, skip) in enumerate(plans):
            yield from self._plan(unit, plan, skip)
            if self._cancel.is_set():
                return

    def _plan(self, unit: int, plan, skip: int) -> Iterator[Piece]:
        from ..engine import query_rows
        err = io.StringIO()
        piece = Piece(unit)
        masses: list = []
        stopped: list = []
        seen, sent_mass, last = 0, False, time.monotonic()
        rows = query_rows(plan, self.con.model, self._cancel, stopped=stopped, masses=masses)
        try:
            while True:
                with contextlib.redirect_stderr(err):
                    env = next(rows, None)
                if env is None:
                    break
                seen += 1
                if seen <= skip:
                    continue
                piece.rows.append((env.row, env.rank))
                if masses and not sent_mass:
                    piece.mass, sent_mass = masses[0], True
                if len(piece.rows) >= ROWS_PER_PIECE or time.monotonic() - last >= SECONDS_PER_PIECE:
                    yield piece
                    piece, last = Piece(unit), time.monotonic()
        except Error as e:
            piece.error = e
        piece.done, piece.stopped, piece.warnings = True, bool(stopped), err.getvalue()
        piece.mass = masses[0] if masses else None
        yield piece

    def cancel(self, call: int) -> bool:
        """Stop call ``call`` before its next model call (or before it starts)."""
        self._cancelled.add(call)
        if self._call == call:
            self._cancel.set()
        return True

    def info(self) -> dict:
        """This worker's process id and the GPUs Ray gave it (CUDA_VISIBLE_DEVICES)."""
        import os
        return {"pid": os.getpid(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
