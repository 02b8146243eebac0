"""The worker side of the Ray engine: an actor that loads its models once and runs query plans.

``Worker.run(call, plans)`` is a streaming generator: for each plan in turn it yields ``Piece``s
(the plan's result rows, a few at a time, then one that ends the plan), so that rows stream back
while a long query is still running and a worker that dies mid-plan loses only what it had not
yet sent. A plan's rows are computed in a thread of the worker's own, so that while a search
looks for its next row the worker still sends the rows it holds and how far the search has gone
(the progress note an in-process query shows). This module does not import Ray:
``relmql.cluster`` wraps ``Worker`` as an actor.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import Error
from ..execute import Mass, Row, Stop
from ..models import ModelCache

ROWS_PER_PIECE = 256
SECONDS_PER_PIECE = 0.2


@dataclass
class Piece:
    """Part of one plan's result: ``rows`` (each with its rank) continue those sent before;
    ``warnings``: what the plan printed on stderr since the last piece; ``mass``: how a measured
    plan's language was measured (sent once, with the first piece that has it); ``done`` ends the
    plan, with the ``Stop`` of a search that a bound ended and the ``Error`` it raised, if any;
    ``no_row``: why the search found no row (``SearchStats.no_row``), if it found none for a reason
    worth a note, or which bounds cut short a language it exhausted (``SearchStats.cut``), and
    ``fewest`` (``SearchStats.fewest``); ``floor``: where a local estimate fell below it, its
    canonical floor (``SearchStats.floor``);
    ``note``: the plan's progress note when it changed ("compiling the automaton", how many nodes
    the search for the next row has expanded; "" once over), else None."""

    unit: int  # position of the plan in the call
    rows: List[Tuple[Row, int]] = field(default_factory=list)
    mass: Optional[Mass] = None
    done: bool = False
    stop: Optional[Stop] = None
    no_row: Tuple[str, ...] = ()
    fewest: Optional[int] = None
    floor: Optional[float] = None
    warnings: str = ""
    error: Optional[Error] = None
    note: Optional[str] = None
    prompt: Optional[str] = None  # the prompt as the model read it (its chat template rendered), once
    scores: Dict[tuple, Optional[float]] = field(default_factory=dict)  # logprob_under() of the rows, by RowContext key


class Worker:
    """One model process. ``threads``: torch threads; ``preload``: a ``ModelRef`` to load now so
    that the first query does not wait for it (a model that fails to load fails its queries)."""

    def __init__(self, threads: int, preload=None):
        import torch
        torch.set_num_threads(max(1, int(threads)))
        self.models = ModelCache()
        self._events: Dict[int, threading.Event] = {}  # call -> set when it is cancelled
        self._rows = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="relmql-rows")  # computes rows
        if preload is not None:
            try:
                self.models(preload)
            except Exception:  # noqa: BLE001 - the queries that use the model report why it fails
                pass

    def run(self, call: int, plans: Sequence[Tuple[object, int]]) -> Iterator[Piece]:
        """The pieces of each ``(plan, skip)`` in order; the first ``skip`` rows of a plan are not
        sent (a retried plan whose first rows the driver already holds)."""
        cancel = self._events.setdefault(call, threading.Event())
        try:
            for unit, (plan, skip) in enumerate(plans):
                if cancel.is_set():
                    return
                yield from self._plan(unit, plan, skip, cancel)
        finally:
            self._events.pop(call, None)

    def _plan(self, unit: int, plan, skip: int, cancel: threading.Event) -> Iterator[Piece]:
        from ..engine import query_rows
        err = io.StringIO()
        piece = Piece(unit)
        masses: list = []
        stopped: list = []
        empty: list = []
        floors: list = []
        notes = ["", ""]  # the latest note, the one last sent
        seen, sent_mass, last = 0, False, time.monotonic()
        rows = query_rows(plan, self.models, cancel, stopped=stopped, masses=masses, no_row=empty,
                          on_note=lambda text: notes.__setitem__(0, text), floors=floors)

        def step():
            with contextlib.redirect_stderr(err):
                return next(rows, None)

        def sent(p: Piece, warnings: bool = True) -> Piece:
            nonlocal last, piece
            if warnings:  # only between steps: the row thread writes them while it runs
                p.warnings = err.getvalue()
                err.seek(0)
                err.truncate()
            if notes[0] != notes[1]:
                p.note = notes[1] = notes[0]
            piece, last = Piece(unit), time.monotonic()
            return p

        running = None
        try:
            while True:
                running = self._rows.submit(step)
                while True:
                    try:
                        env = running.result(timeout=max(0.0, SECONDS_PER_PIECE - (time.monotonic() - last)))
                        break
                    except concurrent.futures.TimeoutError:  # the next row is a while coming
                        if piece.rows or notes[0] != notes[1]:
                            yield sent(piece, warnings=False)
                        else:
                            last = time.monotonic()
                running = None
                if env is None:
                    break
                seen += 1
                if seen <= skip:
                    continue
                piece.rows.append((env.row, env.rank))
                if env.context is not None and not env.row.miss:
                    if seen == skip + 1:
                        piece.prompt = env.context.prompt
                    for ref in plan.under:  # scored here, where the models are: the driver loads none
                        piece.scores[(ref.name, env.row.prefix, env.row.completion)] = env.context.score(
                            ref.name, env.row)
                if masses and not sent_mass:  # one Mass object per plan: its rows share it
                    piece.mass, sent_mass = masses[0], True
                if len(piece.rows) >= ROWS_PER_PIECE or time.monotonic() - last >= SECONDS_PER_PIECE:
                    yield sent(piece)
        except Error as e:
            piece.error = e
        finally:
            if running is not None and not running.done():  # this call was dropped while a row was computed
                cancel.set()
                concurrent.futures.wait([running])
        piece.done, piece.stop = True, (stopped[0] if stopped else None)
        piece.no_row, piece.fewest = (empty[0][1], empty[0][3]) if empty else ((), None)
        piece.floor = floors[0] if floors else None
        if masses and not sent_mass:
            piece.mass = masses[0]
        yield sent(piece)

    def cancel(self, call: int) -> bool:
        """Stop call ``call`` before its next model call (or before it starts)."""
        self._events.setdefault(call, threading.Event()).set()
        return True

    def info(self) -> dict:
        """This worker's process id and the GPUs Ray gave it (CUDA_VISIBLE_DEVICES)."""
        import os
        return {"pid": os.getpid(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
