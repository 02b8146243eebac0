"""The Ray engine: runs queries on worker actors of a Ray cluster instead of in this process.

Entry point: ``Cluster(address, workers, device, preload).statement(plan)`` → a ``Statement``
whose ``rows()`` are the same ``RowEnv``s, in the same order, that ``relmql.engine`` computes
in-process. Each worker loads its models once; the data rows of a dataset query are sharded over
the workers in batches; a single query runs whole on one worker (statements of a script run side
by side when started ahead with ``Statement.start()``). Ray is optional: ``require_ray()`` says
how to install it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
from typing import Iterator, List, Optional

from ..errors import Error
from ..plan import DatasetPlan, ModelRef, QueryPlan, plan_row, selected_rows
from ..rowcontext import portable_name
from .pool import Job, Pool
from .worker import Worker

INSTALL = "pip install 'relmql[ray]'"


def require_ray():
    """The ``ray`` module, or an ``Error`` that says how to install it."""
    try:
        import ray
    except ImportError:
        raise Error("the ray engine needs Ray, which is not installed", hint=f"install it: {INSTALL}") from None
    return ray


class Cluster:
    """Worker actors on a Ray cluster. ``address``: the cluster to join ('' starts a local Ray
    instance unless RAY_ADDRESS names one; 'auto' joins the running one; 'HOST:6379' a head
    node; Ray Client's 'ray://' cannot stream rows and is refused); ``workers``: how many
    (default: one per GPU when ``device`` is not cpu and the cluster has GPUs, otherwise one per
    CPU); ``preload``: the model each worker loads as it starts; ``threads``: each worker's torch
    threads (default: its share of the CPUs)."""

    def __init__(self, address: str = "", workers: Optional[int] = None, device: str = "cpu",
                 preload: Optional[ModelRef] = None, threads: Optional[int] = None):
        ray = require_ray()
        self.ray = ray
        self.owns_ray = False
        if address.startswith("ray://"):
            raise Error("ray_address: Ray Client (ray://) cannot stream rows back, which the ray engine needs",
                        hint="run relmql on a node of the cluster, with ray_address 'auto' or 'HEAD_IP:6379'")
        if not ray.is_initialized():
            try:
                _init(ray, address)
            except Exception as e:  # no cluster at that address, a version mismatch, ...
                raise Error(f"cannot start or join a Ray cluster{f' at {address}' if address else ''}: {e}",
                            hint="set ray_address to a running cluster ('auto' or 'HOST:6379'), or leave it "
                                 "empty for a local instance") from None
            self.owns_ray = True
        resources = ray.cluster_resources()
        cpus, gpus = float(resources.get("CPU", 1)), int(resources.get("GPU", 0))
        use_gpu = gpus > 0 and device != "cpu"
        n = workers or (gpus if use_gpu else max(1, int(cpus)))
        if use_gpu:
            if n > gpus:
                raise self._refused(Error(f"workers = {n} on GPUs needs {n} GPUs; the Ray cluster has {gpus}",
                                          hint="one worker per GPU: leave workers unset, or set device = 'cpu'"))
            opts, threads = {"num_gpus": 1, "num_cpus": 1}, threads or 1
        else:
            if n > max(int(cpus), 1):  # each worker a model of its own, sharing CPUs with the others
                raise self._refused(Error(f"workers = {n:,} on CPUs: the Ray cluster has {int(cpus)} CPUs, and "
                                          f"each worker loads a copy of the model",
                                          hint="at most one worker per CPU: leave workers unset (one per CPU)"))
            nodes = [n_["Resources"].get("CPU", 0) for n_ in ray.nodes() if n_.get("Alive")]
            share = cpu_share(nodes or [cpus], n)
            opts = {"num_cpus": share}
            threads = threads or max(1, int(share))
        actor = _actor_class()
        self.where = (f"{n} worker{'s' if n != 1 else ''} ({'1 GPU' if use_gpu else f'{threads} CPU thread'}"
                      f"{'' if use_gpu or threads == 1 else 's'} each) on "
                      f"{'a local Ray instance' if self.owns_ray and not address else 'the Ray cluster'}"
                      f" of {int(cpus)} CPUs{f' and {gpus} GPUs' if gpus else ''}")
        preload = _portable(preload) if preload is not None else None
        self.pool = Pool(ray, lambda i: actor.options(**opts).remote(threads, preload), n)

    def _refused(self, error: Error) -> Error:
        """``error``, to raise, once the Ray instance this cluster started is shut down."""
        if self.owns_ray:
            self.ray.shutdown()
        return error

    def statement(self, plan) -> "Statement":
        """The work of one planned statement (not started yet)."""
        return Statement(self.pool, plan)

    def close(self) -> None:
        """Stop the workers (and the Ray instance, when this cluster started it)."""
        self.pool.close()
        if self.owns_ray:
            self.ray.shutdown()


def _init(ray, address: str) -> None:
    """``ray.init`` in a thread that lives as long as this process. The local Ray processes it may
    start die with the thread that started them (seen: a query run from the shell's statement
    thread left the next query waiting forever on a dead instance)."""
    if threading.current_thread() is threading.main_thread():
        ray.init(address=address or None, logging_level=logging.WARNING)
        return
    done: "queue.Queue[Optional[BaseException]]" = queue.Queue()

    def keeper():
        # Ray notes that it cannot set its SIGTERM handler outside the main thread: it is this
        # thread by design, so the note is left out
        quiet = logging.getLogger("ray._private.worker")
        quiet.addFilter(_no_sigterm_note)
        try:
            ray.init(address=address or None, logging_level=logging.WARNING)
        except BaseException as e:  # handed to the caller
            done.put(e)
            return
        finally:
            quiet.removeFilter(_no_sigterm_note)
        done.put(None)
        threading.Event().wait()

    threading.Thread(target=keeper, name="relmql-ray", daemon=True).start()
    error = done.get()
    if error is not None:
        raise error


def cpu_share(node_cpus: List[float], n: int) -> float:
    """The CPUs each of ``n`` workers asks Ray for: the most that lets all ``n`` fit on nodes of
    ``node_cpus`` CPUs (a worker cannot span nodes), whole CPUs where possible."""
    fits = lambda share: sum(int(c / share + 1e-9) for c in node_cpus) >= n  # noqa: E731
    candidates = sorted({c / k for c in node_cpus if c > 0 for k in range(1, n + 1)}, reverse=True)
    return next((share for share in candidates if fits(share)), max(node_cpus) / n)


def _no_sigterm_note(record: logging.LogRecord) -> bool:
    return "SIGTERM handler is not set" not in record.getMessage()


@functools.lru_cache(maxsize=None)
def _actor_class():
    """``Worker`` as a Ray actor class, its control methods in a thread of their own so that a
    running call can be cancelled (Ray runs an actor's other methods one at a time)."""
    ray = require_ray()

    class RayWorker(Worker):
        @ray.method(concurrency_group="control")
        def cancel(self, call: int) -> bool:
            return Worker.cancel(self, call)

        @ray.method(concurrency_group="control")
        def info(self) -> dict:
            return Worker.info(self)

    return ray.remote(concurrency_groups={"control": 1})(RayWorker)


def _portable(ref: ModelRef) -> ModelRef:
    """``ref`` with a local model directory named by its absolute path (workers run elsewhere)."""
    return dataclasses.replace(ref, name=portable_name(ref.name))


def _portable_plan(plan: QueryPlan) -> QueryPlan:
    return dataclasses.replace(plan, model=_portable(plan.model), models=tuple(_portable(m) for m in plan.models),
                               under=tuple(_portable(m) for m in plan.under))


def _row_plan(dplan: DatasetPlan, data):
    """The plan of one data row, or the ``Error`` that planning it raised (raised when the rows
    before it have been read, as in-process)."""
    try:
        return _portable_plan(plan_row(dplan, data))
    except Error as e:
        return e


class Statement:
    """One query statement on the cluster: ``start()`` queues its work; ``rows(...)`` reads it
    back in order as ``RowEnv``s (arguments as ``relmql.engine.run`` takes them)."""

    def __init__(self, pool: Pool, plan):
        self.plan = plan
        self.pool = pool
        self._job: Optional[Job] = None
        self.selected = None  # a dataset's data row of each unit
        self.rows_total = 0
        self.row_ends: set = set()  # the units that end their data row (its last model's)

    def _make(self) -> Job:
        if self._job is None:
            if isinstance(self.plan, DatasetPlan):
                self.selected = []
                plans = []
                for data in selected_rows(self.plan):
                    got = _row_plan(self.plan, data)
                    for one in (got.per_model() if isinstance(got, QueryPlan) else (got,)):
                        self.selected.append(data)  # each unit's data row (several units a row with FROM's list)
                        plans.append(one)
                self.rows_total = len({id(d) for d in self.selected})
                self.row_ends = {i for i in range(len(plans))  # a data row is done with its last unit
                                 if i + 1 == len(plans) or self.selected[i + 1] is not self.selected[i]}
            else:
                plans = list(_portable_plan(self.plan).per_model())
            self._job = self.pool.job(plans)
        return self._job

    def start(self) -> None:
        self._make().start()

    def cancel(self) -> None:
        """Drop the queued work and stop the running calls (from any thread)."""
        if self._job is not None:
            self.pool.cancel(self._job)

    def rows(self, listener) -> Iterator:
        """The plan's rows as ``RowEnv``s, in the order the engine computes them in process, and
        each query's notes from its ``QueryReport`` as in process; returns the reports (a
        ``relmql.engine.RowSource``)."""
        from ..rowcontext import RowContext
        from ..engine import RowEnv, closing_notes, ended, in_data_row, match_regex, say
        job = self._make()
        dataset = isinstance(self.plan, DatasetPlan)
        if dataset:
            listener.total(self.rows_total)
        reports = []
        current = regex = None
        position = {id(u): i for i, u in enumerate(job.units)}
        for unit, rows, warnings, note, finished in job.read(listener.cancel):
            at = position[id(unit)]
            for line in warnings.splitlines():  # what the worker wrote on its stderr
                say(line)
            if unit is not current:
                current, regex = unit, (match_regex(unit.plan) if unit.plan is not None else None)
            context = RowContext(unit.plan, None, unit.prompt, unit.scores) if unit.plan is not None else None
            for row, rank in rows:
                if not dataset:
                    listener.progress(1)
                yield RowEnv(unit.plan, row, rank, regex, unit.mass, context)
            if note is not None:  # of the search after these rows
                listener.note(note)
            if not finished:
                continue
            if unit.error is not None:
                if dataset and isinstance(unit.error, Error):  # as in-process: which data row
                    raise in_data_row(unit.error, self.plan, self.selected[at].get("row_number"))
                raise unit.error
            if dataset and unit.received == 0 and unit.mass is None:
                yield RowEnv(unit.plan, None, None, regex, None, context)  # the row still counts, as in-process
            ended(unit.report, listener, dataset)
            reports += [unit.report] if unit.report is not None else []
            if dataset and at in self.row_ends:
                listener.progress(1)
        for line in closing_notes(reports, self.rows_total if dataset else None):
            say(line)
        return reports


__all__ = ["Cluster", "Statement", "require_ray", "cpu_share", "INSTALL"]
