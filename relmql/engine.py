"""Runs a plan: compile → execute → filter → project or aggregate.

Entry point: ``run(plan, models)`` → an iterator of output tuples in the plan's column order.
A dataset plan runs its query once per data row (a pure map over rows), then aggregates
over all of them.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
import sys
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .automata import byte_language, check_patterns, compile, memory_bound
from .automata.language import levenshtein, nearest, unedited, viable_length
from .errors import Error
from .execute import Mass, Row, SampleStats, SearchStats, execute, measure
from .execute.ledger import NO_ROW
from .memory import DEFAULT_MAX_MEMORY, approx_bytes, format_size, shares
from .models import LanguageModel
from .plan import (DatasetPlan, ModelRef, Plan, QueryPlan, check_params, count_selected, evaluate, plan_row,
                   selected_rows)
from .plan.expr import Env, truth
from .plan.models import under_name
from .rowcontext import RowContext, prompted
from .plan.options import PlanError, shown
from .records import (COLUMNS, COMPUTED_COLUMNS, Cancelled, ExecutionError, Measure, Sample, ShortestPath, Stop,
                      cancelling)
from .stats import Estimate, hashable, probability, sort_key
from .syntax import ast as A
from .syntax.regexes import compiled

Models = Callable[[ModelRef], LanguageModel]

# the list that the notes and warnings of the query running now are also kept in (``say``; the
# API runs each step of a query in a context of ``keeping``, so that a Result keeps its own)
_NOTES: contextvars.ContextVar[Optional[List[str]]] = contextvars.ContextVar("relmql_notes", default=None)
_BARS: contextvars.ContextVar = contextvars.ContextVar("relmql_bars", default=None)


def say(line: str) -> None:
    """Write a note or warning of the query running now on stderr, and keep it in the list of
    the context it runs in (``keeping``), with that context's progress bars off the screen."""
    bars = _BARS.get()
    if bars is not None:
        bars.clear()
    print(line, file=sys.stderr)
    if bars is not None:
        bars.redraw()
    kept = _NOTES.get()
    if kept is not None:
        kept.append(line)


def keeping(notes: List[str], bars=None) -> contextvars.Context:
    """A context in which ``say`` also keeps its lines in ``notes`` (``Context.run`` each step),
    and takes ``bars`` (with ``clear()`` and ``redraw()``) off the screen while it writes one."""
    context = contextvars.copy_context()
    context.run(_NOTES.set, notes)
    context.run(_BARS.set, bars)
    return context


class RowEnv(Env):
    """A result row as expressions see it: its columns, the capture groups of MATCHING in its
    text (an edited text's from the nearest unedited string), the query's parameters, and, for
    probability(), how the language was measured (``mass``). ``beyond`` is set when an
    expression reads more of the row than its prefix: a column other than ``prefix``, or a
    capture group that ends after the prefix (probability() tells by it which GROUP BY keys the
    prefix fixes)."""

    beyond = False

    def __init__(self, plan: QueryPlan, row: Optional[Row], rank: Optional[int], regex, mass: Optional[Mass] = None,
                 context: Optional[RowContext] = None):
        self.plan, self.row, self.rank, self._regex, self.mass = plan, row, rank, regex, mass
        self.context = context
        self._match = False

    def column(self, node: A.Column):
        name = node.name
        row = self.row
        if name == "model" and name not in self.plan.group_names:  # a capture group of that name comes first
            return self.plan.model.name
        if name == "prompt" and name not in self.plan.group_names:
            if self.context is not None and self.context.prompt is not None:
                return self.context.prompt
            return None if self.plan.prompt is None else self.plan.prompt.text
        if name in COLUMNS or name in COMPUTED_COLUMNS:
            self.beyond = self.beyond or name != "prefix"
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

    def under(self, node: A.Call):
        self.beyond = True
        name = under_name(node, self.plan.param_dict(), self.plan.source)
        if self.row is None or self.context is None:
            return None
        return self.context.score(name, self.row, node.span)

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
            raise PlanError(f"group() takes a group number or name, not {shown(key)}", node.span, self.plan.source)
        if isinstance(key, int) and not 0 <= key <= (self._regex.groups if self._regex else 0):
            n = self._regex.groups if self._regex else 0
            raise PlanError(f"MATCHING has {n} group{'' if n == 1 else 's'}; there is no group {key}", node.span,
                            self.plan.source)
        if isinstance(key, str) and (self._regex is None or key not in self._regex.groupindex):
            raise PlanError(f"MATCHING has no group named {key!r}", node.span, self.plan.source)
        if self._match is None:
            return None
        if not self.beyond and self._match.end(key) > self._prefix_end():
            self.beyond = True
        return self._match.group(key)

    def _prefix_end(self) -> int:
        """Where the prefix ends in the text the capture groups come from: the row's own text,
        or the unedited string nearest to it (split, as the language is, after its longest
        beginning that PREFIX matches)."""
        row, text = self.row, self._match.string
        if text == row.text and text.startswith(row.prefix):
            return len(row.prefix)
        return prefix_end(self.plan.prefix, text)


