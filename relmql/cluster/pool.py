"""An ordered, fault-tolerant map of query plans over a set of worker actors.

A ``Job`` is a list of plans (the data rows of a dataset query, or one query). The ``Pool``
hands consecutive plans of the queue to the workers in batches, keeps each worker at most
``depth`` calls ahead, and collects the ``Piece``s they stream back. A job is read in plan order
whatever order the workers finish in. A worker that dies is replaced by a fresh actor; the plans
it had not finished go back to the front of the queue, and their rows already received are not
sent again, so no row is lost or repeated (plans are pure: the same plan gives the same rows).
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from ..errors import Error
from ..execute import Cancelled, Mass, Row
from .worker import Piece

MAX_RETRIES = 3  # deaths of workers running the same plan before its job fails


@dataclass
class Unit:
    """One plan of a job and what has come back of it."""

    plan: Any
    pending: List[Tuple[Row, int]] = field(default_factory=list)  # received, not yet read
    received: int = 0  # rows received in all
    mass: Optional[Mass] = None
    done: bool = False
    stopped: bool = False
    warnings: str = ""
    error: Optional[BaseException] = None
    retries: int = 0


class Job:
    """The plans of one statement, read in order with ``read()``."""

    def __init__(self, pool: "Pool", plans: List[Any], batch: int):
        self.pool, self.batch = pool, max(1, batch)
        self.units = [Unit(p) for p in plans]
        self.cancelled = False
        self.started = False

    def start(self) -> None:
        """Queue the plans on the workers (once)."""
        if not self.started:
            self.started = True
            self.pool.submit(self)

    def read(self, cancel: Optional[threading.Event] = None):
        """``(unit, new rows, finished)`` for each unit in order, as its rows arrive; raises
        ``Cancelled`` when ``cancel`` is set (the workers stop at their next model call)."""
        self.start()
        finished = False
        try:
            for unit in self.units:
                while True:
                    if cancel is not None and cancel.is_set():
                        raise Cancelled("the query was cancelled")
                    if unit.pending:
                        new, unit.pending = unit.pending, []
                        yield unit, new, False
                    elif unit.done:
                        yield unit, [], True
                        break
                    else:
                        self.pool.pump(0.1)
            finished = True
        finally:
            if not finished:
                self.pool.cancel(self)


@dataclass
class _Call:
    actor: int
    handle: Any
    id: int
    job: Job
    units: List[int]  # indexes into job.units


class Pool:
    """Worker actors made by ``make(i)`` (a Ray actor handle of ``Worker``), ``size`` of them."""

    def __init__(self, ray, make: Callable[[int], Any], size: int, depth: int = 2):
        self.ray, self.make, self.depth = ray, make, depth
        self.actors = [make(i) for i in range(size)]
        self.calls: Dict[Any, _Call] = {}  # streaming generator -> call
        self.queue: Deque[Tuple[Job, int]] = deque()
        self.replaced = 0  # workers replaced after dying
        self.retried = 0  # plans sent again after their worker died
        self._ids = itertools.count()
        self._lock = threading.RLock()

    @property
    def size(self) -> int:
        return len(self.actors)

    def job(self, plans: List[Any]) -> Job:
        """A job of ``plans``, batched so that each worker gets about four calls of it."""
        return Job(self, plans, min(16, len(plans) // (4 * self.size)))

    def submit(self, job: Job) -> None:
        with self._lock:
            self.queue.extend((job, i) for i in range(len(job.units)))
            self._dispatch()

    def cancel(self, job: Job) -> None:
        """Drop ``job``'s queued plans and stop its running calls."""
        with self._lock:
            job.cancelled = True
            self.queue = deque(q for q in self.queue if q[0] is not job)
            for gen, call in list(self.calls.items()):
                if call.job is job:  # the worker stops at its next model call; what it sent is dropped
                    call.handle.cancel.remote(call.id)
                    del self.calls[gen]

    def pump(self, timeout: float) -> None:
        """Start calls on idle workers, then take in what the workers have sent (waiting up to
        ``timeout`` seconds for something)."""
        with self._lock:
            self._dispatch()
            if not self.calls:
                return
            ready, _ = self.ray.wait(list(self.calls), num_returns=1, timeout=timeout)
            for gen in ready:
                self._receive(gen)
            self._dispatch()

    def _dispatch(self) -> None:
        busy = [0] * len(self.actors)
        for call in self.calls.values():
            busy[call.actor] += 1
        for a in sorted(range(len(self.actors)), key=lambda a: busy[a]):
            while busy[a] < self.depth and self.queue:
                job, first = self.queue.popleft()
                units = [first]
                while (len(units) < job.batch and self.queue and self.queue[0][0] is job
                       and self.queue[0][1] == units[-1] + 1):
                    units.append(self.queue.popleft()[1])
                call = _Call(a, self.actors[a], next(self._ids), job, units)
                plans = [(job.units[u].plan, job.units[u].received) for u in units]
                gen = call.handle.run.options(num_returns="streaming").remote(call.id, plans)
                self.calls[gen] = call
                busy[a] += 1

    def _receive(self, gen) -> None:
        call = self.calls[gen]
        try:
            ref = next(gen)
        except StopIteration:
            del self.calls[gen]
            return
        except self.ray.exceptions.RayActorError:
            self._lost(gen)
            return
        try:
            piece: Piece = self.ray.get(ref)
        except self.ray.exceptions.RayActorError:
            self._lost(gen)
            return
        except self.ray.exceptions.RayTaskError as e:  # a bug in the worker, not a user error
            del self.calls[gen]
            for u in call.units:
                unit = call.job.units[u]
                if not unit.done:
                    unit.done, unit.error = True, e.as_instanceof_cause()
            return
        unit = call.job.units[call.units[piece.unit]]
        unit.pending.extend(piece.rows)
        unit.received += len(piece.rows)
        unit.mass = piece.mass or unit.mass
        if piece.done:
            unit.done, unit.stopped, unit.warnings, unit.error = True, piece.stopped, piece.warnings, piece.error

    def _lost(self, gen) -> None:
        """The worker of ``gen`` died: replace it (once) and queue its unfinished plans again."""
        call = self.calls.pop(gen)
        if self.actors[call.actor] is call.handle:
            try:
                self.ray.kill(call.handle, no_restart=True)
            except Exception:  # already gone
                pass
            self.actors[call.actor] = self.make(call.actor)
            self.replaced += 1
        if call.job.cancelled:
            return
        again = []
        for u in call.units:
            unit = call.job.units[u]
            if unit.done:
                continue
            unit.retries += 1
            if unit.retries > MAX_RETRIES:
                unit.done = True
                unit.error = Error(f"a worker died {MAX_RETRIES + 1} times running the same query; giving up",
                                   hint="see the Ray logs of the dead workers (out of memory?)")
                continue
            again.append((call.job, u))
            self.retried += 1
        self.queue.extendleft(reversed(again))

    def info(self) -> List[dict]:
        """Each worker's process id and GPUs (``Worker.info``)."""
        return self.ray.get([a.info.remote() for a in self.actors])

    def close(self) -> None:
        """Stop every worker."""
        with self._lock:
            for a in self.actors:
                try:
                    self.ray.kill(a, no_restart=True)
                except Exception:
                    pass
            self.actors, self.calls, self.queue = [], {}, deque()
