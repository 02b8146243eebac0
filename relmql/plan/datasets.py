"""Dataset planning: ``FOR EACH ROW IN 'file'``, a query run once per data row, and the rows it
runs on (docs/architecture.md, "Planning")."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping

from ..errors import Error
from ..records import Measure, Sample
from ..syntax import ast as A
from .columns import check_columns, group_names, plan_test, select
from .expect import plan_expect
from .expr import check_calls, truth
from .models import several_models
from .options import PlanError, option
from .plans import DatasetPlan, QueryPlan
from .query import plan_query
from .readers import DATA_FILES, iter_rows
from .values import constant, count_of, sourced, text_of


def plan_dataset(query: A.Query, source: str, settings, params) -> DatasetPlan:
    """The plan of a query with ``FOR EACH ROW IN``: its outputs are checked against the
    file's first row, its TEST and EXPECT options read once for all rows."""
    d = query.dataset
    if d.where is not None:  # what the text alone says is wrong comes before what the file system says
        check_calls(d.where, source, allow_aggregates=False, allow_rows=False)
        check_columns(d.where, source, ())
    path = text_of(d.source, params, source, "FOR EACH ROW IN", "a data file's path")
    if not Path(path).expanduser().is_file():
        raise PlanError(f"no data file {path!r}", d.source.span, source,
                        hint=f"relative paths start at the current directory, {Path.cwd()}")
    if not path.lower().endswith(DATA_FILES):
        raise PlanError(f"{path!r}: data files are .jsonl, .json, .csv or .tsv", d.source.span, source)
    row_limit = count_of(d.limit, params, source, "LIMIT") if d.limit is not None else None
    # outputs are checked against a representative row plan when the first row is planned
    groups = ()
    if query.matching is not None:
        try:
            first = next(iter_rows(path, source, d.source.span), None)
        except Error:
            first = None
        if first is not None:
            try:
                groups = group_names(text_of(query.matching, {**params, **first}, source, "MATCHING"))
            except Error:
                groups = ()
    outputs, aggregate, group_by = select(query, source, groups, several_models(query.model, params))
    once = {"test_draws": settings["test_draws"], "confidence": settings["confidence"]}
    for o in query.using:  # TEST and EXPECT apply to all data rows: their options are read once, not per row
        if o.name in once and o.value is not None:
            once[o.name] = option(o.name).check(constant(o.value, params, source, f"USING {o.name}"), o.value.span,
                                                source)
    draws, confidence = once["test_draws"], once["confidence"]
    return DatasetPlan(source=source, query=query, path=path, settings=tuple(settings.items()),
                       params=tuple(params.items()), outputs=outputs, aggregate=aggregate, group_by=group_by,
                       row_where=d.where, row_limit=row_limit,
                       test=plan_test(query.test, outputs, aggregate, source, draws),
                       expect=plan_expect(query.expect, [o.name for o in outputs], query.test is not None, source,
                                            confidence))


def plan_row(dplan: DatasetPlan, row: Mapping[str, Any]) -> QueryPlan:
    """The query of one data row (a pure function of the dataset plan and the row)."""
    params = {**dict(dplan.params), **row}
    query = A.Query(**{f: getattr(dplan.query, f) for f in dplan.query.__dataclass_fields__ if f != "dataset"})
    qplan = plan_query(query, dplan.source, dict(dplan.settings), params)
    if isinstance(qplan.traversal, (Sample, Measure)) and row.get("row_number") is not None:
        # each data row draws on its own (rows pooled by probability() count as independent draws)
        qplan = replace(qplan, traversal=replace(qplan.traversal, stream=f"row {row['row_number']}"))
    if isinstance(qplan.traversal, Measure):  # values over data rows are means: no row's bound applies to them
        qplan = replace(qplan, traversal=replace(qplan.traversal, bound_nodes=0))
    return qplan


def selected_rows(dplan: DatasetPlan) -> Iterator[Dict[str, Any]]:
    """The data rows the dataset's WHERE and LIMIT choose, read from the file as they are asked
    for (none past the LIMIT; a large file is never held whole)."""
    rows = (r for r in iter_rows(dplan.path, dplan.source, dplan.query.dataset.source.span) if row_selected(dplan, r))
    return rows if dplan.row_limit is None else itertools.islice(rows, dplan.row_limit)


def count_selected(dplan: DatasetPlan) -> int:
    """How many data rows ``selected_rows`` gives (a pass over the file that holds none of them,
    and finds a malformed row before any query runs)."""
    return sum(1 for _ in selected_rows(dplan))


def row_selected(dplan: DatasetPlan, row: Mapping[str, Any]) -> bool:
    """Whether ``row`` passes the dataset's WHERE."""
    if dplan.row_where is None:
        return True
    params = {**dict(dplan.params), **row}
    value = constant(dplan.row_where, params, dplan.source, "FOR EACH ROW ... WHERE")
    try:
        return truth(value, dplan.row_where)
    except Error as e:
        raise sourced(e, dplan.source) from None

