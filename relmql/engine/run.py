"""A statement's plan run: its queries' rows (in process, or from the Ray engine), then the
output tuples, projected or aggregated."""

from __future__ import annotations

from typing import Callable, Generator, Iterator, List, Optional

from ..errors import Error
from ..plan import DatasetPlan, Plan, QueryPlan
from ..plan.expr import Env
from ..records import Sample
from .aggregate import aggregate, counts_only
from .datasets import dataset_rows, in_data_row
from .query import Models, query_rows
from .report import QUIET, Listener, QueryReport, closing_notes, ended, say
from .rows import RowEnv, value_of

# where a plan's result rows come from instead of this process (the Ray engine's ``Statement.rows``):
# a generator of rows that returns the reports of the queries it ran
RowSource = Callable[[Listener], Generator[Env, None, List[QueryReport]]]


def run(plan: Plan, models: Models, listener: Listener = QUIET, source: Optional[RowSource] = None) -> Iterator[tuple]:
    """Output tuples of ``plan``, in its column order. ``listener`` is told of each result row
    (or data row), of how many there will be where that is known, of the compile and of how far
    the search for the next row has gone, and of each query's report as its rows end; ``source``:
    where the result rows come from instead of this process."""
    if not isinstance(plan, DatasetPlan) and isinstance(plan.traversal, Sample):
        listener.total(plan.traversal.n * len(plan.per_model()))
    if source is not None:
        envs = source(listener)
    elif isinstance(plan, DatasetPlan):
        envs = dataset_rows(plan, models, listener)
    else:
        envs = model_rows(plan, models, listener)
    reports: List[QueryReport] = []
    envs = _reported(envs, reports)
    if plan.aggregate:
        yield from aggregate(plan, envs, reports)
        return
    for env in envs:
        if not counts_only(env):
            try:
                yield tuple(value_of(o.expr, env, plan.source) for o in plan.outputs)
            except Error as e:
                if isinstance(plan, DatasetPlan) and isinstance(env, RowEnv):
                    raise in_data_row(e, plan, env.plan.param_dict().get("row_number")) from None
                raise


def _reported(envs: Generator[Env, None, List[QueryReport]], reports: List[QueryReport]) -> Iterator[Env]:
    """``envs``, their reports put in ``reports`` once they end."""
    reports.extend((yield from envs))


def model_rows(plan: QueryPlan, models: Models, listener: Listener) -> Generator[Env, None, List[QueryReport]]:
    """``query_rows`` of ``plan`` on each of its models in turn (FROM's list), or on its one model;
    a model's cached keys and values are dropped when its turn ends, so that the next model's
    query has max_memory to itself. Returns the queries' reports."""
    reports = []
    for one in plan.per_model():
        report = yield from query_rows(one, models, listener)
        ended(report, listener)
        reports += [report] if report is not None else []
        if plan.models:
            models(one.model).set_cache_budget(0)
    for line in closing_notes(reports):
        say(line)
    return reports
