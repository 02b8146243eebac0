"""One query on one model: load, compile, execute, filter; its rows, then its ``QueryReport``."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Generator, Optional

from ..automata import byte_language, check_patterns, compile, memory_bound
from ..errors import Error
from ..execute import SampleStats, SearchStats, execute, measure
from ..models import LanguageModel
from ..plan import ModelRef, QueryPlan, check_params
from ..records import Measure, Sample, cancelling
from ..rowcontext import RowContext, prompted
from .report import QUIET, Listener, QueryReport, draws_note, nodes_note, reread_note, say
from .rows import RowEnv, match_regex, value_of

Models = Callable[[ModelRef], LanguageModel]


def query_rows(plan: QueryPlan, models: Models,
               listener: Listener = QUIET) -> Generator[RowEnv, None, Optional[QueryReport]]:
    """The result rows of one query that pass its WHERE, up to its LIMIT; once they end, its
    ``QueryReport`` (the generator's return value; None where LIMIT 0 reads nothing): the bound
    that stopped the search, how probability() measured the language, why there was no row...
    A query that measures its language (probability()) tells ``listener.total`` how many
    sequences or draws it will read (``listener.progress`` counts them); its rows include rows
    that only count (``row.miss``: a prefix path, a draw that found no string or that WHERE left
    out), which ``run`` keeps out of the groups. ``listener.note`` is told while the automaton
    compiles, and after each model call how far a search has gone (``nodes_note``) or how many
    draws a sampler has made (``draws_note``)."""
    check_params(plan)
    model = load(plan, models, listener)
    listener.loaded(model)
    automaton = compile_plan(plan, model, listener)
    regex = match_regex(plan)
    context = row_context(plan, model, models)
    if plan.limit == 0:
        return None
    report = QueryReport(plan)
    read_at = (model.stats.tokens, model.stats.recomputed)
    watch = None if listener is QUIET else listener.note
    stats = SearchStats(watch=None if watch is None else lambda s, opts: watch(nodes_note(s, opts)))
    if isinstance(plan.traversal, Measure):
        report.mass, rows = measure(automaton, model, plan.decoding, plan.traversal, listener.cancel, stats)
        if report.mass.exact:
            listener.total(report.mass.sequences, "sequence")  # at most: the rules may rule some out
        else:
            listener.total(report.mass.draws, "draw")
    else:  # a sampler's progress is its draws, a search's its nodes
        watched = stats if not isinstance(plan.traversal, Sample) else SampleStats(
            watch=None if watch is None else lambda s, opts: watch(draws_note(s, opts)))
        rows = execute(automaton, model, plan.traversal, plan.decoding, listener.cancel, watched)
    yield from _kept(plan, rows, regex, report, context, stats, listener)
    report.reread = reread_note(plan, model.stats.tokens - read_at[0], model.stats.recomputed - read_at[1])
    if plan.limit is not None and report.rows >= plan.limit:  # LIMIT ended it: the search's statistics say nothing
        return report
    _ended(report, stats)
    return report


def _kept(plan: QueryPlan, rows, regex, report: QueryReport, context: RowContext, stats: SearchStats,
          listener: Listener):
    """The rows that pass WHERE, up to LIMIT (``report.rows`` counts them), and, where the
    language is measured, the rows that only count."""
    mass, kept_at = report.mass, (0, 0)
    for row in rows:
        if row.miss and mass is not None:  # a prefix path (exact) or a draw that found no string (estimate):
            if not mass.exact:  # it only counts, in probability()'s denominators
                listener.progress(1)
            yield RowEnv(plan, row, None, regex, mass, context)
            continue
        if mass is not None and not row.summed:
            listener.progress(1)
        env = RowEnv(plan, row, report.rows + 1, regex, mass, context)
        if plan.where is not None and not value_of(plan.where, env, plan.source, condition=True):
            if mass is not None and not mass.exact and not row.summed:  # a draw all the same
                yield RowEnv(plan, dataclasses.replace(row, miss=True), None, regex, mass, context)
            # a search's max_nodes_per_row counts from the last row WHERE kept, not the last it found
            (stats.row_at, stats.prefix_at), stats.rows = kept_at, report.rows
            continue
        if mass is None:
            listener.progress(1)
        kept_at = stats.row_at, stats.prefix_at
        report.rows += 1
        yield env
        if plan.limit is not None and report.rows >= plan.limit:
            return


def _ended(report: QueryReport, stats: SearchStats) -> None:
    """What the search's statistics leave in the report of a query that read all its rows."""
    if stats.stop is not None:
        report.stop = dataclasses.replace(stats.stop, rows=report.rows)  # the rows the user sees
    report.floor = stats.floor
    causes = stats.no_row or stats.cut
    report.partial = bool(report.rows) or report.mass is not None
    if report.mass is not None:  # probability() has its row; the rules' cuts are what it measures under
        causes = tuple(c for c in causes if c not in ("rules", "eos"))
    report.no_row, report.fewest = tuple(causes), stats.fewest


def load(plan: QueryPlan, models: Models, listener: Listener = QUIET) -> LanguageModel:
    """The plan's model, once its regexes parse and its byte automaton is built (their errors,
    a pattern over the size limit among them, come before a model loads, which takes seconds);
    a model that cannot be loaded is an error under FROM's text. ``listener`` as for
    ``compile_plan``."""
    try:
        check_patterns(plan.matching, plan.prefix, plan.compile.exclude, plan.compile.max_states)
    except Error as e:
        raise (plan.source_error(e) if e.role else e) from None
    with _compiling(plan, listener):
        byte_language(plan.matching, plan.prefix, plan.compile)
    try:
        model = models(plan.model)
    except Error as e:
        if e.span is None and plan.model_span is not None:
            e.span, e.source = plan.model_span, plan.source
        raise
    return model if plan.prompt is None else prompted(plan, model)


def row_context(plan: QueryPlan, model: LanguageModel, models: Optional[Models]) -> RowContext:
    """What the rows of ``plan`` on ``model`` (its prompted view, where it has a PROMPT) can ask
    beyond their columns."""
    rendered = getattr(model, "rendered", None)
    return RowContext(plan, models, rendered.text if rendered is not None else None)


def compile_plan(plan: QueryPlan, model: LanguageModel, listener: Listener = QUIET):
    """The token automaton of ``plan`` on ``model``'s vocabulary, errors placed in the query text;
    ``listener.cancel`` stops the compile at its next checkpoint (a large determinization at
    once), where ``listener.note`` is told that it is compiling (cleared once it is done)."""
    with _compiling(plan, listener):
        automaton = compile(plan.matching, model.vocabulary, plan.prefix, plan.compile, model.context)
    for w in automaton.warnings:
        say(f"warning: {w}")
    return automaton


@contextlib.contextmanager
def _compiling(plan: QueryPlan, listener: Listener):
    """A compile of ``plan``'s automata: cancellable, within its max_memory, said to the
    listener, its errors placed in the query text."""
    tick = None if listener is QUIET else lambda: listener.note("compiling the automaton")
    try:
        with cancelling(listener.cancel, tick), memory_bound(getattr(plan.traversal, "max_memory", None)):
            yield
    except Error as e:
        if e.role:  # MATCHING, PREFIX, a WHERE filter, or the filters together
            raise plan.source_error(e) from None
        raise
    finally:
        if listener is not QUIET:
            listener.note("")