def edit_position(pattern: str, text: str) -> int:
    """Where the first edit falls in an edited ``text``: the length, in characters, of its
    longest beginning that some string of the unedited ``pattern`` begins with."""
    dfa, start = unedited(pattern)
    data = text.encode("utf-8")
    return len(data[:viable_length(dfa, start, data)].decode("utf-8", errors="ignore"))


@functools.lru_cache(maxsize=1 << 16)
def prefix_end(prefix: Optional[str], text: str) -> int:
    """The length of the longest beginning of ``text`` that the regex ``prefix`` matches (0
    when there is no prefix, or none matches; -1 when ``re`` cannot read it, so that no
    capture group counts as the prefix's)."""
    if not prefix:
        return 0
    try:
        pattern = compiled(prefix)
    except (re.error, RecursionError, OverflowError, ValueError):
        return -1
    return next((k for k in range(len(text), -1, -1) if pattern.fullmatch(text, 0, k)), 0)


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
    return compiled(pattern).fullmatch(found_text) if levenshtein(found_text, text) <= edits else None


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


def match_regex(plan: QueryPlan):
    """MATCHING as a Python ``re`` pattern, for capture groups (None where ``re`` cannot take it)."""
    try:
        return compiled(plan.matching)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None


def query_rows(plan: QueryPlan, models: Models, cancel: Optional[threading.Event] = None,
               progress: Optional[Callable[[int], None]] = None, stopped: Optional[list] = None,
               masses: Optional[list] = None, on_total: Optional[Callable[..., None]] = None,
               no_row: Optional[list] = None, on_note: Optional[Callable[[str], None]] = None,
               floors: Optional[list] = None) -> Iterator[RowEnv]:
    """The result rows of one query that pass its WHERE, up to its LIMIT. A search that a bound
    stopped (``Stop``) is warned about on stderr, or appended to ``stopped`` when given; one that
    found no row because the decoding rules or the token bounds cut it short is noted on stderr
    (``no_row_note``), or ``(plan, causes, False, fewest)`` appended to ``no_row`` when given; one that
    exhausted its language within bounds that cut it short, or probability() measured within
    them, likewise with True (``SearchStats.cut``); an estimate below its canonical floor is
    warned about, or its floor appended to ``floors`` when given. A query that
    measures its language (probability()) appends how to ``masses`` and tells ``on_total`` how
    many sequences or draws it will read (``progress`` counts them); its rows include rows that
    only count (``row.miss``: a prefix path, a draw that found no string or that WHERE left out),
    which ``run`` keeps out of the groups. ``on_note(text)``, for a progress display before a row
    is found, is told while the automaton compiles, and after each model call how far a search has
    gone (``nodes_note``) or how many draws a sampler has made (``draws_note``)."""
    check_params(plan)
    model = load(plan, models, cancel, on_note)
    automaton = compile_plan(plan, model, cancel, on_note)
    regex = match_regex(plan)
    context = row_context(plan, model, models)
    if plan.limit == 0:
        return
    emitted, kept_at = 0, 0
    read_at = (model.stats.tokens, model.stats.recomputed)
    stats = SearchStats(watch=None if on_note is None else lambda s, opts: on_note(nodes_note(s, opts)))
    mass = None
    if isinstance(plan.traversal, Measure):
        mass, rows = measure(automaton, model, plan.decoding, plan.traversal, cancel, stats)
        if masses is not None:
            masses.append(mass)
        if on_total is not None and mass.exact:
            on_total(mass.sequences, "sequence")  # at most: the rules may rule some out
        elif on_total is not None:
            on_total(mass.draws, "draw")
    else:  # a sampler's progress is its draws, a search's its nodes
        watched = stats if not isinstance(plan.traversal, Sample) else SampleStats(
            watch=None if on_note is None else lambda s, opts: on_note(draws_note(s, opts)))
        rows = execute(automaton, model, plan.traversal, plan.decoding, cancel, watched)
    for row in rows:
        if row.miss and mass is not None:  # a prefix path (exact) or a draw that found no string (estimate):
            if progress is not None and not mass.exact:  # it only counts, in probability()'s denominators
                progress(1)
            yield RowEnv(plan, row, None, regex, mass, context)
            continue
        if progress is not None and mass is not None and not row.summed:
            progress(1)
        env = RowEnv(plan, row, emitted + 1, regex, mass, context)
        if plan.where is not None and not _eval(plan.where, env, plan.source, condition=True):
            if mass is not None and not mass.exact and not row.summed:  # a draw all the same
                yield RowEnv(plan, dataclasses.replace(row, miss=True), None, regex, mass, context)
            # a search's max_nodes_per_row counts from the last row WHERE kept, not the last it found
            stats.row_at, stats.rows = kept_at, emitted
            continue
        if progress is not None and mass is None:
            progress(1)
        kept_at = stats.row_at
        emitted += 1
        yield env
        if plan.limit is not None and emitted >= plan.limit:
            _note_reread(plan, model, read_at)
            return
    _note_reread(plan, model, read_at)
    if stats.stop is not None:
        stop = dataclasses.replace(stats.stop, rows=emitted)  # the rows the user sees
        if stopped is not None:
            stopped.append(stop)
        else:
            say(stop_warning(stop))
    if stats.floor is not None:
        if floors is not None:
            floors.append(stats.floor)
        else:
            say(floor_warning([stats.floor]))
    causes, partial = stats.no_row or stats.cut, bool(emitted) or mass is not None
    if mass is not None:  # probability() has its row; the rules' cuts are what it measures under
        causes = tuple(c for c in causes if c not in ("rules", "eos"))
    if causes:
        if no_row is not None:
            no_row.append((plan, causes, partial, stats.fewest))
        else:
            say(no_row_note(plan, causes, partial, stopped=stats.stop is not None, fewest=stats.fewest))


