"""The plan records: ``QueryPlan``, ``DatasetPlan`` and their parts (docs/architecture.md, "Planning")."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from ..errors import Error
from ..records import CompileOptions, Decoding, ModelRef, Prompt, Traversal
from ..syntax import ast as A
from .expect import ExpectPlan
from .options import shown

TESTS = ("independence",)


@dataclass(frozen=True)
class Output:
    """One output column: its name, the expression that computes it and the kind of its values
    (``relmql.records.KINDS``), which tells the faces how to show them."""

    name: str  # the column's name (its alias, its expression's text, or prob_2 for a name given twice)
    expr: A.Node  # the expression that computes it from a row
    kind: str  # the kind of its values: text, number, bool...


@dataclass(frozen=True)
class TestPlan:
    """``TEST INDEPENDENCE OF a, b``: a χ² test of independence over the output rows, ``a`` and
    ``b`` naming output columns. Each row adds its ``weight`` column to its cell (1 when None:
    rows are counted); probabilities stand for ``n_per_row`` draws per value of ``a``."""

    a: str  # the first category column
    b: str  # the second category column
    weight: Optional[str] = None  # the column that weighs each row's cell; None: rows are counted
    n_per_row: Optional[int] = None  # the draws a probability weight stands for, per value of a


@dataclass(frozen=True)
class QueryPlan:
    """Everything needed to run one query, every option typed and checked.

    ``compile.exclude``: regexes removed from the language in the automaton (compiled filters),
    each written at ``exclude_spans`` (with its characters' ``exclude_offsets`` where it is a
    string literal); ``where``: the part of WHERE evaluated on result rows. ``limit`` bounds the
    result rows (after ``where``); aggregates run over them.
    """

    source: str  # the query's text
    model: ModelRef  # the model the query runs on
    matching: str  # MATCHING's regex, evaluated
    prefix: Optional[str]  # PREFIX's regex, evaluated; None: no prefix
    compile: CompileOptions  # how to build the automaton
    decoding: Decoding  # the rules applied to the next-token distributions
    traversal: Traversal  # how to walk the automaton: ShortestPath, Sample or Measure
    outputs: Tuple[Output, ...]  # the output columns
    where: Optional[A.Node] = None  # the part of WHERE evaluated on result rows
    group_by: Tuple[A.Node, ...] = ()  # GROUP BY's expressions
    aggregate: bool = False  # whether the outputs aggregate rows
    limit: Optional[int] = None  # the most result rows (after where)
    params: Tuple[Tuple[str, Any], ...] = ()  # the parameters' values, by name
    group_names: Tuple[str, ...] = ()  # MATCHING's named groups (columns too)
    matching_span: Tuple[int, int] = (0, 0)  # where MATCHING's value is written
    prefix_span: Optional[Tuple[int, int]] = None  # where PREFIX's value is written
    model_span: Optional[Tuple[int, int]] = None  # where FROM's model is written
    matching_offsets: Optional[Sequence[int]] = field(default=None, repr=False)  # each regex character's place
    prefix_offsets: Optional[Sequence[int]] = field(default=None, repr=False)  # the same for PREFIX
    test: Optional[TestPlan] = None  # TEST INDEPENDENCE, if asked
    exclude_spans: Tuple[Tuple[int, int], ...] = ()  # where each compiled WHERE filter is written
    exclude_offsets: Tuple[Optional[Sequence[int]], ...] = field(default=(), repr=False)  # their characters' places
    option_spans: Tuple[Tuple[str, Tuple[int, int]], ...] = field(default=(), repr=False)  # USING name value
    prompt: Optional[Prompt] = None  # PROMPT's text or conversation
    prompt_span: Optional[Tuple[int, int]] = None  # where PROMPT is written
    models: Tuple[ModelRef, ...] = ()  # FROM's models where it names several: the query runs on each
    under: Tuple[ModelRef, ...] = ()  # the models logprob_under() and prob_under() score rows with
    expect: Optional[ExpectPlan] = None  # EXPECT's condition, if any

    @property
    def columns(self) -> Tuple[str, ...]:
        return tuple(o.name for o in self.outputs)

    def per_model(self) -> Tuple["QueryPlan", ...]:
        """This query on each of its models (itself where it has one)."""
        return tuple(replace(self, model=m) for m in self.models) if self.models else (self,)

    def param_dict(self) -> Dict[str, Any]:
        return dict(self.params)

    def source_error(self, err: Error) -> Error:
        """A compiler error (span inside a regex) moved onto the query text."""
        role = err.role or "MATCHING"
        if role.startswith("USING "):  # an option's value is what is too costly: under the option, if written
            span = dict(self.option_spans).get(role[len("USING "):])
            if span is not None:
                out = type(err)(err.message, span, self.source, err.hint)
                out.role = err.role
                return out
            role = "MATCHING"  # a session's SET: under the text the option applies to
        span, offsets = (self.prefix_span, self.prefix_offsets) if role == "PREFIX" else \
            (self.matching_span, self.matching_offsets)
        if role.startswith("exclusion "):  # the k-th compiled WHERE filter
            k = int(role.split()[1]) - 1
            if k >= len(self.exclude_spans):
                return err
            span, offsets, role = self.exclude_spans[k], self.exclude_offsets[k], "NOT MATCHING"
        elif role == "WHERE":  # the filters together
            if not self.exclude_spans:
                return err
            span, offsets = (self.exclude_spans[0][0], self.exclude_spans[-1][1]), None
            out = type(err)(err.message, span, self.source, err.hint)
            out.role = err.role
            return out
        if span is None:
            return err
        if offsets is not None and err.span is not None:
            s, e = err.span
            s = offsets[min(max(s, 0), len(offsets) - 1)]
            e = offsets[min(max(e, 0), len(offsets) - 1)]
            new_span = (s, max(e, s + 1))
        else:
            new_span = span
        message = err.message
        regex = self.prefix if role == "PREFIX" else self.matching if role == "MATCHING" else None
        if offsets is None and err.span is not None and regex is not None:  # a computed regex: where in it
            at = min(max(err.span[0], 0), len(regex))
            message += f", at character {at + 1} of the regex {role} evaluates to: {_around(regex, at)}"
        elif offsets is None and err.span is not None:
            message += f" (in the regex {role} evaluates to)"
        out = type(err)(message, new_span, self.source, err.hint)
        out.role = err.role
        return out


def _around(text: str, at: int, width: int = 30) -> str:
    """``text`` quoted with ``⟨here⟩`` at position ``at``, clipped to ``width`` characters each side."""
    before, after = text[max(0, at - width):at], text[at:at + width]
    return ("…" if at > width else "") + shown(before + "⟨here⟩" + after) + ("…" if at + width < len(text) else "")


@dataclass(frozen=True)
class DatasetPlan:
    """A query run once per row of a data file, the row's fields bound as parameters; ``plan_row``
    gives each row's ``QueryPlan``. Outputs and aggregates span all rows."""

    source: str  # the query's text
    query: A.Query  # the query, planned again for each data row
    path: str  # the data file
    settings: Tuple[Tuple[str, Any], ...]  # the session's options, by name
    params: Tuple[Tuple[str, Any], ...]  # the parameters' values (each row's fields join them)
    outputs: Tuple[Output, ...]  # the output columns
    aggregate: bool  # whether the outputs aggregate rows
    group_by: Tuple[A.Node, ...]  # GROUP BY's expressions
    row_where: Optional[A.Node] = None  # FOR EACH ROW ... WHERE: the data rows to run
    row_limit: Optional[int] = None  # FOR EACH ROW ... LIMIT: the most data rows
    test: Optional[TestPlan] = None  # TEST INDEPENDENCE over all rows, if asked
    expect: Optional[ExpectPlan] = None  # EXPECT's condition, if any

    @property
    def columns(self) -> Tuple[str, ...]:
        return tuple(o.name for o in self.outputs)


Plan = Union[QueryPlan, DatasetPlan]
