"""EXPLAIN: a plan in words, with the sizes of its compiled automaton and of its model.

Entry point: ``explain(plan, models)``. It stands above the engine: it loads the plan's model and
compiles its automaton (a dataset plan's: its first data row's) as running the query would, and runs
nothing on the model.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

from .automata import TokenAutomaton
from .automata.bytedfa import format_count
from .engine import Models, compile_plan, load
from .execute.measure import bounds_first, canonical_part, not_apart, token_sequences
from .execute.pipeline import pipelined
from .memory import format_size, shares
from .models import LanguageModel
from .plan import DatasetPlan, Plan, QueryPlan, count_selected, plan_row, selected_rows
from .records import Measure, Sample
from .syntax import quote, unparse


def explain(plan: Plan, models: Models) -> str:
    """The plan as aligned ``key  value`` lines, with the sizes of its model (from ``models``) and
    automaton; a dataset plan shows its first selected data row's query (none: that none runs,
    as running it says)."""
    if isinstance(plan, DatasetPlan):
        total = count_selected(plan)
        if not total:
            lines = [("dataset", f"{plan.path}: no data rows to run")]
            if plan.row_where is not None:
                lines.append(("rows", f"WHERE {unparse(plan.row_where)}"))
            return _aligned(lines)
        first = plan_row(plan, next(selected_rows(plan)))
        model = load(first, models)
        return _lines(first, compile_plan(first, model), model, plan, total)
    model = load(plan, models)
    return _lines(plan, compile_plan(plan, model), model)


def _clip(text: str, width: int = 100) -> str:
    text = quote(text)
    return text if len(text) <= width else text[:width - 5] + "...'" + f" ({len(text) - 2:,} characters)"


class _Subject(NamedTuple):
    """What EXPLAIN describes, for each of its sections."""
    plan: QueryPlan  # the query's plan (a dataset's: its first data row's)
    automaton: TokenAutomaton  # the plan compiled for the model
    model: LanguageModel  # the plan's model, loaded
    dataset: Optional[DatasetPlan]  # the dataset plan the query is the first row of, or None
    dataset_rows: int  # the dataset's data rows that run


def _lines(plan: QueryPlan, automaton: TokenAutomaton, model: LanguageModel, dataset: Optional[DatasetPlan] = None,
           dataset_rows: int = 0) -> str:
    """EXPLAIN's text of ``plan``, compiled into ``automaton`` for ``model`` (the first of
    ``dataset_rows`` queries of ``dataset``): its sections in turn."""
    subject = _Subject(plan, automaton, model, dataset, dataset_rows)
    return _aligned([line for section in _SECTIONS for line in section(subject)])


def _dataset(s: _Subject) -> List[tuple]:
    if s.dataset is None:
        return []
    lines = [("dataset", f"{s.dataset.path}: {s.dataset_rows:,} rows (one query per row; the first row's plan is "
                         "below)")]
    if s.dataset.row_where is not None:
        lines.append(("rows", f"WHERE {unparse(s.dataset.row_where)}"))
    return lines


def _model(s: _Subject) -> List[tuple]:
    plan, model = s.plan, s.model
    dtype = getattr(model, "dtype", None)
    lines = [("model", f"{plan.model.name} on {model.device}"
              + (f" ({str(dtype).replace('torch.', '')})" if dtype else "") + f", {len(model.vocabulary):,} tokens")]
    if plan.models:
        lines.append(("models", f"the query runs on each of {', '.join(m.name for m in plan.models)} in turn (each "
                                f"loaded when its turn comes; the plan below is {plan.model.name}'s)"))
    if plan.under:
        lines.append(("scoring", "logprob_under() loads " + ", ".join(m.name for m in plan.under)))
    lines.append(("numbers", getattr(model, "approximate", None)
                  or "exact: float32, as direct scoring with transformers"))
    if getattr(model, "attention", None):
        lines.append(("attention", model.attention))
    return lines


def _traversal(s: _Subject) -> List[tuple]:
    t = s.plan.traversal
    return _measure(s) if isinstance(t, Measure) else _sample(s) if isinstance(t, Sample) else _shortest(s)


def _measure(s: _Subject) -> List[tuple]:
    t, automaton = s.plan.traversal, s.automaton
    exact = (f"summed exactly over every token sequence when there are at most {t.exact_limit:,}; otherwise "
             if t.exact_limit else "")
    how = ("importance-weighted local draws" if t.mode == "local" else "rejection draws")
    lines = [("traversal", f"probability(): {exact}estimated from {t.samples:,} independent {how} (seed {t.seed}), "
                           f"{t.confidence:.0%} intervals; at most {t.max_tokens} completion tokens")]
    n = token_sequences(automaton, t)
    need = automaton.too_long(t.max_tokens) if n == 0 else None
    prefixes = automaton.count_paths(automaton.start, t.max_prefix_tokens, prefix_only=True)
    lines.append(("measure", f"exact: {n:,} token sequences" + (
        f" (each string takes at least {need:,} completion tokens, and max_tokens is {t.max_tokens:,})"
        if need else "") if n is not None else
        (f"estimate: more than {t.exact_limit:,} token sequences" if t.exact_limit else "estimate")
        + _canonical_apart(automaton, t, prefixes) + (
            f"; first the search's {t.bound_nodes:,} most probable nodes bound it for certain (and sum it "
            "if they read it whole)" if bounds_first(t, prefixes) else "")))
    if s.plan.prefix:
        lines.append(("prefixes", f"{format_count(prefixes)} token path{'s' if prefixes != 1 else ''}; "
                      + "probability() is the mean over them (per value of the GROUP BY keys that the prefix "
                        "fixes), not their sum"))
    return lines


def _sample(s: _Subject) -> List[tuple]:
    t = s.plan.traversal
    mode = ("local: each step renormalized over the tokens the language allows; rows carry importance weights"
            if t.mode == "local" else "exact: rejection, the model's distribution conditioned on the language")
    return [("traversal", f"SAMPLE {t.n:,} with seed {t.seed}, batches of {t.batch_size}, "
                          f"at most {t.max_tokens} completion tokens"),
            ("sampling", mode),
            ("prefix draw", "uniform over the prefix strings")]


def _shortest(s: _Subject) -> List[tuple]:
    plan, t = s.plan, s.plan.traversal
    rows = lambda n: f"{n:,} row{'s' if n != 1 else ''}"  # noqa: E731
    stop = (f", stops after {rows(t.limit)}" if t.limit is not None else
            f", stops once {rows(plan.limit)} passed WHERE" if plan.limit is not None and plan.where is not None
            else ", runs until the language is exhausted")
    why = (f" (the default when {t.order_default}: ORDER BY prob would read every variant of the prefix before "
           "its first row)" if t.order_default else "")
    grow = f" (up to {t.max_batch_size} while rows are far apart)" if t.max_batch_size else ""
    bounds = [f"max_nodes {t.max_nodes:,}"] if t.max_nodes is not None else []
    bounds += [f"{t.max_nodes_per_row:,} completion nodes without a row (max_nodes_per_row)"] \
        if t.max_nodes_per_row else []
    bounds += [f"{t.max_prefix_nodes:,} prefix nodes (max_prefix_nodes)"] if t.order == "total_prob" else []
    bounds += [f"its share of max_memory ({format_size(shares(t.max_memory).traversal)} of "
               f"{format_size(t.max_memory)})"]
    said = " (pipeline on)" if t.pipeline else " (pipeline off)" if t.pipeline is False else (
        " (the model is off the CPU)" if pipelined(t, s.model) else " (the model shares the CPU)")
    flight = ("the next batch is picked while a model call is in flight" if pipelined(t, s.model) else
              "model calls one after another") + said
    return [("traversal", f"shortest path: most probable first by {t.order}{why}{stop}; batches of {t.batch_size} "
                          f"nodes{grow}, at most {t.max_tokens} completion tokens; {flight}"),
            ("bounds", "the search stops, keeping the rows found, at " + ", ".join(bounds))]


def _length(s: _Subject) -> List[tuple]:
    t = s.plan.traversal
    if isinstance(t, Measure) or not (need := s.automaton.too_long(t.max_tokens)):
        return []
    return [("length", f"no string fits: each takes at least {need:,} completion tokens, and max_tokens is "
                       f"{t.max_tokens:,} (" + ("SAMPLE refuses to draw)" if isinstance(t, Sample) else
                                                 "the search gives no rows, at once)"))]


def _decoding(s: _Subject) -> List[tuple]:
    rules = s.plan.decoding.describe()
    return [("decoding", ", ".join(rules) + "; prefix tokens at the model's own probability" if rules
             else "the model's distribution (no top-k, top-p or temperature)")]


def _prompt(s: _Subject) -> List[tuple]:
    plan, model = s.plan, s.model
    rendered = getattr(model, "rendered", None)
    if rendered is None:
        return []
    how = ("raw text after the start token" if not plan.prompt.is_chat else
           "the model's chat template" if plan.prompt.template is None else "the chat_template given")
    lines = [("PROMPT", f"{len(rendered.ids):,} tokens ({how}; special tokens in ⟨⟩): "
                        f"{rendered.shown(model.vocabulary)}")]
    if plan.prompt.is_chat:
        eot = rendered.end_of_turn
        name = model.vocabulary.tokenizer.convert_ids_to_tokens(eot) if eot is not None else None
        lines.append(("end of turn", (f"⟨{name}⟩ (id {eot}): eos means it" if eot is not None else "none found: eos "
                                      "is the model's end-of-text token")
                      + ("; the reply goes on the assistant's last message" if rendered.continues else "")))
    return lines


def _language(s: _Subject) -> List[tuple]:
    plan, c = s.plan, s.plan.compile
    lines = [("MATCHING", _clip(plan.matching))]
    if plan.prefix is not None:
        lines.append(("PREFIX", _clip(plan.prefix)))
    lines.append(("tokenization", f"prefix {c.prefix_tokenization}, completion {c.tokenization}"))
    if c.edits:
        lines.append(("edits", f"up to {c.edits} (insert, delete, substitute) in {c.edit_scope}"))
    lines += [("filter", f"in the automaton: text NOT MATCHING {_clip(regex, 80)}") for regex in c.exclude]
    if plan.where is not None:
        lines.append(("filter", f"on result rows: {unparse(plan.where)}"))
    lang = s.automaton.language
    lines.append(("automaton", f"byte DFA with {lang.dfa.num_states:,} states and {lang.dfa.num_arcs:,} arcs; "
                               f"token arcs built lazily as the traversal reaches states"))
    lines.append(("strings", format_count(s.automaton.num_strings)))
    return lines


def _result(s: _Subject) -> List[tuple]:
    plan, dataset = s.plan, s.dataset
    lines = []
    if plan.aggregate:
        if plan.group_by:
            lines.append(("GROUP BY", ", ".join(unparse(g) for g in plan.group_by)))
        lines.append(("aggregate", "over every result row" + (" of every data row" if dataset is not None else "")))
    if plan.limit is not None and (plan.where is not None or isinstance(plan.traversal, Sample)):
        lines.append(("LIMIT", f"{plan.limit:,} result rows"))
    outputs = dataset.outputs if dataset is not None else plan.outputs
    lines.append(("columns", ", ".join(o.name for o in outputs)))
    test = dataset.test if dataset is not None else plan.test
    if test is not None:
        weight = f"each row adds its {test.weight} to its cell" if test.weight else "each row counts once"
        scaled = (f", probabilities standing for {test.n_per_row:,} draws per value of {test.a}" if test.n_per_row
                  else "")
        lines.append(("TEST", f"χ² test of independence of {test.a} and {test.b} once the rows are in: "
                              f"{weight}{scaled}"))
    return lines


# EXPLAIN's sections, in the order it shows them
_SECTIONS = (_dataset, _model, _traversal, _length, _decoding, _prompt, _language, _result)


def _aligned(lines: List[tuple]) -> str:
    """``(key, value)`` lines as ``key  value``, the values aligned."""
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines)


def _canonical_apart(automaton: TokenAutomaton, t: Measure, prefixes: int) -> str:
    """How an estimate over every tokenization treats its canonical tokenizations, for the
    ``measure`` line ("" where its completion is canonical)."""
    if why := not_apart(automaton, t):
        return f"; the draws alone (the canonical tokenizations not treated apart: {why})"
    split = canonical_part(automaton, t, prefixes)
    if split is None:
        return ""
    if split[1] is not None:
        return (f"; their {split[1]:,} canonical tokenization{'s' if split[1] != 1 else ''} summed exactly, "
                f"the other tokenizations from the draws")
    why = ("more canonical tokenizations than exact_limit" if prefixes == 1 else
           f"the prefix has {format_count(prefixes)} token paths")
    return (f"; half the draws follow and measure the canonical tokenizations ({why}), half the other "
            f"tokenizations, the two parts summed")
