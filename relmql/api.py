"""The Python API: ``connect()`` → ``Connection``; ``Connection.sql(text)`` → a lazy ``Result``.

    import relmql
    con = relmql.connect(model="tiny-gpt2")
    con.sql("SELECT text, prob MATCHING 'a(b|c)' LIMIT 2").show()
"""

from __future__ import annotations

import html
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

from .errors import Error, ModelError, closest
from .memory import approx_bytes, format_size
from .models import BUILTIN_MODELS, LanguageModel, ModelCache
from .output import render_table
from .output.format import format_value
from .plan import (OPTIONS, ModelRef, PlanError, QueryPlan, TestPlan, cell_weight, check_params, constant, defaults,
                   option, plan)
from .plan.expr import is_probability, weighs_cells
from .plan.options import shown
from .records import Cancelled, Stop, cancelling
from .stats import Chi2Result, chi2_independence
from .syntax import ast as A
from .syntax import parse

SHOW_WHAT = ("models", "options", "functions")


class Result:
    """The rows of one statement, computed lazily as they are read.

    Iterate for tuples in SELECT order; ``fetchone()``, ``fetchmany(n)``, ``fetchall()``,
    ``to_dicts()``, ``df()`` (pandas), ``show()``; ``explain()`` for the plan; ``cancel()`` stops
    a running query (from another thread) before its next model call; ``start()`` begins
    computing it in the background (Ray engine).

    Once rows are read, ``stops`` lists the bounds (``max_nodes``, ``max_nodes_per_row``,
    ``max_memory``) that ended a search before its language or LIMIT was exhausted, one per
    search (per data row of a dataset query): the rows are exact and in order, but more may
    exist. ``notes`` holds the notes and warnings the query wrote on stderr so far (``note: no
    rows: ...``, ``warning: the search stopped ...``), as written. ``approximate`` says why the
    numbers are approximate (a reduced dtype), or is None.

    A query that fails (an error, ``cancel()``, Ctrl-C) fails every later read too: the rows read
    before it stay in ``rows_so_far``, but no read returns them as if they were all.

    Rows read are kept, for a second read, ``rows_so_far`` and ``plot``, up to ``KEEP_BYTES``
    (about); past that none are kept and the query streams on (writing a million samples to a
    file holds no more), and reading the rows again raises an Error that says so.
    """

    KEEP_BYTES = 256 * 2 ** 20

    def __init__(self, columns: Sequence[str], rows: Callable[["Result"], Iterator[tuple]], kind: str = "rows",
                 explain: Optional[Callable[[], str]] = None, message: Optional[str] = None,
                 kinds: Optional[Sequence[str]] = None, test: Optional[TestPlan] = None,
                 start: Optional[Callable[[], None]] = None, stop: Optional[Callable[[], None]] = None,
                 streams: bool = False, probabilities: Sequence[str] = (), weights: Sequence[str] = (),
                 grouped: bool = False, judge: Optional[Callable[["Result"], Any]] = None):
        self.columns = tuple(columns)
        self.probabilities = frozenset(probabilities)  # columns that read a probability (chi2's weights)
        self.weights = tuple(weights)  # the columns that can weigh cells of grouped rows, as TEST takes them
        self.grouped = grouped  # each row is a group (an aggregate query)
        self.streams = streams  # rows arrive one by one (a query without aggregates), not all at the end
        self.kind = kind  # rows, text (EXPLAIN) or status (SET)
        self.message = message
        self.kinds = tuple(kinds or ["text"] * len(self.columns))
        self._make = rows
        self._iter: Optional[Iterator[tuple]] = None
        self._rows: List[tuple] = []  # the rows kept: rows _base, _base + 1, ... of the _count read
        self._base = self._count = self._kept_bytes = 0
        self._done = False
        self._cursor = 0  # rows handed out by fetchone/fetchmany/fetchall
        self._explain = explain
        self.cancelled = threading.Event()
        self.times: List[float] = []  # seconds from the first read to each row's arrival
        self._t0: Optional[float] = None
        self.test_plan = test
        self._test: Optional[Chi2Result] = None
        self._judge, self._verdict = judge, None
        self._start, self._stop = start, stop
        self.stops: List[Stop] = []
        self.notes: List[str] = []
        self.approximate: Optional[str] = None
        self._failed: Optional[BaseException] = None  # raised again by every later read
        self._reading = threading.RLock()  # one thread at a time advances the query

    @property
    def stopped(self) -> Optional[Stop]:
        """The first bound that stopped a search of this result (reads every row first), or None."""
        for _ in self:
            pass
        return self.stops[0] if self.stops else None

    def start(self) -> None:
        """Begin computing the rows now, in the background, where the engine can (the Ray
        engine queues the work on its workers); in-process, rows are computed as they are read."""
        if self._start is not None:
            self._start()

    # -- reading
    @property
    def rows_so_far(self) -> List[tuple]:
        """The rows computed so far (all of them once the query has ended), without running it on."""
        if self._base:
            raise self._not_kept()
        return list(self._rows)

    def _not_kept(self) -> Error:
        return Error(f"this result's rows were not kept: they came to more than {format_size(self.KEEP_BYTES)} "
                     f"({self._count:,} rows read), and each was handed out as it came",
                     hint="run the query again to read them again; write them to a file as they come "
                          "(relmql -o rows.jsonl) to keep them")

    def _next(self, have: int) -> Optional[tuple]:
        """Row ``have`` (computing it if no other reader has): None at the end."""
        with self._reading:
            if have < self._count:
                if have < self._base:
                    raise self._not_kept()
                return self._rows[have - self._base]
            if self._failed is not None:
                raise self._failed
            if self._done:
                return None
            if self.cancelled.is_set():  # a row received before the cancel (Ray's) is not handed out after it
                self._done = True
                self._failed = Cancelled("the query was cancelled")
                raise self._failed
            if self._iter is None:
                self._t0 = time.perf_counter()
                self._iter = self._make(self)
            _Progress.redraw()  # the row before is written: the bar back under it while this one is computed
            try:
                with cancelling(self.cancelled):  # any compile the row runs stops at its next checkpoint
                    row = next(self._iter)
            except StopIteration:
                self._done = True
                return None
            except KeyboardInterrupt:
                self._done = True
                self._failed = Cancelled(f"the query was interrupted after {len(self._rows):,} rows; "
                                         "its rows are incomplete")
                raise
            except BaseException as e:
                self._done = True
                self._failed = e
                raise
            self._count += 1
            if not self._base:
                self._rows.append(row)
                self.times.append(time.perf_counter() - self._t0)
                self._kept_bytes += approx_bytes(row) + 32  # and its time
                if self._kept_bytes > self.KEEP_BYTES:  # from here on, rows stream through
                    self._base, self._rows, self.times = self._count, [], []
            _Progress.clear()  # the row may be written to the same terminal
            return row

    def __iter__(self) -> Iterator[tuple]:
        i = 0
        while True:
            row = self._next(i)
            if row is None:
                return
            yield row
            i += 1

    def fetchone(self) -> Optional[tuple]:
        """The next row not yet fetched, or None."""
        with self._reading:
            row = self._next(self._cursor)
            if row is not None:
                self._cursor += 1
            return row

    def fetchmany(self, n: int = 1) -> List[tuple]:
        """The next ``n`` rows not yet fetched (fewer at the end)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise Error(f"fetchmany(n) takes a whole number of rows, 0 or more, not {shown(n)}")
        out = []
        for _ in range(n):
            row = self.fetchone()
            if row is None:
                break
            out.append(row)
        return out

    def fetchall(self) -> List[tuple]:
        """Every remaining row (all rows, on a fresh result)."""
        out = []
        while True:
            row = self.fetchone()
            if row is None:
                return out
            out.append(row)

    def to_dicts(self) -> List[Dict[str, Any]]:
        """Every row as a dict from column name to value."""
        return [dict(zip(self.columns, r)) for r in self]

    def df(self):
        """The rows as a pandas DataFrame (needs pandas)."""
        try:
            import pandas as pd
        except ImportError:
            raise Error("Result.df() needs pandas: pip install pandas") from None
        return pd.DataFrame(list(self), columns=list(self.columns))

    def _head(self, n: Optional[int]):
        """The first ``n`` rows (all with None) and whether more exist (computing one more)."""
        rows = []
        for r in self:
            rows.append(r)
            if n is not None and len(rows) > n:
                break
        return rows[:n], n is not None and len(rows) > n

    def show(self, max_rows: Optional[int] = 20, file=None) -> None:
        """Print up to ``max_rows`` rows as a table (None: all of them)."""
        file = file or sys.stdout
        if self.kind == "text":
            print("\n".join(r[0] for r in self), file=file)
            return
        if self.kind == "status":
            print(self.message, file=file)
            return
        rows, more = self._head(max_rows)
        print(render_table(self.columns, rows, more=more), file=file)
        if self.test_plan is not None:
            print(self.test.summary(), file=file)

    def explain(self) -> str:
        """The plan of this statement."""
        if self._explain is None:
            if self.kind == "text":  # the result of an EXPLAIN statement is the plan
                raise Error("this is the result of EXPLAIN: its rows are the plan's lines",
                            hint="read them with fetchall(), or print(result)")
            raise Error("only queries have a plan")
        return self._explain()

    def chi2(self, a: str, b: str, weight: Optional[str] = None, n_per_row: Optional[float] = None) -> Chi2Result:
        """The χ² test of independence of columns ``a`` and ``b`` over all rows, each adding its
        ``weight`` column (or 1) to its cell; ``n_per_row``: treat the cells as probabilities
        standing for that many draws per value of ``a`` (see ``relmql.stats.chi2_independence``);
        a weight that is a probability needs it, as probabilities carry no sample size. Grouped
        rows are weighed as TEST weighs them where ``weight`` is not given: by their
        probability() column, else their first other aggregate (count(*), sum(...))."""
        if weight is None and self.grouped:  # each row is a group, standing for many draws
            weight = cell_weight(a, b, self.weights, self.probabilities)
            if weight is None:
                raise Error(f"these rows are groups, and {a!r} and {b!r} leave no aggregate column to weigh them",
                            hint="group by two columns and count them: SELECT g, h, count(*) AS n ... GROUP BY g, h")
        for c in (a, b) + ((weight,) if weight else ()):
            if c not in self.columns:
                near = closest(c, self.columns)
                raise Error(f"no column {c!r} in this result" + (f"; did you mean {near}?" if near else ""),
                            hint=f"columns: {', '.join(self.columns)}")
        if weight in self.probabilities and n_per_row is None:  # tested as counts, any table is independent
            raise Error(f"the weight {weight!r} is a probability, which carries no sample size: say how many draws "
                        f"each value of {a!r} stands for",
                        hint=f"res.chi2({a!r}, {b!r}, weight={weight!r}, n_per_row=5000): TEST does so with the "
                             f"test_draws option (5000, the ReLM paper's draws per gender)")
        try:
            return chi2_independence(self.to_dicts(), a, b, weight, n_per_row)
        except ValueError as e:
            raise Error(f"cannot test independence: {e}") from None

    @property
    def expects(self) -> bool:
        """Whether the statement has an EXPECT."""
        return self._judge is not None

    @property
    def verdict(self):
        """The ``relmql.verdict.Verdict`` of the statement's EXPECT (its rows are read for it; an
        estimate that leaves it undecided draws more), or None without one."""
        if self._judge is None:
            return None
        if self._verdict is None:
            self._verdict = self._judge(self)
        return self._verdict

    @property
    def test(self) -> Optional[Chi2Result]:
        """The result of the statement's TEST clause (all rows are read for it), or None."""
        t = self.test_plan
        if t is None:
            return None
        if self._test is None:
            self._test = self.chi2(t.a, t.b, t.weight, t.n_per_row)
        return self._test

    def plot(self, path: str, kind: Optional[str] = None, log: bool = False, title: Optional[str] = None) -> str:
        """Draw the rows (all of them, read now if need be) into ``path`` (.png, .svg or .pdf):
        ``kind`` "bar" (grouped results), "cumulative" (rows over time) or "cdf" (of a numeric
        column); chosen from the columns when not given. Returns the kind drawn."""
        from .output.plot import plot
        rows = list(self)
        return plot(self.columns, rows, path, kind, log=log, title=title, times=self.times, kinds=self.kinds)

    def cancel(self) -> None:
        """Stop the query (from any thread) before its next model call; reading it then raises
        ``Cancelled``."""
        self.cancelled.set()
        if self._stop is not None:
            self._stop()

    def __len__(self) -> int:
        return sum(1 for _ in self)  # not len(list(self)): list() asks __len__ first

    def __bool__(self) -> bool:
        """Whether there is a row: computes at most the first (``len()`` computes them all)."""
        return self._next(0) is not None

    def __repr__(self) -> str:
        if self.kind == "status":
            return self.message or ""
        if self.kind == "text":
            return "\n".join(r[0] for r in self)
        rows, more = self._head(10)
        table = render_table(self.columns, rows, more=more)
        return table + ("\n" + self.test.summary() if self.test_plan is not None else "")

    def _repr_html_(self) -> str:
        if self.kind != "rows":
            return "<pre>" + html.escape(repr(self)) + "</pre>"
        rows, more = self._head(10)
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(format_value(v, 200))}</td>" for v in r) + "</tr>"
                       for r in rows)
        foot = f"<p>first {len(rows)} row{'s' if len(rows) != 1 else ''}; more not fetched</p>" if more else ""
        if self.test_plan is not None:
            foot += f"<p>{html.escape(self.test.summary())}</p>"
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{foot}"


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
            from .cluster import require_ray
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
        from .models.device import resolve_device
        try:
            resolve_device(settings["device"])
        except ModelError as e:
            e.span, e.source = span, source
            e.hint = ("SET device = DEFAULT (cpu here); the Ray engine (SET engine = 'ray', first) runs on the GPUs "
                      "of its workers")
            raise

    def cluster(self):
        """The Ray engine's workers for the current settings (started on first use)."""
        from .cluster import Cluster
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
        if isinstance(st, A.Query):
            return self._query(st, text, params)
        if isinstance(st, A.Explain):
            from .engine import keeping
            if st.query.expect is not None:
                raise PlanError("EXPLAIN shows a plan; EXPECT judges the rows of a query that runs: leave out "
                                "EXPLAIN (relmql test runs files of expectations)", st.query.expect.span, text)
            p = plan(st.query, text, self.settings, params)
            notes: List[str] = []  # the compiler's warnings, on the result
            lines = keeping(notes).run(self._explain, p).splitlines()
            result = Result(("plan",), lambda r: iter([(line,) for line in lines]), kind="text")
            result.notes = notes
            return result
        if isinstance(st, A.Set):
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
        if isinstance(st, A.Show):
            return self._show(st, text)
        raise Error(f"cannot run {type(st).__name__}")

    def _query(self, st: A.Query, text: str, params) -> Result:
        p = plan(st, text, self.settings, params)
        if p.expect is not None:
            from .verdict.rounds import first_round
            p, judge = first_round(p, self._result)
            return self._result(p, judge)
        return self._result(p)

    def _result(self, p, judge=None) -> Result:
        """The result of the plan ``p`` (``judge``: its EXPECT's, given the result)."""
        remote = self.cluster().statement(p) if self.settings["engine"] == "ray" else None

        def rows(result: Result) -> Iterator[tuple]:
            from .engine import keeping, load, run, say
            from .models.device import approximate
            self._check_open()
            bar = _Progress(self.progress)
            if isinstance(p, QueryPlan) and remote is None:
                try:  # before the clock starts: row times are the query's own
                    check_params(p)  # before the model loads
                    model = load(p, self.model, result.cancelled, bar.note)
                except BaseException:
                    bar.close()
                    raise
                result.approximate = model.approximate
                result._t0 = time.perf_counter()
            else:
                s = self.settings
                ref = p.model if isinstance(p, QueryPlan) else ModelRef(name=s["model"], device=s["device"],
                                                                        dtype=s["dtype"])
                result.approximate = approximate(ref.dtype, ref.device)
            steps = run(p, self.model, result.cancelled, bar.update, bar.total,
                        rows=remote.rows if remote is not None else None, stops=result.stops, on_note=bar.note)
            own = keeping(result.notes, _Progress)  # each step keeps its notes in this result's list
            if result.approximate is not None and result.approximate not in self._told:
                self._told.add(result.approximate)  # a reduced dtype's numbers, said with the first rows
                own.run(say, f"note: the numbers are {result.approximate}")
            try:
                while True:
                    row = own.run(next, steps, None)
                    if row is None:
                        return
                    yield row
            finally:
                own.run(steps.close)
                bar.close()

        return Result(p.columns, rows, explain=lambda: self._explain(p), kinds=[o.kind for o in p.outputs],
                      test=p.test, start=remote.start if remote is not None else None,
                      stop=remote.cancel if remote is not None else None, streams=not p.aggregate,
                      probabilities=[o.name for o in p.outputs if is_probability(o.expr)],
                      weights=[o.name for o in p.outputs if weighs_cells(o.expr)], grouped=p.aggregate,
                      judge=judge)

    def _explain(self, p) -> str:
        from .explain import explain  # the engine, and torch, only when a plan is explained
        return explain(p, self.model)

    def _show(self, st: A.Show, text: str) -> Result:
        what = st.what
        if what == "models":
            current = self.settings["model"]
            loaded = self.models.names()
            rows = [(name, name == current, name in loaded) for name in BUILTIN_MODELS]
            if current not in BUILTIN_MODELS:
                rows.append((current, True, current in loaded))
            return Result(("model", "default", "loaded"), lambda r: iter(rows), kinds=("text", "bool", "bool"))
        if what == "options":
            rows = [(name, self.settings[name], spec.default, spec.doc) for name, spec in OPTIONS.items()]
            return Result(("option", "value", "default", "meaning"), lambda r: iter(rows))
        if what == "functions":
            from .plan.expr import AGGREGATES, FUNCTIONS, ROW_FUNCTIONS
            rows = [(f.name, "scalar", f.doc) for f in FUNCTIONS.values()]
            rows += [(n, "row", d) for n, d in ROW_FUNCTIONS.items()]
            rows += [(n, "aggregate", d) for n, d in AGGREGATES.items()]
            return Result(("function", "kind", "meaning"), lambda r: iter(rows))
        if what in OPTIONS:  # SHOW topk: one option's value, as psql's SHOW name
            spec = OPTIONS[what]
            return Result(("option", "value", "default", "meaning"),
                          lambda r: iter([(what, self.settings[what], spec.default, spec.doc)]))
        near = closest(what, SHOW_WHAT + tuple(OPTIONS))
        word = text.lower().rfind(what, st.span[0], st.span[1])
        span = (word, word + len(what)) if word >= 0 else st.span
        raise PlanError(f"SHOW {what.upper()} is not known; SHOW " + " | ".join(w.upper() for w in SHOW_WHAT) +
                        " | an option's name", span, text,
                        hint=f"did you mean SHOW {near.upper() if near in SHOW_WHAT else near}?" if near else None)

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


