"""Aggregation: rows held until the end, grouped, and probability() worked out from the measurements."""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional

from ..errors import Error
from ..memory import approx_bytes, format_size, shares
from ..plan import Plan, QueryPlan
from ..plan.expr import Env
from ..plan.options import PlanError, shown
from ..records import ExecutionError, Sample
from ..stats import Estimate, hashable, probability, sort_key
from .report import QueryReport, no_group_note, say
from .rows import RowEnv, value_of


def aggregate(plan: Plan, envs: Iterator[Env], reports: List[QueryReport]) -> Iterator[tuple]:
    """The output tuples of an aggregating ``plan`` over its rows ``envs``, one per group in the
    groups' order; ``reports``: the queries' reports, filled by the time ``envs`` ends (how
    each measured its language: probability() reads them)."""
    groups: Dict[Any, List[Env]] = {}
    hits, counted = [], []
    beyond = [False] * len(plan.group_by)  # GROUP BY keys that read more of a row than its prefix
    held = _Held(plan)
    for env in envs:
        held.add(env)
        if counts_only(env):  # only probability() counts it
            counted.append(env)
            continue
        key = _key(plan, env, beyond)
        groups.setdefault(key, []).append(env)
        hits.append((env, key))
    masses = [r.mass for r in reports if r.mass is not None]
    measured = _Measured(plan, masses, hits, counted, beyond) if masses else None
    if not groups and not plan.group_by:
        groups[()] = []
    empty: Dict[Any, Env] = {}  # groups measured to 0: a prefix class that only counted rows reached
    if measured is not None and plan.group_by and len(measured.prefix_keys) == len(plan.group_by):
        empty = {c: env for c, env in measured.classes.items() if c not in groups}
        groups.update((c, []) for c in empty)
    if measured is not None and not groups:
        say(no_group_note(masses))
    for key in sorted(groups, key=_order):
        members = groups[key]
        if members:
            genv = _GroupEnv(members, key, measured)
        elif key in empty:
            genv = _GroupEnv([], key, measured, keys_from=empty[key])
        else:
            genv = _EmptyEnv(measured)
        yield tuple(value_of(o.expr, genv, plan.source) for o in plan.outputs)


class _GroupEnv(Env):
    """The rows of one group (``key``: its GROUP BY values): aggregates see all of them, other
    expressions the first; probability() is worked out by ``measured`` (a ``_Measured``). A group
    that only rows which count reached (a prefix class with no string) has no rows; its keys are
    read from one of those (``keys_from``)."""

    def __init__(self, rows: List[Env], key: tuple = (), measured: Optional["_Measured"] = None,
                 keys_from: Optional[Env] = None):
        self.first = rows[0] if rows else keys_from
        self.rows, self.key, self.measured = rows, key, measured

    def probability(self):
        return self.measured.probability(self.key, self.rows) if self.measured is not None else Estimate(0.0)

    def column(self, node):
        return self.first.column(node)

    def param(self, node):
        return self.first.param(node)

    def group(self, key, node):
        return self.first.group(key, node)



