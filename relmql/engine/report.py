"""What a query leaves when its rows end (``QueryReport``), the notes and warnings made of it, and
the ``Listener`` through which a running query reaches the one who watches it."""

from __future__ import annotations

import contextvars
import sys
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

from ..execute import Mass, SampleStats, SearchStats
from ..execute.ledger import NO_ROW
from ..memory import DEFAULT_MAX_MEMORY, format_size, shares
from ..plan import QueryPlan
from ..records import Listener, Measure, Sample, ShortestPath, Stop

# where the notes and warnings of the query running now go (``say``): stderr unless a caller
# runs the query in a context of its own (``speaking``)
_TELL: contextvars.ContextVar[Optional[Callable[[str], None]]] = contextvars.ContextVar("relmql_tell", default=None)


def say(line: str) -> None:
    """Tell a note or warning of the query running now: on stderr, or to the function of the
    context it runs in (``speaking``)."""
    tell = _TELL.get()
    if tell is None:
        print(line, file=sys.stderr)
    else:
        tell(line)


def speaking(tell: Callable[[str], None]) -> contextvars.Context:
    """A context in which ``say`` calls ``tell(line)`` instead of writing on stderr (run each
    step of a query in it with ``Context.run``)."""
    context = contextvars.copy_context()
    context.run(_TELL.set, tell)
    return context


@dataclass
class QueryReport:
    """What one query's rows leave once they end (``query_rows``' return value)."""

    plan: QueryPlan
    rows: int = 0  # the rows the query gave (past WHERE, within LIMIT)
    mass: Optional[Mass] = None  # how probability() measured the language, where it did
    stop: Optional[Stop] = None  # the bound that ended the search, with the rows the user saw
    floor: Optional[float] = None  # where a local estimate fell below it, its canonical floor
    no_row: Tuple[str, ...] = ()  # why the search found no row, or which bounds cut its language short
    partial: bool = False  # ``no_row`` cut a language short that gave rows (or probability())
    fewest: Optional[int] = None  # the tokens each string takes at least, where none fits max_tokens
    reread: Optional[str] = None  # the note of keys and values read again (``reread_note``)

    def notes(self, dataset: bool = False) -> List[str]:
        """The notes and warnings of this query said when its rows end (of a dataset's data row,
        only its own; the rest is said of all data rows together, ``closing_notes``)."""
        out = [self.reread] if self.reread else []
        if dataset:
            return out
        if self.floor is not None:
            out.append(floor_warning([self.floor]))
        if self.no_row:
            out.append(no_row_note(self.plan, self.no_row, self.partial, stopped=self.stop is not None,
                                   fewest=self.fewest))
        return out


def ended(report: Optional[QueryReport], listener: "Listener", dataset: bool = False) -> None:
    """Say the notes of a query whose rows are over, and tell the listener (every engine, in
    process or on Ray workers, ends each query here)."""
    if report is None:  # LIMIT 0
        return
    for line in report.notes(dataset):
        say(line)
    listener.ended(report)


def closing_notes(reports: List[QueryReport], rows: Optional[int] = None) -> List[str]:
    """The notes and warnings said once all of a statement's queries are over: each stopped
    search's, or, of a dataset's ``rows`` data rows, how many a bound stopped, how many had no
    row, and how many estimates fell below their floor."""
    stops = [r.stop for r in reports if r.stop is not None]
    if rows is None:
        return [stop_warning(s) for s in stops]
    out = [stopped_rows_warning(stops, rows)] if stops else []
    empty = [r for r in reports if r.no_row]
    if empty:
        out.append(no_row_rows_note(empty, rows))
    floors = [r.floor for r in reports if r.floor is not None]
    if floors:
        out.append(floor_warning(floors, rows))
    return out


QUIET = Listener()


REREAD_NOTE = 1024  # tokens read again for want of room for their keys and values, past which a query says so


def reread_note(plan: QueryPlan, tokens: int, again: int) -> Optional[str]:
    """The note of a query whose model read most of its ``tokens`` ``again`` because the keys and
    values of earlier tokens (a long prompt's, say) did not fit the query's share of max_memory:
    the query was slower than it needs to be, and a larger max_memory keeps them. None otherwise."""
    if again >= REREAD_NOTE and 2 * again > tokens:
        kv = shares(getattr(plan.traversal, "max_memory", None) or DEFAULT_MAX_MEMORY).kv
        return (f"note: the model read {again:,} of its {tokens:,} tokens again: their keys and values did not "
                f"fit max_memory's share for them ({format_size(kv)}); raise max_memory to keep them")
    return None


def nodes_note(stats: SearchStats, opts: ShortestPath) -> str:
    """How far a search has gone, for a progress bar: the nodes it has expanded, those spent on the
    row it looks for against ``max_nodes_per_row`` (the bound that ends a search that finds none)
    and, by ``total_prob``, the prefix's against ``max_prefix_nodes``, each with the option's
    name, so that the bound a long wait runs into can be seen and raised."""
    text = f"{stats.expanded:,} nodes"
    if opts.max_nodes is not None:
        text += f" of max_nodes {opts.max_nodes:,}"
    if opts.max_nodes_per_row is not None:
        text += (f", {stats.since_row:,} of max_nodes_per_row {opts.max_nodes_per_row:,} "
                 f"for row {stats.rows + 1:,}")
    if opts.order == "total_prob" and stats.prefix:
        text += f", {stats.prefix:,} of max_prefix_nodes {opts.max_prefix_nodes:,} in the prefix"
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


def no_row_rows_note(reports: List[QueryReport], rows: int) -> str:
    """The note of a dataset query some of whose ``rows`` data rows have no row, or fewer than
    their language holds, for the reasons in their ``reports`` (``no_row_note``)."""
    parts = []
    for partial, words in ((False, "have no rows"), (True, "were cut short")):
        mine = [r for r in reports if r.partial == partial]
        if mine:
            causes = tuple(c for c in NO_ROW if any(c in r.no_row for r in mine))
            parts.append(f"{len(mine):,} of {rows:,} data rows {words}: {_causes(mine[0].plan, causes, short=True)}")
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



def no_group_note(masses) -> str:
    """The note of a probability() query whose GROUP BY needs a key of the completion and met no
    string to read it from: its groups would all be 0, and an empty result reads as "nothing"."""
    draws = sum(m.draws for m in masses if not m.exact)
    why = (f"none of probability()'s {draws:,} draws was a string of the language" if draws else
           "no string of the language has a nonzero probability within the rules and bounds")
    return (f"note: no groups: {why}, so no group has a value to show (each would be 0); without GROUP BY "
            f"the query gives the whole language's probability" + (" and its interval" if draws else ""))
