"""An ordered, fault-tolerant map of query plans over worker actors: a ``Job``'s plans go out in
batches and are read back in plan order; a dead worker's unfinished plans are queued again
(docs/ray.md, "When a worker dies")."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from ..errors import Error
from ..execute import Mass, Row
from ..records import Cancelled
from .worker import Piece

MAX_RETRIES = 3  # deaths of workers running the same plan before its job fails


@dataclass
class Unit:
    """One plan of a job and what has come back of it (a plan that failed to plan is done from
    the start, with its error)."""

    plan: Any
    pending: List[Tuple[Row, int]] = field(default_factory=list)  # received, not yet read
    received: int = 0  # rows received in all
    mass: Optional[Mass] = None
    done: bool = False
    report: Any = None  # the plan's relmql.engine.QueryReport, once it is done (None: LIMIT 0, or an error)
    warnings: str = ""  # received, not yet shown
    note: Optional[str] = None  # the plan's progress note, received and not yet shown
    error: Optional[BaseException] = None
    retries: int = 0
    prompt: Optional[str] = None  # the prompt as the model read it
    scores: Dict[tuple, Optional[float]] = field(default_factory=dict)  # logprob_under() of its rows


class Job:
    """The plans of one statement, read in order with ``read()``. A plan may be an ``Error``
    (its data row could not be planned): reading reaches it in its turn and raises it."""

    def __init__(self, pool: "Pool", plans: List[Any], batch: int):
        self.pool, self.batch = pool, max(1, batch)
        self.units = [Unit(None, done=True, error=p) if isinstance(p, Error) else Unit(p) for p in plans]
        self.cancelled = False
        self.started = False

    def start(self) -> None:
        """Queue the plans on the workers (once)."""
        if not self.started:
            self.started = True
            self.pool.submit(self)

    def read(self, cancel: Optional[threading.Event] = None):
        """``(unit, new rows, warnings, note, finished)`` for each unit in order, as its rows
        arrive (``note``: its progress note when that changed, else None); raises ``Cancelled``
        when ``cancel`` is set (the workers stop at their next model call)."""
        self.start()
        finished = False
        try:
            for unit in self.units:
                while True:
                    if cancel is not None and cancel.is_set():
                        raise Cancelled("the query was cancelled")
                    with self.pool.lock:
                        new, unit.pending = unit.pending, []
                        warnings, unit.warnings = unit.warnings, ""
                        note, unit.note = unit.note, None
                        done = unit.done
                    if new or warnings or note is not None or done:
                        yield unit, new, warnings, note, done
                        if done:
                            break
                    elif not self.pool.pump(0.1):
                        raise Error("the Ray workers of this query were stopped before it finished",
                                    hint="changing workers, threads, ray_address or device, or closing the "
                                         "connection, stops them; run the query again")
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


def _model_of(plan) -> Any:
    """The model a unit's plan runs on (None for a unit that failed to plan)."""
    return getattr(plan, "model", None)


