"""A statement's ``Result``: its rows computed lazily as they are read, kept for a second read,
and what can be asked of them (a table, a DataFrame, a χ² test, a verdict, a plot)."""

from __future__ import annotations

import html
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

from ..errors import Error, closest
from ..memory import approx_bytes, format_size
from ..output import render_table
from ..output.bars import RowBar
from ..output.format import format_value
from ..plan import TestPlan, cell_weight
from ..plan.options import shown
from ..records import Cancelled, Stop
from ..stats import Chi2Result, chi2_independence
from .interrupts import interruptible


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
            RowBar.redraw()  # the row before is written: the bar back under it while this one is computed
            try:
                with interruptible(self.cancelled):  # any compile the row runs stops at its next checkpoint
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
            RowBar.clear()  # the row may be written to the same terminal
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
        return _chi2(self, a, b, weight, n_per_row)

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
        from ..output.plot import plot
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


def _chi2(result: Result, a: str, b: str, weight: Optional[str], n_per_row: Optional[float]) -> Chi2Result:
    """``Result.chi2``: its columns and weight checked, then the test."""
    if weight is None and result.grouped:  # each row is a group, standing for many draws
        weight = cell_weight(a, b, result.weights, result.probabilities)
        if weight is None:
            raise Error(f"these rows are groups, and {a!r} and {b!r} leave no aggregate column to weigh them",
                        hint="group by two columns and count them: SELECT g, h, count(*) AS n ... GROUP BY g, h")
    for c in (a, b) + ((weight,) if weight else ()):
        if c not in result.columns:
            near = closest(c, result.columns)
            raise Error(f"no column {c!r} in this result" + (f"; did you mean {near}?" if near else ""),
                        hint=f"columns: {', '.join(result.columns)}")
    if weight in result.probabilities and n_per_row is None:  # tested as counts, any table is independent
        raise Error(f"the weight {weight!r} is a probability, which carries no sample size: say how many draws "
                    f"each value of {a!r} stands for",
                    hint=f"res.chi2({a!r}, {b!r}, weight={weight!r}, n_per_row=5000): TEST does so with the "
                         f"test_draws option (5000, the ReLM paper's draws per gender)")
    try:
        return chi2_independence(result.to_dicts(), a, b, weight, n_per_row)
    except ValueError as e:
        raise Error(f"cannot test independence: {e}") from None