REREAD_NOTE = 1024  # tokens read again for want of room for their keys and values, past which a query says so


def _note_reread(plan: QueryPlan, model: LanguageModel, read_at: Tuple[int, int]) -> None:
    """Say so where most of what the model read this query it read again because the keys and
    values of earlier tokens (a long prompt's, say) did not fit the query's share of max_memory:
    the query was slower than it needs to be, and a larger max_memory keeps them."""
    tokens, again = model.stats.tokens - read_at[0], model.stats.recomputed - read_at[1]
    if again >= REREAD_NOTE and 2 * again > tokens:
        kv = shares(getattr(plan.traversal, "max_memory", None) or DEFAULT_MAX_MEMORY).kv
        say(f"note: the model read {again:,} of its {tokens:,} tokens again: their keys and values did not "
            f"fit max_memory's share for them ({format_size(kv)}); raise max_memory to keep them")


def nodes_note(stats: SearchStats, opts: ShortestPath) -> str:
    """How far a search has gone, for a progress bar: the nodes it has expanded, and those spent
    on the row it looks for against ``max_nodes_per_row`` (the bound that ends a search that finds
    none), with the option's name, so that the bound a long wait runs into can be seen and raised."""
    text = f"{stats.expanded:,} nodes"
    if opts.max_nodes is not None:
        text += f" of max_nodes {opts.max_nodes:,}"
    if opts.max_nodes_per_row is not None:
        text += (f", {stats.expanded - stats.row_at:,} of max_nodes_per_row {opts.max_nodes_per_row:,} "
                 f"for row {stats.rows + 1:,}")
    return text


