"""A ``Connection``: its settings, its loaded models, and its statements run (``sql``)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

from ..errors import Error, ModelError
from ..models import LanguageModel, ModelCache
from ..output.bars import RowBar, noting
from ..plan import ModelRef, PlanError, QueryPlan, constant, defaults, option, plan
from ..plan.expr import is_probability, weighs_cells
from ..plan.options import shown
from ..records import Listener
from ..syntax import ast as A
from ..syntax import parse
from .interrupts import interruptible
from .result import Result
from .show import show


def _bare_word(node: A.Node) -> Optional[str]:
    """The text of a SET value written as a bare word, as FROM takes a model name (``all``,
    ``tiny-gpt2``, ``gemma3-270m``, ``2GiB``: the parser reads it as a column's name)."""
    return node.name if isinstance(node, A.Column) else None


class Connection:
    """A session: a default model, option settings (``SET``) and the models loaded so far.

    ``connect(model="tiny-gpt2", device="cpu", seed=0, topk=40)``: any option of ``SHOW OPTIONS``
    may be given as a keyword. ``engine="ray"`` runs queries on the workers of a Ray cluster
    (``address``: which one; see ``docs/ray.md``). ``progress``: show progress bars on stderr for
    long queries.
    """

    def __init__(self, model: Optional[str] = None, device: Optional[str] = None, dtype: Optional[str] = None,
                 seed: Optional[int] = None, progress: bool = False, engine: Optional[str] = None,
                 address: Optional[str] = None, **options):
        self.settings: Dict[str, Any] = defaults()
        self.param_defaults: Dict[str, Any] = {}  # SET :name = value, where the caller binds no value
        self.models = ModelCache()  # the models loaded so far
        self._cluster = None
        self._cluster_key: Optional[tuple] = None  # the settings it was started with
        self._told: set = set()  # the approximate-numbers notes already given (once a session each)
        self.closed = False
        given = dict(options, engine=engine, model=model, device=device, dtype=dtype, seed=seed)  # engine first:
        # whether a GPU device must be on this machine depends on it
        if address is not None:  # else ray_address=, as any option, may be among the options
            given["ray_address"] = address
        for name, value in given.items():
            if value is not None:
                self.set(name, value)
        if not isinstance(progress, bool):
            raise PlanError(f"progress is True or False, not {progress!r}")
        self.progress = progress

    # -- settings
    def set(self, name: str, value, span=None, source=None) -> None:
        """``SET name = value``."""
        self._check_open()
        spec = option(name)
        value = spec.check(value, span, source)
        if spec.name == "engine" and value == "ray":
            from ..cluster import require_ray
            try:
                require_ray()
            except Error as e:
                e.span, e.source = span, source
                raise
        if spec.name == "threads" and value is not None:
            import torch
            torch.set_num_threads(value)
        if spec.name in ("device", "engine"):
            self._check_gpu(dict(self.settings, **{spec.name: value}), span, source)
        self.settings[spec.name] = value

    @staticmethod
    def _check_gpu(settings: Dict[str, Any], span, source) -> None:
        """Refuse a CUDA device the in-process engine would not find on this machine (when it is
        set, not at the next query); the Ray engine's workers may have the GPUs this one lacks."""
        if settings["engine"] == "ray" or not str(settings["device"] or "").startswith("cuda"):
            return
        from ..models.device import resolve_device
        try:
            resolve_device(settings["device"])
        except ModelError as e:
            e.span, e.source = span, source
            e.hint = ("SET device = DEFAULT (cpu here); the Ray engine (SET engine = 'ray', first) runs on the GPUs "
                      "of its workers")
            raise

    def cluster(self):
        """The Ray engine's workers for the current settings (started on first use)."""
        from ..cluster import Cluster
        s = self.settings
        key = (s["ray_address"], s["workers"], s["device"] != "cpu", s["threads"])
        if self._cluster is not None and self._cluster_key != key:
            self._cluster.close()
            self._cluster = None
        if self._cluster is None:
            preload = ModelRef(name=s["model"], device=s["device"], dtype=s["dtype"])
            self._cluster = Cluster(s["ray_address"], s["workers"], s["device"], preload, s["threads"])
            self._cluster_key = key
            print(f"ray: {self._cluster.where}", file=sys.stderr)
        return self._cluster

    # -- models
    def model(self, ref: Optional[ModelRef] = None) -> LanguageModel:
        """The model of ``ref`` (default: the session's), loaded once per session."""
        self._check_open()
        return self.models(ref or ModelRef(name=self.settings["model"], device=self.settings["device"],
                                           dtype=self.settings["dtype"]))

    # -- statements
    def sql(self, text: str, params: Optional[Mapping[str, Any]] = None) -> Result:
        """Run ``text`` (one or more statements); the last statement's ``Result`` (lazy for
        queries), the ones before it run to completion first. ``params``: the values of the
        statements' ``:name`` parameters, by name (``"n"`` or ``":n"``, as it is written)."""
        if params is not None and not isinstance(params, Mapping):
            raise PlanError(f"params is a mapping from parameter names to values, such as {{'n': 3}}, "
                            f"not {type(params).__name__}")
        if params is not None and any(isinstance(k, str) and k.startswith(":") for k in params):
            params = {k[1:] if isinstance(k, str) and k.startswith(":") else k: v for k, v in params.items()}
        statements = parse(text)
        if not statements:
            return Result((), lambda r: iter(()), kind="status", message="")
        for st in statements[:-1]:
            for _ in self._statement(st, text, params):
                pass
        return self._statement(statements[-1], text, params)

    def execute(self, text: str, params: Optional[Mapping[str, Any]] = None) -> Result:
        """The same as ``sql``."""
        return self.sql(text, params)

    def statements(self, text: str, params: Optional[Mapping[str, Any]] = None) -> List["Connection.Statement"]:
        """The statements of the script ``text``, parsed (a syntax error is raised here, before any
        runs), each with ``run()``, which runs it and gives its ``Result`` (lazy for queries): for
        the shell and the CLI, which show each statement's result (``sql`` gives the last one's)."""
        return [Connection.Statement(st, lambda st=st: self._statement(st, text, params)) for st in parse(text)]

    class Statement:
        """One statement of a script (``Connection.statements``)."""
        __slots__ = ("node", "run")

        def __init__(self, node: A.Node, run: Callable[[], Result]):
            self.node = node  # the parsed statement (relmql.syntax.ast)
            self.run = run  # runs it: its Result, made when called (a SET applies then)

    def _statement(self, st, text: str, params) -> Result:
        self._check_open()
        run = _RUNS.get(type(st))
        if run is None:
            raise Error(f"cannot run {type(st).__name__}")
        if self.param_defaults and not isinstance(st, (A.SetParam, A.Show)):  # the caller's values win
            params = {**self.param_defaults, **(params or {})}
        return run(self, st, text, params)

    def _explain_statement(self, st: A.Explain, text: str, params) -> Result:
        from ..engine import speaking
        if st.query.expect is not None:
            raise PlanError("EXPLAIN shows a plan; EXPECT judges the rows of a query that runs: leave out "
                            "EXPLAIN (relmql test runs files of expectations)", st.query.expect.span, text)
        p = plan(st.query, text, self.settings, params)
        notes: List[str] = []  # the compiler's warnings, on the result
        with interruptible(threading.Event()):  # Ctrl-C stops a long compile
            lines = speaking(noting(notes)).run(self._explain, p).splitlines()
        result = Result(("plan",), lambda r: iter([(line,) for line in lines]), kind="text")
        result.notes = notes
        return result

    def _set(self, st: A.Set, text: str, params) -> Result:
        spec = option(st.name, st.name_span, text)
        bare = _bare_word(st.value)
        if bare is not None and bare.lower() == "default":  # SET topk = DEFAULT, as PostgreSQL's
            self.settings[spec.name] = spec.default  # valid as it is
        else:
            # SET tokenization = all, SET model = tiny-gpt2: a bare word is a value
            value = bare if bare is not None else constant(st.value, dict(params or {}), text, "SET")
            self.set(spec.name, value, st.value.span, text)
        now = self.settings[spec.name]
        now = now if isinstance(now, str) else shown(now)  # NULL, TRUE; text unquoted: SET tokenization = all
        default = " (the default)" if self.settings[spec.name] == spec.default else ""
        return Result((), lambda r: iter(()), kind="status", message=f"SET {spec.name} = {now}{default}")

    def _set_param(self, st: A.SetParam, text: str, params) -> Result:
        name, bare = st.name, _bare_word(st.value)
        if bare is not None and bare.lower() == "default":
            self.param_defaults.pop(name, None)
            message = f"SET :{name} = DEFAULT (no value unless the caller binds one)"
        else:
            value = bare if bare is not None else constant(st.value, {**self.param_defaults, **(params or {})},
                                                           text, "SET")
            self.param_defaults[name] = value
            message = f"SET :{name} = {shown(value)}"
        if params and name in params:
            message += f" (the caller's :{name} = {shown(params[name])} wins)"
        return Result((), lambda r: iter(()), kind="status", message=message)

    def _show(self, st: A.Show, text: str, params) -> Result:
        return show(st, text, self.settings, self.models.names(), self.param_defaults, params)

    def _query(self, st: A.Query, text: str, params) -> Result:
        p = plan(st, text, self.settings, params)
        if p.expect is not None:
            from ..verdict.rounds import first_round
            p, judge = first_round(p, self._result)
            return self._result(p, judge)
        return self._result(p)

    def _result(self, p, judge=None) -> Result:
        """The result of the plan ``p`` (``judge``: its EXPECT's, given the result)."""
        remote = self.cluster().statement(p) if self.settings["engine"] == "ray" else None

        def rows(result: Result) -> Iterator[tuple]:
            from ..engine import run, speaking
            from ..models.device import approximate
            self._check_open()
            watch = _Watch(self, result, RowBar(self.progress))
            own = speaking(noting(result.notes))  # each step keeps its notes in this result's list
            if not isinstance(p, QueryPlan) or remote is not None:  # no model loads here: the numbers as set
                s = self.settings
                ref = p.model if isinstance(p, QueryPlan) else ModelRef(name=s["model"], device=s["device"],
                                                                        dtype=s["dtype"])
                own.run(watch.approximate, approximate(ref.dtype, ref.device))
            steps = run(p, self.model, watch, source=remote.rows if remote is not None else None)
            try:
                while True:
                    row = own.run(next, steps, None)
                    if row is None:
                        return
                    yield row
            finally:
                own.run(steps.close)
                watch.bar.close()

        return Result(p.columns, rows, explain=lambda: self._explain(p), kinds=[o.kind for o in p.outputs],
                      test=p.test, start=remote.start if remote is not None else None,
                      stop=remote.cancel if remote is not None else None, streams=not p.aggregate,
                      probabilities=[o.name for o in p.outputs if is_probability(o.expr)],
                      weights=[o.name for o in p.outputs if weighs_cells(o.expr)], grouped=p.aggregate,
                      judge=judge)

    def _explain(self, p) -> str:
        from ..explain import explain  # the engine, and torch, only when a plan is explained
        return explain(p, self.model)

    def _check_open(self) -> None:
        if self.closed:
            raise Error("the connection is closed", hint="open another with relmql.connect()")

    def close(self) -> None:
        """Forget the loaded models and stop the Ray engine's workers: the connection, and the
        results of its queries that have not run yet, cannot be used any more."""
        self.closed = True
        self.models.clear()
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# how each kind of statement runs
_RUNS: Dict[type, Callable[..., Result]] = {A.Query: Connection._query, A.Explain: Connection._explain_statement,
                                           A.Set: Connection._set, A.SetParam: Connection._set_param,
                                           A.Show: Connection._show}


class _Watch(Listener):
    """What a query running in process tells its ``Result``: its progress to the bar, its stops to
    the result, and, once its model is loaded, whether its numbers are approximate (the clock of
    the row times starts there)."""

    def __init__(self, con: "Connection", result: Result, bar: RowBar):
        self.con, self.result, self.bar, self.cancel = con, result, bar, result.cancelled
        self._loaded = False

    def loaded(self, model) -> None:
        if not self._loaded:
            self._loaded = True
            self.approximate(model.approximate)
            self.result._t0 = time.perf_counter()  # row times are the query's own, not the model's load

    def approximate(self, why: Optional[str]) -> None:
        """The numbers are approximate for reason ``why`` (a reduced dtype; None: exact): said once a session."""
        from ..engine import say
        self.result.approximate = why
        if why is not None and why not in self.con._told:
            self.con._told.add(why)  # a reduced dtype's numbers, said with the first rows
            say(f"note: the numbers are {why}")

    def total(self, n: int, unit: str = "row") -> None:
        self.bar.total(n, unit)

    def progress(self, n: int = 1) -> None:
        self.bar.update(n)

    def note(self, text: str) -> None:
        self.bar.note(text)

    def ended(self, report) -> None:
        if report.stop is not None:
            self.result.stops.append(report.stop)


_default: Optional[Connection] = None


def connect(model: Optional[str] = None, device: Optional[str] = None, dtype: Optional[str] = None,
            seed: Optional[int] = None, engine: Optional[str] = None, address: Optional[str] = None,
            **options) -> Connection:
    """A new ``Connection`` (see its docstring for the arguments)."""
    return Connection(model=model, device=device, dtype=dtype, seed=seed, engine=engine, address=address, **options)


def sql(text: str, params: Optional[Mapping[str, Any]] = None) -> Result:
    """``text`` on the default connection (the embedded model on the CPU)."""
    global _default
    if _default is None:
        _default = Connection()
    return _default.sql(text, params)