class _Progress:
    """A tqdm bar on stderr, only on a terminal and only once a query has run for a second: rows
    and their rate, the estimated time left when the total is known (SAMPLE n, datasets,
    probability()), and how far the search for the next row has gone (``note``). The bars are
    taken off the screen while a ``Result`` hands out a row, and drawn again when the next one
    is asked for, so that rows written to the same terminal never run into a bar."""

    DELAY = 1.0
    MININTERVAL = 0.1  # seconds between redraws
    _live: List["_Progress"] = []  # the open bars

    def __init__(self, enabled: bool):
        self.bar = None
        self.shown = False  # drawn and not cleared since
        self.hidden = False  # cleared for a row, to be drawn again
        self._t0 = self._noted = time.monotonic()
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            # miniters=1: no redraws from tqdm's monitor thread, which clear() would not know of
            self.bar = tqdm(file=sys.stderr, delay=self.DELAY, mininterval=self.MININTERVAL, miniters=1, leave=False,
                            unit="row", dynamic_ncols=True)
            self.shown = self.DELAY <= 0  # tqdm draws it at once
            _Progress._live.append(self)

    def total(self, n: int, unit: str = "row") -> None:
        if self.bar is not None:
            self.bar.total, self.bar.unit = n, unit

    def update(self, n: int) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix_str("", refresh=False)  # the note was of the row now counted
        if self.bar.update(n):
            self.shown, self.hidden = True, False

    def note(self, text: str) -> None:
        """``text`` beside the count, drawn at once when the bar is due and was not drawn in the
        last MININTERVAL: a search between rows calls no ``update``, and may run for minutes."""
        if self.bar is None:
            return
        cleared = not text and self.bar.postfix  # a note that is over goes at once (the compile's)
        self.bar.set_postfix_str(text, refresh=False)
        now = time.monotonic()
        if not self.hidden and now - self._t0 >= self.DELAY and (cleared or now - self._noted >= self.MININTERVAL):
            self._noted = now
            self.bar.refresh()
            self.shown = True

    def close(self) -> None:
        if self.bar is not None:
            if self.shown:  # drawn by note() alone (no row yet), which tqdm's close takes as never drawn
                self.bar.clear()
            self.bar.close()
            self.bar.fp.flush()  # before the rows' last lines, on a stderr that is not line-buffered
            self.bar = None
            _Progress._live.remove(self)

    @classmethod
    def clear(cls) -> None:
        """Take the bars that are drawn off the screen, the cursor back at the start of their line."""
        for p in list(cls._live):
            if p.shown and p.bar is not None:
                p.bar.clear()
                p.bar.fp.flush()  # before the row, on a stderr that is not line-buffered
                p.shown, p.hidden = False, True

    @classmethod
    def redraw(cls) -> None:
        """Draw again the bars that ``clear`` took off."""
        for p in list(cls._live):
            if p.hidden and p.bar is not None:
                p.bar.refresh()
                p.shown, p.hidden = True, False


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