def draws_note(stats: SampleStats, opts: Sample) -> str:
    """How far a sampler has gone, for a progress bar: its draws against the budget that ends it
    (``max_draws``) and those thrown away (and of those, the ones cut at max_tokens or the
    context), so that a rejection-heavy SAMPLE, whose rows come many draws apart, shows it works
    and what it spends."""
    text = f"{stats.draws:,} draws of max_draws {opts.draw_budget:,}"
    if stats.discarded:
        kind = "missed" if opts.misses else "rejected" if opts.mode == "exact" else "dead ends"
        text += f", {stats.discarded:,} {kind}"
        if stats.too_long:  # the draws a length bound cut: raising it is what helps
            where = f"max_tokens {opts.max_tokens:,}" if stats.too_long_at == "max_tokens" else "the context"
            text += f" ({stats.too_long:,} cut at {where})"
    return text


def stop_warning(stop: Stop) -> str:
    """The warning of a query that a bound stopped."""
    return f"warning: {stop.message()}"


def _causes(plan: QueryPlan, causes, short: bool = False, fewest: Optional[int] = None) -> str:
    """Why a search found no row, in words, with what to change (``fewest``: the tokens each
    string takes at least, where none fits in max_tokens: ``SearchStats.fewest``)."""
    words = []
    rules = plan.decoding.truncation()  # "topk 40 and topp 0.9", the rules that cut
    it = "them" if " and " in rules else "it"
    if "rules" in causes:
        words.append(f"{rules} kept none of the tokens MATCHING allows next where the search needed "
                     f"one (raise or drop {it}, or put the text's beginning in PREFIX"
                     + (")" if short else ": the rules apply to the completion only)"))
    if "eos" in causes:
        words.append(f"{rules} ruled out the end-of-text token where strings of MATCHING ended, and eos needs it "
                     f"there (raise or drop {it}, or drop eos)")
    if "max_tokens" in causes and fewest is not None:
        words.append(f"each string of MATCHING takes at least {_tokens(fewest)}"
                     f"{' after PREFIX' if plan.prefix else ''}, and max_tokens is {plan.traversal.max_tokens:,} "
                     f"(raise it)")
    elif "max_tokens" in causes:
        words.append(f"the completions reached max_tokens ({_tokens(plan.traversal.max_tokens)}) where MATCHING "
                     f"goes on (raise it)")
    if "max_prefix_tokens" in causes:
        words.append(f"the prefix reached max_prefix_tokens ({_tokens(plan.traversal.max_prefix_tokens)}) where "
                     f"PREFIX goes on (raise it)")
    if "prefix_context" in causes:
        words.append("the prefix filled the model's context length (the most tokens it reads) before the completion "
                     "began (shorten PREFIX, or use a model with a longer context)")
    if "context" in causes:
        words.append("the text reached the model's context length (the most tokens it reads) where MATCHING goes on "
                     "(a model with a longer context reads on)")
    return "; ".join(words)


def _tokens(n: int) -> str:
    return f"{n:,} token{'' if n == 1 else 's'}"


