"""The worker side of the Ray engine: an actor that loads its models once and streams back each
plan's rows in ``Piece``s, then its ``QueryReport`` (docs/ray.md, "What runs where"). It does
not import Ray: ``relmql.cluster`` wraps ``Worker`` as an actor."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import io
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import Error
from ..execute import Mass, Row
from ..models import ModelCache
from ..engine import QueryReport
from ..records import Listener

ROWS_PER_PIECE = 256
SECONDS_PER_PIECE = 0.2


@dataclass
class Piece:
    """Part of one plan's result: ``rows`` (each with its rank) continue those sent before;
    ``warnings``: what the plan printed on stderr since the last piece; ``mass``: how a measured
    plan's language was measured (sent once, with the first piece that has it); ``done`` ends the
    plan, with its ``QueryReport`` and the ``Error`` it raised, if any; ``note``: the plan's
    progress note when it changed ("compiling the automaton", how many nodes the search for the
    next row has expanded; "" once over), else None."""

    unit: int  # position of the plan in the call
    rows: List[Tuple[Row, int]] = field(default_factory=list)
    mass: Optional[Mass] = None
    done: bool = False
    report: Optional[QueryReport] = None  # the plan's report, with ``done`` (its mass None where sent before)
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
        out = _Pieces(unit, cancel)
        rows = query_rows(plan, self.models, out)
        seen, running = 0, None
        try:
            while True:
                running = self._rows.submit(out.step, rows)
                env = yield from out.waiting(running)
                running = None
                if isinstance(env, _Ended):
                    out.end(env.report)
                    break
                seen += 1
                if seen > skip:
                    out.add(plan, env, first=seen == skip + 1)
                    if out.due():
                        yield out.sent()
        except Error as e:
            out.piece.error = e
        finally:
            if running is not None and not running.done():  # this call was dropped while a row was computed
                cancel.set()
                concurrent.futures.wait([running])
        out.piece.done = True
        yield out.sent()

    def cancel(self, call: int) -> bool:
        """Stop call ``call`` before its next model call (or before it starts)."""
        self._events.setdefault(call, threading.Event()).set()
        return True

    def info(self) -> dict:
        """This worker's process id and the GPUs Ray gave it (CUDA_VISIBLE_DEVICES)."""
        import os
        return {"pid": os.getpid(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}


@dataclass
class _Ended:
    """The end of a plan's rows: its report."""

    report: Optional[QueryReport]


class _Pieces(Listener):
    """The pieces of one plan as they fill: its rows, what it wrote on stderr (compile warnings,
    say), its latest progress note (it is the plan's listener), and when the next is due."""

    def __init__(self, unit: int, cancel: threading.Event):
        self.unit, self.cancel = unit, cancel
        self.piece, self.last = Piece(unit), time.monotonic()
        self.err = io.StringIO()
        self.latest = self.told = ""  # the latest note, the one last sent
        self.sent_mass = False

    def note(self, text: str) -> None:
        self.latest = text

    def step(self, rows):
        """The plan's next row, or ``_Ended`` (in the row thread, its stderr kept)."""
        with contextlib.redirect_stderr(self.err):
            try:
                return next(rows)
            except StopIteration as done:
                return _Ended(done.value)

    def waiting(self, running: concurrent.futures.Future):
        """The result of ``running``; meanwhile, every SECONDS_PER_PIECE, the rows held or a new note."""
        while True:
            try:
                return running.result(timeout=max(0.0, SECONDS_PER_PIECE - (time.monotonic() - self.last)))
            except concurrent.futures.TimeoutError:  # the next row is a while coming
                if self.piece.rows or self.latest != self.told:
                    yield self.sent(warnings=False)
                else:
                    self.last = time.monotonic()

    def add(self, plan, env, first: bool) -> None:
        """Row ``env`` into the piece (``first``: the first sent): its prompt and its scores under other models."""
        piece = self.piece
        piece.rows.append((env.row, env.rank))
        if env.context is not None and not env.row.miss:
            if first:
                piece.prompt = env.context.prompt
            for ref in plan.under:  # scored here, where the models are: the driver loads none
                piece.scores[(ref.name, env.row.prefix, env.row.completion)] = env.context.score(ref.name, env.row)
        if env.mass is not None and not self.sent_mass:  # one Mass object per plan: its rows share it
            piece.mass, self.sent_mass = env.mass, True

    def end(self, report: Optional[QueryReport]) -> None:
        """The plan's report into the last piece (its mass not sent again: the driver's rows have it)."""
        if report is not None and self.sent_mass:
            report = dataclasses.replace(report, mass=None)
        self.piece.report = report

    def due(self) -> bool:
        return len(self.piece.rows) >= ROWS_PER_PIECE or time.monotonic() - self.last >= SECONDS_PER_PIECE

    def sent(self, warnings: bool = True) -> Piece:
        """The piece to send, a new one begun."""
        p = self.piece
        if warnings:  # only between steps: the row thread writes them while it runs
            p.warnings = self.err.getvalue()
            self.err.seek(0)
            self.err.truncate()
        if self.latest != self.told:
            p.note = self.told = self.latest
        self.piece, self.last = Piece(self.unit), time.monotonic()
        return p
