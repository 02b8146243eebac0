"""A dataset's query (FROM a data file): the query once per data row, a pure map over the rows."""

from __future__ import annotations

from typing import Generator, List

from ..errors import Error
from ..plan import DatasetPlan, count_selected, plan_row, selected_rows
from ..plan.expr import Env
from ..records import Cancelled
from .query import Models, query_rows
from .report import Listener, QueryReport, closing_notes, ended, say
from .rows import RowEnv, match_regex


class _RowListener(Listener):
    """What the query of one data row tells: its notes, cancel and end pass on; its rows do not
    count (the dataset's progress is its data rows)."""

    def __init__(self, outer: Listener):
        self.outer, self.cancel = outer, outer.cancel

    def note(self, text: str) -> None:
        self.outer.note(text)

    def loaded(self, model) -> None:
        self.outer.loaded(model)

    def ended(self, report: QueryReport) -> None:
        self.outer.ended(report)


def in_data_row(e: Error, plan: DatasetPlan, number) -> Error:
    """``e`` saying which data row it arose in (its query's text is the same for every row)."""
    if number is not None and not isinstance(e, Cancelled) and " (data row " not in e.message:
        e.message += f" (data row {number} of {plan.path})"
    return e


def dataset_rows(plan: DatasetPlan, models: Models, listener: Listener) -> Generator[Env, None, List[QueryReport]]:
    """The rows of ``plan``'s query on each selected data row (and each of its models) in turn;
    a data row whose query gives none still counts, as one row of NULL results. Returns the
    queries' reports."""
    total = count_selected(plan)
    if not total:
        say(f"note: no data rows to run in {plan.path}" + (" (after its WHERE)" if plan.row_where is not None
                                                             else ""))
    listener.total(total)
    inner, reports = _RowListener(listener), []
    for data in selected_rows(plan):
        if listener.cancel is not None and listener.cancel.is_set():
            raise Cancelled("the query was cancelled")
        try:
            for qplan in plan_row(plan, data).per_model():
                found, rows = False, query_rows(qplan, models, inner)
                try:
                    while True:
                        yield next(rows)
                        found = True
                except StopIteration as done:
                    report = done.value
                if not found and (report is None or report.mass is None):  # the row still counts: one row of
                    # NULL results (as a LEFT JOIN would give), one for each model; a measured one counts as 0
                    yield RowEnv(qplan, None, None, match_regex(qplan))
                ended(report, listener, dataset=True)
                reports += [report] if report is not None else []
        except Error as e:
            raise in_data_row(e, plan, data.get("row_number")) from None
        listener.progress(1)
    for line in closing_notes(reports, total):
        say(line)
    return reports