def no_row_note(plan: QueryPlan, causes, partial: bool = False, stopped: bool = False,
                fewest: Optional[int] = None) -> str:
    """The note of a query with no row because the decoding rules or the token bounds cut every
    way to a string short (``SearchStats.no_row``: the search always exhausts what they leave),
    or, ``stopped``, of one that a bound stopped with no row, where they had cut ways short (no
    string may fit them), or, ``partial``, of one whose rows (or probability()) are all there is
    within the bounds, which cut some way short (``SearchStats.cut``); ``fewest`` as ``_causes``."""
    if stopped and not partial:
        return f"note: no rows before the search stopped, and perhaps none within the bounds: {_causes(plan, causes)}"
    if not partial:
        return f"note: no rows: {_causes(plan, causes, fewest=fewest)}"
    what = "probability() measures" if isinstance(plan.traversal, Measure) else "the rows are"
    return f"note: {what} only the strings within the bounds: {_causes(plan, causes, fewest=fewest)}"


def no_row_rows_note(items: List[Tuple[QueryPlan, Tuple[str, ...], bool, Optional[int]]], rows: int) -> str:
    """The note of a dataset query some of whose ``rows`` data rows have no row, or fewer than
    their language holds, for those reasons (``no_row_note``)."""
    parts = []
    for partial, words in ((False, "have no rows"), (True, "were cut short")):
        mine = [(plan, cs) for plan, cs, p, _ in items if p == partial]
        if mine:
            causes = tuple(c for c in NO_ROW if any(c in cs for _, cs in mine))
            parts.append(f"{len(mine):,} of {rows:,} data rows {words}: {_causes(mine[0][0], causes, short=True)}")
    return "note: " + "; ".join(parts)


def floor_warning(floors: List[float], rows: Optional[int] = None) -> str:
    """The warning of a local estimate over every tokenization that fell below its ``floors``
    (``SearchStats.floor``): of one query, or of ``len(floors)`` of a dataset query's ``rows``."""
    what = (f"probability() is at least {floors[0]:.4g} (the canonical tokenizations of the strings drawn)"
            if rows is None else
            f"in {len(floors):,} of {rows:,} data rows probability() is at least the canonical tokenizations of the "
            f"strings drawn (up to {max(floors):.4g})")
    return (f"warning: {what}, above its estimate's interval: local draws over every tokenization kept to ones the "
            "model seldom reads (on Gemma 3, its bare space token first) and missed those that carry the "
            "probability; tokenization canonical measures the canonical ones exactly")


def stopped_rows_warning(stopped: List[Stop], rows: int) -> str:
    """The warning of a dataset query some of whose ``rows`` data rows a bound stopped."""
    bounds = {f"{s.bound} ({s.limit_text()})": None for s in stopped}
    return (f"warning: {len(stopped):,} of {rows:,} data rows stopped searching at {', '.join(bounds)}; their "
            f"rows are exact but may be incomplete")


def load(plan: QueryPlan, models: Models, cancel: Optional[threading.Event] = None,
         on_note: Optional[Callable[[str], None]] = None) -> LanguageModel:
    """The plan's model, once its regexes parse and its byte automaton is built (their errors,
    a pattern over the size limit among them, come before a model loads, which takes seconds);
    a model that cannot be loaded is an error under FROM's text. ``cancel`` and ``on_note`` as
    for ``compile_plan``."""
    try:
        check_patterns(plan.matching, plan.prefix, plan.compile.exclude, plan.compile.max_states)
    except Error as e:
        raise (plan.source_error(e) if e.role else e) from None
    with _compiling(plan, cancel, on_note):
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


def compile_plan(plan: QueryPlan, model: LanguageModel, cancel: Optional[threading.Event] = None,
                 on_note: Optional[Callable[[str], None]] = None):
    """The token automaton of ``plan`` on ``model``'s vocabulary, errors placed in the query text;
    ``cancel`` stops the compile at its next checkpoint (a large determinization at once), where
    ``on_note`` is told that it is compiling (a progress display's note; cleared once it is done)."""
    with _compiling(plan, cancel, on_note):
        automaton = compile(plan.matching, model.vocabulary, plan.prefix, plan.compile, model.context)
    for w in automaton.warnings:
        say(f"warning: {w}")
    return automaton


