"""Runs a plan: compile → execute → filter → project or aggregate.

Entry point: ``run(plan, models)`` → an iterator of output tuples in the plan's column order.
A dataset plan runs its query once per data row (a pure map over rows), then aggregates
over all of them.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional

from .automata import compile
from .automata.language import levenshtein, nearest, unedited, viable_length
from .errors import Error
from .execute import COLUMNS, Mass, Measure, Row, SearchStats, execute, measure
from .stats import sort_key
from .models import LanguageModel
from .plan import DatasetPlan, ModelRef, Plan, QueryPlan, evaluate, plan_row, selected_rows
from .plan.expr import Env
from .plan.options import PlanError
from .syntax import ast as A

Models = Callable[[ModelRef], LanguageModel]


class RowEnv(Env):
    """A result row as expressions see it: its columns, the capture groups of MATCHING in its
    text (an edited text's from the nearest unedited string), the query's parameters, and, for
    probability(), how the language was measured (``mass``)."""

    def __init__(self, plan: QueryPlan, row: Optional[Row], rank: Optional[int], regex, mass: Optional[Mass] = None):
        self.plan, self.row, self.rank, self._regex, self.mass = plan, row, rank, regex, mass
        self._match = False

    def measured(self):
        if self.mass is None:
            raise PlanError("probability() needs a query that measures its language", None, self.plan.source)
        return self.mass, self.row.prob, self.row.weight

    def column(self, node: A.Column):
        name = node.name
        row = self.row
        if name == "rank":
            return self.rank
        if name == "edit_position":
            return None if row is None or not row.edits else edit_position(self.plan.matching, row.text)
        if name in COLUMNS:
            if row is None:
                return None
            value = getattr(row, name)
            return list(value) if name == "tokens" else value
        return self.group(name, node)

    def param(self, node: A.Param):
        params = self.plan.param_dict()
        if node.name not in params:
            raise PlanError(f"parameter :{node.name} has no value", node.span, self.plan.source)
        return params[node.name]

    def group(self, key, node):
        if self._match is False:
            self._match = None
            if self.row is not None and self._regex is not None:
                self._match = self._regex.fullmatch(self.row.text)
                if self._match is None and self.row.edits:
                    self._match = unedited_match(self.plan.matching, self.row.text, self.row.edits)
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise PlanError(f"group() takes a group number or name, not {key!r}", node.span, self.plan.source)
        if isinstance(key, int) and not 0 <= key <= (self._regex.groups if self._regex else 0):
            raise PlanError(f"MATCHING has {self._regex.groups if self._regex else 0} groups; there is no "
                            f"group {key}", node.span, self.plan.source)
        if isinstance(key, str) and (self._regex is None or key not in self._regex.groupindex):
            raise PlanError(f"MATCHING has no group named {key!r}", node.span, self.plan.source)
        return None if self._match is None else self._match.group(key)


def edit_position(pattern: str, text: str) -> int:
    """Where the first edit falls in an edited ``text``: the length, in characters, of its
    longest beginning that some string of the unedited ``pattern`` begins with."""
    dfa, start = unedited(pattern)
    data = text.encode("utf-8")
    return len(data[:viable_length(dfa, start, data)].decode("utf-8", errors="ignore"))


@functools.lru_cache(maxsize=1 << 16)  # samples repeat
def unedited_match(pattern: str, text: str, edits: int):
    """The ``re`` match of the string of ``pattern`` nearest to an edited ``text`` (at most
    ``edits`` character edits away), so that an edited string keeps the capture groups it was
    made from. The search counts byte edits: a character edit is at most 4 of them (UTF-8)."""
    dfa, start = unedited(pattern)
    found = nearest(dfa, start, text.encode("utf-8"), 4 * edits)
    if found is None:
        return None
    found_text = found.decode("utf-8", errors="replace")
    return re.fullmatch(pattern, found_text) if levenshtein(found_text, text) <= edits else None


class _GroupEnv(Env):
    """The rows of one group: aggregates see all of them, other expressions the first. (With a
    dataset, probability() combines the measurements that have rows in the group: which data
    rows could have had one is not known.)"""

    def __init__(self, rows: List[Env]):
        self.rows = rows

    def column(self, node):
        return self.rows[0].column(node)

    def param(self, node):
        return self.rows[0].param(node)

    def group(self, key, node):
        return self.rows[0].group(key, node)


def match_regex(plan: QueryPlan):
    """MATCHING as a Python ``re`` pattern, for capture groups (None where ``re`` cannot take it)."""
    try:
        return re.compile(plan.matching)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None


def query_rows(plan: QueryPlan, models: Models, cancel: Optional[threading.Event] = None,
               progress: Optional[Callable[[int], None]] = None, stopped: Optional[list] = None,
               masses: Optional[list] = None, on_total: Optional[Callable[..., None]] = None) -> Iterator[RowEnv]:
    """The result rows of one query that pass its WHERE, up to its LIMIT. A search that stops at
    ``max_nodes`` is warned about on stderr, or appended to ``stopped`` when given. A query that
    measures its language (probability()) appends how to ``masses`` and tells ``on_total`` how
    many sequences or draws it will read (``progress`` counts them)."""
    model = load(plan, models)
    automaton = compile_plan(plan, model)
    regex = match_regex(plan)
    if plan.limit == 0:
        return
    emitted = 0
    stats = SearchStats()
    mass = None
    if isinstance(plan.traversal, Measure):
        mass, rows = measure(automaton, model, plan.decoding, plan.traversal, cancel, stats)
        if masses is not None:
            masses.append(mass)
        if on_total is not None and mass.exact:
            on_total(mass.sequences, "sequence")  # at most: the rules may rule some out
        elif on_total is not None:
            on_total(mass.draws, "draw")
    else:
        rows = execute(automaton, model, plan.traversal, plan.decoding, cancel, stats)
    for row in rows:
        if progress is not None:
            progress(1)
        if row.miss:  # a draw of an estimate that found no string: it counts only as a draw
            continue
        env = RowEnv(plan, row, emitted + 1, regex, mass)
        if plan.where is not None and not _truth(_eval(plan.where, env, plan.source)):
            continue
        emitted += 1
        yield env
        if plan.limit is not None and emitted >= plan.limit:
            return
    if stats.stopped:
        if stopped is not None:
            stopped.append(plan)
        else:
            print(stop_warning(plan, emitted), file=sys.stderr)


def stop_warning(plan: QueryPlan, emitted: int) -> str:
    """The warning of a search that stopped at ``max_nodes`` after ``emitted`` rows."""
    return (f"warning: the search stopped at max_nodes ({plan.traversal.max_nodes:,} nodes) after "
            f"{emitted:,} rows; more rows may exist")


def stopped_rows_warning(stopped: List[QueryPlan], rows: int) -> str:
    """The warning of a dataset query some of whose ``rows`` data rows stopped at ``max_nodes``."""
    return (f"warning: {len(stopped):,} of {rows:,} data rows stopped searching at max_nodes "
            f"({stopped[0].traversal.max_nodes:,} nodes); their rows may be incomplete")


def load(plan: QueryPlan, models: Models) -> LanguageModel:
    """The plan's model; a model that cannot be loaded is an error under FROM's text."""
    try:
        return models(plan.model)
    except Error as e:
        if e.span is None and plan.model_span is not None:
            e.span, e.source = plan.model_span, plan.source
        raise


def compile_plan(plan: QueryPlan, model: LanguageModel):
    """The token automaton of ``plan`` on ``model``'s vocabulary, errors placed in the query text."""
    try:
        automaton = compile(plan.matching, model.vocabulary, plan.prefix, plan.compile)
    except Error as e:
        if e.role in ("MATCHING", "PREFIX"):
            raise plan.source_error(e) from None
        raise
    for w in automaton.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return automaton


def _truth(v) -> bool:
    return bool(v) if v is not None else False


def _eval(node, env, source):
    try:
        return evaluate(node, env)
    except Error as e:
        if e.source is None:
            e.source = source
        raise


def run(plan: Plan, models: Models, cancel: Optional[threading.Event] = None,
        progress: Optional[Callable[[int], None]] = None, on_total: Optional[Callable[[int], None]] = None,
        rows: Optional[Callable[..., Iterator[Env]]] = None) -> Iterator[tuple]:
    """Output tuples of ``plan``. ``progress(n)`` is told of each result row (or data row);
    ``on_total(n)`` of how many there will be, when that is known. ``rows(cancel, progress,
    on_total, masses)``: where the result rows come from instead of this process (the Ray
    engine's ``Statement.rows``)."""
    masses: list = []
    if not isinstance(plan, DatasetPlan) and on_total is not None and hasattr(plan.traversal, "n"):
        on_total(plan.traversal.n)
    if rows is not None:
        envs = rows(cancel, progress, on_total, masses)
    elif isinstance(plan, DatasetPlan):
        envs = _dataset_rows(plan, models, cancel, progress, on_total, masses)
    else:
        envs = query_rows(plan, models, cancel, progress, masses=masses, on_total=on_total)
    outputs = plan.outputs
    if not plan.aggregate:
        for env in envs:
            yield tuple(_eval(o.expr, env, plan.source) for o in outputs)
        return
    groups: Dict[Any, List[Env]] = {}
    for env in envs:
        key = tuple(_hashable(_eval(g, env, plan.source)) for g in plan.group_by)
        groups.setdefault(key, []).append(env)
    if not groups and not plan.group_by:
        groups[()] = []
    for key in sorted(groups, key=_order):
        members = groups[key]
        genv = _GroupEnv(members) if members else _EmptyEnv(masses)
        yield tuple(_eval(o.expr, genv, plan.source) for o in outputs)


class _EmptyEnv(Env):
    """No rows at all: aggregates over nothing (probability() over the measurements made)."""

    rows: List[Env] = []

    def __init__(self, masses=()):
        self.masses = tuple(masses)

    def column(self, node):
        return None

    def param(self, node):
        return None

    def group(self, key, node):
        return None


def _order(key: tuple):
    """Groups come out sorted by their values (NULL last; values of different types by type)."""
    return tuple(sort_key(v) for v in key)


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _dataset_rows(plan: DatasetPlan, models: Models, cancel, progress, on_total, masses) -> Iterator[Env]:
    selected = selected_rows(plan)
    if on_total is not None:
        on_total(len(selected))
    stopped: list = []
    for data in selected:
        if cancel is not None and cancel.is_set():
            from .execute import Cancelled
            raise Cancelled("the query was cancelled")
        qplan = plan_row(plan, data)
        found = False
        before = len(masses)
        for env in query_rows(qplan, models, cancel, stopped=stopped, masses=masses):
            found = True
            yield env
        if not found and len(masses) == before:  # the row still counts: one row of NULL results (as a LEFT
            yield RowEnv(qplan, None, None, match_regex(qplan))     # JOIN would give); a measured one counts as 0
        if progress is not None:
            progress(1)
    if stopped:
        print(stopped_rows_warning(stopped, len(selected)), file=sys.stderr)


__all__ = ["run", "query_rows", "compile_plan", "load", "RowEnv", "match_regex", "stop_warning",
           "stopped_rows_warning"]