class _Held:
    """The rows an aggregate holds until the end, within the traversal's share of ``max_memory``
    (each row's strings and tokens and ``ROW_BYTES`` for the rest): past it, or where a SAMPLE
    alone needs more, an error, before the memory runs out."""

    ROW_BYTES = 320  # a Row, its RowEnv and their places in the lists (with its strings: 620 bytes for 'a')
    LEAST = ROW_BYTES + approx_bytes(("", "", "", (0,)))  # a row of one token and no text

    def __init__(self, plan: Plan):
        self.bytes, self.rows, self.budget = 0, 0, None
        self._estimates: set = set()  # probability()'s estimates met (ids of their Mass)
        if isinstance(plan, QueryPlan):
            self._share(plan)
            n = plan.traversal.n if isinstance(plan.traversal, Sample) else 0
            if n * self.LEAST > self.budget:
                raise self._error(f"SAMPLE {n:,} with aggregates holds each sample's row until the end, "
                                  f"at least {format_size(n * self.LEAST)}", 6 * n * self.LEAST, "lower SAMPLE")

    def _share(self, plan: QueryPlan) -> None:
        self.max_memory = plan.traversal.max_memory
        self.budget = shares(self.max_memory).traversal

    def add(self, env: Env) -> None:
        row = getattr(env, "row", None)
        if row is None:
            return
        if self.budget is None:  # a dataset's: its first query's
            self._share(env.plan)
        mass = getattr(env, "mass", None)
        if mass is not None and not mass.exact and id(mass) not in self._estimates:
            self._estimates.add(id(mass))  # its draws are known before they are held: refused at the first
            need = mass.draws * self.LEAST
            if self.bytes + need > self.budget:
                raise self._error(f"probability() estimates from {mass.draws:,} draws (estimate_samples), and "
                                  f"the aggregates hold each draw's row until the end, at least "
                                  f"{format_size(need)}", 6 * (self.bytes + need), "lower estimate_samples")
        self.rows += 1
        self.bytes += self.ROW_BYTES + approx_bytes((row.text, row.prefix, row.completion, row.tokens))
        if self.bytes > self.budget:
            raise self._error(f"the aggregates hold every row until the end, and {self.rows:,} rows came to "
                              f"{format_size(self.bytes)}", 4 * self.max_memory,
                              "lower SAMPLE or LIMIT (or choose fewer data rows)")

    def _error(self, what: str, need: int, fewer: str) -> ExecutionError:
        gb = -(-need // 10 ** 9)
        return ExecutionError(f"{what}: more than this query's share of max_memory ({format_size(self.budget)} "
                              f"of {format_size(self.max_memory)})",
                              hint=fewer + (f", or raise max_memory (USING max_memory '{gb}GB')" if gb <= 1000 else ""))


def counts_only(env: Env) -> bool:
    """A row that only counts in probability()'s denominators (a prefix path, a missed draw)."""
    row = getattr(env, "row", None)
    return row is not None and row.miss


def _key(plan: Plan, env: Env, beyond: List[bool]) -> tuple:
    """The GROUP BY values of ``env``; ``beyond[i]`` is set where key i read more of the row than
    its prefix."""
    values = []
    for i, g in enumerate(plan.group_by):
        if isinstance(env, RowEnv):
            env.beyond = False
        values.append(hashable(value_of(g, env, plan.source)))
        if getattr(env, "beyond", False):
            beyond[i] = True
    return tuple(values)


class _Measured:
    """probability() over the measurements of a query (``masses``; several with a dataset).

    A PREFIX may have several token paths (strings, tokenizations, edits). A GROUP BY key is a
    *prefix key* when, on every row (rows that only count included), it reads nothing of the row
    but its prefix: the ``prefix`` column, parameters, literals, capture groups that end within
    the prefix. The values of the prefix keys are a row's *prefix class*; all rows after one
    prefix path must agree on it, or probability() refuses (the keys would not be the
    prefix's). In each measurement a group's value is the mean, over the prefix paths of its
    class, of P(group | path): exact, Σ prob / (the class's prefix paths); estimated, the mean
    weight · 1(group) over the draws whose prefix is in the class. Measurements in which the
    class occurs are averaged (``stats.probability``)."""

    def __init__(self, plan: Plan, masses: list, hits: list, counted: List[Env], beyond: List[bool]):
        self.masses = list(masses)
        beyond = list(beyond)
        keyed = list(hits)
        for env in counted:
            values = []
            for i, g in enumerate(plan.group_by):
                value = None
                if not beyond[i]:
                    env.beyond = False
                    try:
                        value = hashable(value_of(g, env, plan.source))
                    except Error:  # a key that a string after the prefix cannot give is not the prefix's
                        env.beyond = True
                    beyond[i] = beyond[i] or env.beyond
                values.append(value)
            keyed.append((env, tuple(values)))
        self.prefix_keys = [i for i, b in enumerate(beyond) if not b]
        # a group is all the strings after its prefix (what a bound of the language bounds)
        self.whole = len(self.prefix_keys) == len(beyond) and getattr(plan, "where", None) is None
        self.classes: Dict[tuple, Env] = {}  # each prefix class -> its first row
        where: Dict[tuple, tuple] = {}  # (measurement, prefix path) -> (class, env)
        # (measurement, class, 0) -> prefix paths (exact); (measurement, class, stratum) -> draws (estimated)
        self.units: Dict[tuple, int] = {}
        for env, key in keyed:
            row, mass = getattr(env, "row", None), getattr(env, "mass", None)
            if row is None or mass is None:
                continue
            c = self.prefix_class(key)
            self.classes.setdefault(c, env)
            first = where.setdefault((id(mass), row.tokens[:row.prefix_tokens]), (c, env))
            if first[0] != c:
                raise self._not_the_prefixs(plan, first, (c, env))
            if not mass.exact and not row.summed:  # a draw, of its proposal's stratum
                k = (id(mass), c, mass.stratum(row.rank))
                self.units[k] = self.units.get(k, 0) + 1
        exact = {id(m) for m in self.masses if m.exact}
        for (m, _), (c, _) in where.items():
            if m in exact:
                self.units[(m, c, 0)] = self.units.get((m, c, 0), 0) + 1

    def prefix_class(self, key: tuple) -> tuple:
        return tuple(key[i] for i in self.prefix_keys)

    def probability(self, key: tuple, rows: List[Env]) -> Estimate:
        c = self.prefix_class(key)
        found: Dict[int, list] = {}
        for env in rows:
            if getattr(env, "mass", None) is not None and env.row is not None:
                found.setdefault(id(env.mass), []).append((env.row.prob, env.row.weight, env.row.summed,
                                                           env.mass.stratum(env.row.rank)))
        return probability([(m, found.get(id(m), []), [self.units.get((id(m), c, h), 0) for h in range(m.strata)])
                            for m in self.masses], bounded=self.whole)

    def _not_the_prefixs(self, plan: Plan, a: tuple, b: tuple) -> PlanError:
        (ca, ea), (cb, eb) = a, b
        k = next(j for j, (x, y) in enumerate(zip(ca, cb)) if x != y)
        node = plan.group_by[self.prefix_keys[k]]
        what = plan.source[node.span[0]:node.span[1]] if plan.source and node.span else "a GROUP BY key"
        return PlanError(f"probability() cannot tell the prefix's class: {what} reads only the prefix, yet after the "
                         f"same prefix {ea.row.prefix!r} it is {shown(ca[k])} for {ea.row.text!r} and {shown(cb[k])} "
                         f"for {eb.row.text!r}", node.span, plan.source,
                         hint="group by keys that the prefix alone decides (or leave them out)")


class _EmptyEnv(Env):
    """No rows at all: aggregates over nothing (probability() over the measurements made)."""

    rows: List[Env] = []

    def __init__(self, measured: Optional[_Measured] = None):
        self.measured = measured

    def probability(self):
        return self.measured.probability((), []) if self.measured is not None else Estimate(0.0)

    def column(self, node):
        return None

    def param(self, node):
        return None

    def group(self, key, node):
        return None


def _order(key: tuple):
    """Groups come out sorted by their values (NULL last; values of different types by type)."""
    return tuple(sort_key(v) for v in key)