class Pool:
    """Worker actors made by ``make(i)`` (a Ray actor handle of ``Worker``), ``size`` of them."""

    def __init__(self, ray, make: Callable[[int], Any], size: int, depth: int = 2):
        self.ray, self.make, self.depth = ray, make, depth
        self.actors = [make(i) for i in range(size)]
        self.calls: Dict[Any, _Call] = {}  # streaming generator -> call
        self.queue: Deque[Tuple[Job, int]] = deque()
        self.closed = False
        self.jobs = 0  # jobs submitted
        self.replaced = 0  # workers replaced after dying
        self.retried = 0  # plans sent again after their worker died
        self.resumed = 0  # of those, plans whose first rows had already come back
        self._ids = itertools.count()
        self.lock = threading.RLock()
        self.homes: Dict[Any, int] = {}  # a model -> the worker that last ran it (it holds the model loaded)

    @property
    def size(self) -> int:
        return len(self.actors)

    def job(self, plans: List[Any]) -> Job:
        """A job of ``plans``, batched so that each worker gets about four calls of it."""
        if self.closed:
            raise Error("the Ray workers of this session were stopped", hint="run the statement again")
        return Job(self, plans, min(16, len(plans) // (4 * self.size)))

    def submit(self, job: Job) -> None:
        with self.lock:
            self.jobs += 1
            self.queue.extend((job, i) for i, u in enumerate(job.units) if not u.done)
            self._dispatch()

    def cancel(self, job: Job) -> None:
        """Tell the workers running ``job`` to stop (at their next model call); its queued plans
        and calls are dropped at the next ``pump``. This may run in a garbage collection inside
        another job's ``pump``, so it changes no table of the pool."""
        with self.lock:
            job.cancelled = True
            for call in list(self.calls.values()):
                if call.job is job:
                    call.handle.cancel.remote(call.id)

    def pump(self, timeout: float) -> bool:
        """Start calls on idle workers, then take in what the workers have sent (waiting up to
        ``timeout`` seconds for something). False when there is nothing queued or running."""
        with self.lock:
            self._reap()
            self._dispatch()
            if not self.calls:
                return bool(self.queue)
            ready, _ = self.ray.wait(list(self.calls), num_returns=1, timeout=timeout)
            for gen in ready:
                self._receive(gen)
            self._dispatch()
            return True

    def _reap(self) -> None:
        """Forget the calls and queued plans of cancelled jobs; tell their workers to stop."""
        for gen, call in list(self.calls.items()):
            if call.job.cancelled:  # told to stop by cancel(); what it sent is dropped
                del self.calls[gen]
        if any(job.cancelled for job, _ in self.queue):
            self.queue = deque(q for q in self.queue if not q[0].cancelled)

    def _dispatch(self) -> None:
        if self.closed:
            return
        busy = [0] * len(self.actors)
        for call in list(self.calls.values()):
            busy[call.actor] += 1
        while self.queue:
            job, first = self.queue[0]
            model = _model_of(job.units[first].plan)
            home = self.homes.get(model)
            # the least busy worker; among equals the one that holds the model, else one that holds none
            a = min(range(len(self.actors)), key=lambda i: (busy[i], i != home, i in self.homes.values()))
            if busy[a] >= self.depth:
                return
            self.queue.popleft()
            if job.cancelled:
                continue
            self.homes[model] = a
            units = [first]
            while (len(units) < job.batch and self.queue and self.queue[0][0] is job
                   and self.queue[0][1] == units[-1] + 1 and _model_of(job.units[self.queue[0][1]].plan) == model):
                units.append(self.queue.popleft()[1])
            call = _Call(a, self.actors[a], next(self._ids), job, units)
            plans = [(job.units[u].plan, job.units[u].received) for u in units]
            gen = call.handle.run.options(num_returns="streaming").remote(call.id, plans)
            self.calls[gen] = call
            busy[a] += 1

    def _receive(self, gen) -> None:
        call = self.calls.get(gen)
        if call is None:
            return
        try:
            piece: Piece = self.ray.get(next(gen))
        except StopIteration:
            del self.calls[gen]
            self._requeue(call, charge=False)  # a call that ended early (cancelled by mistake): run the rest again
            return
        except self.ray.exceptions.RayActorError as e:
            self._lost(gen, e)
            return
        except self.ray.exceptions.RayTaskError as e:  # a bug in the worker, not a user error
            del self.calls[gen]
            self._fail(call, e.as_instanceof_cause())
            return
        if call.job.cancelled:
            return
        unit = call.job.units[call.units[piece.unit]]
        unit.pending.extend(piece.rows)
        unit.received += len(piece.rows)
        unit.warnings += piece.warnings
        if piece.note is not None:
            unit.note = piece.note
        if unit.mass is None:
            unit.mass = piece.mass
        if piece.prompt is not None:
            unit.prompt = piece.prompt
        unit.scores.update(piece.scores)
        if piece.done:
            unit.done, unit.error, unit.report = True, piece.error, piece.report
            if piece.report is not None:  # one Mass object for the rows and the report (probability() tells
                unit.mass = unit.mass if unit.mass is not None else piece.report.mass  # measurements apart by it)
                piece.report.mass = unit.mass

    def _fail(self, call: _Call, error: BaseException) -> None:
        for u in call.units:
            unit = call.job.units[u]
            if not unit.done:
                unit.done, unit.error = True, error

    def _lost(self, gen, error) -> None:
        """The worker of ``gen`` died: replace it (once) and queue its unfinished plans again."""
        call = self.calls.pop(gen)
        if self.actors[call.actor] is call.handle:
            try:
                self.ray.kill(call.handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
            self.actors[call.actor] = self.make(call.actor)
            self.replaced += 1
        if getattr(error, "actor_init_failed", False):  # it never started: a retry would fail the same way
            self._fail(call, Error(f"a Ray worker could not start: {error}",
                                   hint="relmql, torch and the model must be installed on every node of the "
                                        "cluster (see docs/ray.md)"))
            return
        self._requeue(call, charge=True)

    def _requeue(self, call: _Call, charge: bool) -> None:
        """Queue ``call``'s unfinished plans again, at the front. With ``charge``, its first
        unfinished plan (the one that was running; those after it had not started) counts a
        retry, and fails its job after ``MAX_RETRIES``."""
        if call.job.cancelled:
            return
        again = [u for u in call.units if not call.job.units[u].done]
        if charge and again:
            unit = call.job.units[again[0]]
            unit.retries += 1
            if unit.retries > MAX_RETRIES:
                unit.done = True
                unit.error = Error(f"a worker died {MAX_RETRIES + 1} times running the same query; giving up",
                                   hint="see the Ray logs of the dead workers (out of memory?)")
                again = again[1:]
        self.retried += len(again)
        self.resumed += sum(1 for u in again if call.job.units[u].received)
        self.queue.extendleft((call.job, u) for u in reversed(again))

    def info(self) -> List[dict]:
        """Each worker's process id and GPUs (``Worker.info``)."""
        return self.ray.get([a.info.remote() for a in self.actors])

    def close(self) -> None:
        """Stop every worker; jobs not finished then fail when read."""
        with self.lock:
            self.closed = True
            for a in self.actors:
                try:
                    self.ray.kill(a, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            self.actors, self.calls, self.queue = [], {}, deque()