@contextlib.contextmanager
def _compiling(plan: QueryPlan, cancel: Optional[threading.Event], on_note: Optional[Callable[[str], None]]):
    """A compile of ``plan``'s automata: cancellable, within its max_memory, said to ``on_note``,
    its errors placed in the query text."""
    tick = None if on_note is None else lambda: on_note("compiling the automaton")
    try:
        with cancelling(cancel, tick), memory_bound(getattr(plan.traversal, "max_memory", None)):
            yield
    except Error as e:
        if e.role:  # MATCHING, PREFIX, a WHERE filter, or the filters together
            raise plan.source_error(e) from None
        raise
    finally:
        if on_note is not None:
            on_note("")


def _eval(node, env, source, condition: bool = False):
    try:
        value = evaluate(node, env)
        return truth(value, node) if condition else value
    except Error as e:
        if e.source is None:
            e.source = source
        raise


def run(plan: Plan, models: Models, cancel: Optional[threading.Event] = None,
        progress: Optional[Callable[[int], None]] = None, on_total: Optional[Callable[[int], None]] = None,
        rows: Optional[Callable[..., Iterator[Env]]] = None, stops: Optional[List[Stop]] = None,
        on_note: Optional[Callable[[str], None]] = None) -> Iterator[tuple]:
    """Output tuples of ``plan``. ``progress(n)`` is told of each result row (or data row);
    ``on_total(n)`` of how many there will be, when that is known; ``on_note(text)`` of the
    compile, and of how far the search for the next row has gone. ``rows(cancel, progress,
    on_total, masses, stops, on_note)``: where the result rows come from instead of this process
    (the Ray engine's ``Statement.rows``). ``stops`` collects the ``Stop`` of each search (of each data
    row) that a bound ended; they are also warned about on stderr."""
    masses: list = []
    stops = stops if stops is not None else []
    if not isinstance(plan, DatasetPlan) and on_total is not None and isinstance(plan.traversal, Sample):
        on_total(plan.traversal.n * len(plan.per_model()))
    if rows is not None:
        envs = rows(cancel, progress, on_total, masses, stops, on_note)
    elif isinstance(plan, DatasetPlan):
        envs = _dataset_rows(plan, models, cancel, progress, on_total, masses, stops, on_note)
    else:
        envs = _warned(_model_rows(plan, models, cancel, progress, stops, masses, on_total, on_note), stops)
    outputs = plan.outputs
    if not plan.aggregate:
        for env in envs:
            if not _counts_only(env):
                try:
                    yield tuple(_eval(o.expr, env, plan.source) for o in outputs)
                except Error as e:
                    if isinstance(plan, DatasetPlan) and isinstance(env, RowEnv):
                        raise in_data_row(e, plan, env.plan.param_dict().get("row_number")) from None
                    raise
        return
    groups: Dict[Any, List[Env]] = {}
    hits, counted = [], []
    beyond = [False] * len(plan.group_by)  # GROUP BY keys that read more of a row than its prefix
    held = _Held(plan)
    for env in envs:
        held.add(env)
        if _counts_only(env):  # only probability() counts it
            counted.append(env)
            continue
        key = _key(plan, env, beyond)
        groups.setdefault(key, []).append(env)
        hits.append((env, key))
    measured = _Measured(plan, masses, hits, counted, beyond) if masses else None
    if not groups and not plan.group_by:
        groups[()] = []
    empty: Dict[Any, Env] = {}  # groups measured to 0: a prefix class that only counted rows reached
    if measured is not None and plan.group_by and len(measured.prefix_keys) == len(plan.group_by):
        empty = {c: env for c, env in measured.classes.items() if c not in groups}
        groups.update((c, []) for c in empty)
    if measured is not None and not groups:
        say(_no_group_note(masses))
    for key in sorted(groups, key=_order):
        members = groups[key]
        if members:
            genv = _GroupEnv(members, key, measured)
        elif key in empty:
            genv = _GroupEnv([], key, measured, keys_from=empty[key])
        else:
            genv = _EmptyEnv(measured)
        yield tuple(_eval(o.expr, genv, plan.source) for o in outputs)


def _model_rows(plan: QueryPlan, models: Models, cancel, progress, stops, masses, on_total,
                on_note) -> Iterator[RowEnv]:
    """``query_rows`` of ``plan`` on each of its models in turn (FROM's list), or on its one model;
    a model's cached keys and values are dropped when its turn ends, so that the next model's
    query has max_memory to itself."""
    for one in plan.per_model():
        yield from query_rows(one, models, cancel, progress, stops, masses, on_total, on_note=on_note)
        if plan.models:
            models(one.model).set_cache_budget(0)


def _no_group_note(masses) -> str:
    """The note of a probability() query whose GROUP BY needs a key of the completion and met no
    string to read it from: its groups would all be 0, and an empty result reads as "nothing"."""
    draws = sum(m.draws for m in masses if not m.exact)
    why = (f"none of probability()'s {draws:,} draws was a string of the language" if draws else
           "no string of the language has a nonzero probability within the rules and bounds")
    return (f"note: no groups: {why}, so no group has a value to show (each would be 0); without GROUP BY "
            f"the query gives the whole language's probability" + (" and its interval" if draws else ""))


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


def _counts_only(env: Env) -> bool:
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
        values.append(hashable(_eval(g, env, plan.source)))
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
                        value = hashable(_eval(g, env, plan.source))
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


def _warned(envs: Iterator[Env], stops: List[Stop]) -> Iterator[Env]:
    """``envs``, then a warning on stderr for each stop they added to ``stops``."""
    before = len(stops)
    yield from envs
    for stop in stops[before:]:
        say(stop_warning(stop))


def in_data_row(e: Error, plan: DatasetPlan, number) -> Error:
    """``e`` saying which data row it arose in (its query's text is the same for every row)."""
    if number is not None and not isinstance(e, Cancelled) and " (data row " not in e.message:
        e.message += f" (data row {number} of {plan.path})"
    return e


def _dataset_rows(plan: DatasetPlan, models: Models, cancel, progress, on_total, masses, stopped,
                  on_note=None) -> Iterator[Env]:
    total = count_selected(plan)
    if not total:
        say(f"note: no data rows to run in {plan.path}" + (" (after its WHERE)" if plan.row_where is not None
                                                             else ""))
    if on_total is not None:
        on_total(total)
    before_stops = len(stopped)
    empty: List[Tuple[QueryPlan, Tuple[str, ...], bool, Optional[int]]] = []
    floors: List[float] = []
    for data in selected_rows(plan):
        if cancel is not None and cancel.is_set():
            raise Cancelled("the query was cancelled")
        try:
            for qplan in plan_row(plan, data).per_model():
                found, before = False, len(masses)
                for env in query_rows(qplan, models, cancel, stopped=stopped, masses=masses, no_row=empty,
                                      on_note=on_note, floors=floors):
                    found = True
                    yield env
                if not found and len(masses) == before:  # the row still counts: one row of NULL results (as
                    # a LEFT JOIN would give), one for each model; a measured one counts as 0
                    yield RowEnv(qplan, None, None, match_regex(qplan))
        except Error as e:
            raise in_data_row(e, plan, data.get("row_number")) from None
        if progress is not None:
            progress(1)
    if len(stopped) > before_stops:
        say(stopped_rows_warning(stopped[before_stops:], total))
    if empty:
        say(no_row_rows_note(empty, total))
    if floors:
        say(floor_warning(floors, total))


__all__ = ["run", "query_rows", "in_data_row", "compile_plan", "load", "RowEnv", "match_regex", "stop_warning",
           "stopped_rows_warning", "floor_warning", "no_row_note", "no_row_rows_note", "say", "keeping"]
