"""Query (syntax tree) → a typed ``QueryPlan`` (or a ``DatasetPlan``: one query per data row)."""

from __future__ import annotations

import csv
import itertools
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Collection, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from ..errors import Error, closest
from ..records import (COLUMNS, COMPUTED_COLUMNS, SAMPLE_BATCH_SIZE, CompileOptions, Decoding, Measure, ModelRef,
                       Prompt, Sample, ShortestPath, Traversal)
from ..syntax import ast as A
from ..syntax import string_literal_at, unparse
from ..syntax.regexes import compiled
from .expr import (AGGREGATES, Env, check_calls, escape, evaluate, is_aggregate, is_probability, kind, truth,
                   weighs_cells)
from .expect import ExpectPlan, plan_expect
from .models import plan_models, several_models, under_models
from .options import OPTIONS, PlanError, option, shown, whole_number
from .prompt import plan_prompt

ORDER_COLUMNS = {"prob": "prob", "total_prob": "total_prob", "logprob": "prob", "total_logprob": "total_prob"}
DEFAULT_COLUMNS = ("rank", "text", "prob")
DATASET_FIELDS = ("row_number",)


@dataclass(frozen=True)
class Output:
    """One output column: its name, the expression that computes it and the kind of its values
    (``relmql.records.KINDS``), which tells the faces how to show them."""

    name: str
    expr: A.Node
    kind: str


def _output(name: str, expr: A.Node) -> Output:
    return Output(name=name, expr=expr, kind=kind(expr))


@dataclass(frozen=True)
class TestPlan:
    """``TEST INDEPENDENCE OF a, b``: a χ² test of independence over the output rows, ``a`` and
    ``b`` naming output columns. Each row adds its ``weight`` column to its cell (1 when None:
    rows are counted); probabilities stand for ``n_per_row`` draws per value of ``a``."""

    a: str
    b: str
    weight: Optional[str] = None
    n_per_row: Optional[int] = None


TESTS = ("independence",)


@dataclass(frozen=True)
class QueryPlan:
    """Everything needed to run one query, every option typed and checked.

    ``compile.exclude``: regexes removed from the language in the automaton (compiled filters),
    each written at ``exclude_spans`` (with its characters' ``exclude_offsets`` where it is a
    string literal); ``where``: the part of WHERE evaluated on result rows. ``limit`` bounds the
    result rows (after ``where``); aggregates run over them.
    """

    source: str
    model: ModelRef
    matching: str
    prefix: Optional[str]
    compile: CompileOptions
    decoding: Decoding
    traversal: Traversal
    outputs: Tuple[Output, ...]
    where: Optional[A.Node] = None
    group_by: Tuple[A.Node, ...] = ()
    aggregate: bool = False
    limit: Optional[int] = None
    params: Tuple[Tuple[str, Any], ...] = ()
    group_names: Tuple[str, ...] = ()
    matching_span: Tuple[int, int] = (0, 0)
    prefix_span: Optional[Tuple[int, int]] = None
    model_span: Optional[Tuple[int, int]] = None
    matching_offsets: Optional[Sequence[int]] = field(default=None, repr=False)
    prefix_offsets: Optional[Sequence[int]] = field(default=None, repr=False)
    test: Optional[TestPlan] = None
    exclude_spans: Tuple[Tuple[int, int], ...] = ()
    exclude_offsets: Tuple[Optional[Sequence[int]], ...] = field(default=(), repr=False)
    option_spans: Tuple[Tuple[str, Tuple[int, int]], ...] = field(default=(), repr=False)  # USING name value
    prompt: Optional[Prompt] = None
    prompt_span: Optional[Tuple[int, int]] = None
    models: Tuple[ModelRef, ...] = ()  # FROM's models where it names several: the query runs on each
    under: Tuple[ModelRef, ...] = ()  # the models logprob_under() and prob_under() score rows with
    expect: Optional[ExpectPlan] = None

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

    source: str
    query: A.Query
    path: str
    settings: Tuple[Tuple[str, Any], ...]
    params: Tuple[Tuple[str, Any], ...]
    outputs: Tuple[Output, ...]
    aggregate: bool
    group_by: Tuple[A.Node, ...]
    row_where: Optional[A.Node] = None
    row_limit: Optional[int] = None
    test: Optional[TestPlan] = None
    expect: Optional[ExpectPlan] = None

    @property
    def columns(self) -> Tuple[str, ...]:
        return tuple(o.name for o in self.outputs)


Plan = Union[QueryPlan, DatasetPlan]


class _ConstEnv(Env):
    def __init__(self, params: Mapping[str, Any], source: str, where: str):
        self.params, self.source, self.where = params, source, where

    def column(self, node):
        raise PlanError(f"{self.where} cannot refer to the result column {node.name!r}", node.span, self.source,
                        hint="use a :parameter or a string")

    def param(self, node):
        if node.name not in self.params:
            near = closest(node.name, self.params)
            raise PlanError(f"parameter :{node.name} has no value" + (f"; did you mean :{near}?" if near else ""),
                            node.span, self.source,
                            hint="bind it with params={...} in Python, --param name=value on the command line, "
                                 "or a dataset field")
        return self.params[node.name]

    def group(self, key, node):
        raise PlanError(f"{self.where} cannot use group(): there is no result row yet", node.span, self.source)


def check_params(plan: QueryPlan) -> None:
    """Refuse a parameter without a value in the columns, WHERE or GROUP BY before the query
    runs (else it is found at the first row, after the model has loaded and the search run;
    EXPLAIN shows such a plan)."""
    env = _ConstEnv(plan.param_dict(), plan.source, "")
    for expr in [o.expr for o in plan.outputs] + [plan.where] * (plan.where is not None) + list(plan.group_by):
        for node in expr.walk():
            if isinstance(node, A.Param):
                env.param(node)


def constant(node: A.Node, params, source, where):
    """The value of an expression that refers to no result row (params and functions only)."""
    check_calls(node, source, allow_aggregates=False, allow_rows=False)
    try:
        return evaluate(node, _ConstEnv(params, source, where))
    except Error as e:
        raise _sourced(e, source) from None


def _sourced(e: Error, source: str) -> Error:
    if e.source is None and e.span is not None:
        e.source = source
    return e


def _text(node, params, source, where, what: str = "a regex") -> str:
    value = constant(node, params, source, where)
    if not isinstance(value, str):
        raise PlanError(f"{where} must be text ({what}), not {shown(value)}", node.span, source)
    return value


def _count(node, params, source, what) -> int:
    value = constant(node, params, source, what)
    n = whole_number(value)  # 1e3 and a parameter's text too
    if n is None or n < 0:
        raise PlanError(f"{what} must be a whole number of zero or more, not {shown(value)}", node.span, source)
    return n


def plan(query: A.Query, source: str, settings: Mapping[str, Any], params: Optional[Mapping[str, Any]] = None) -> Plan:
    """The plan of ``query`` (its text is ``source``) under the session ``settings`` and ``params``."""
    params = dict(params or {})
    if query.dataset is not None:
        return _plan_dataset(query, source, settings, params)
    return _plan_query(query, source, settings, params)


def _plan_query(query: A.Query, source: str, settings, params) -> QueryPlan:
    if query.matching is None:
        raise PlanError("a query needs MATCHING 'regex': the set of strings to look for",
                        (query.span[0], query.span[1]) if query.span != (0, 0) else None, source)
    matching = _text(query.matching, params, source, "MATCHING")
    prefix = _text(query.prefix, params, source, "PREFIX") if query.prefix is not None else None
    opts = _options(query, source, settings, params)
    models = plan_models(query.model, opts, params, source)
    model = models[0]
    prompt = plan_prompt(query.prompt, _ConstEnv(params, source, "PROMPT"), source, opts["chat_template"],
                         dict((o.name, o.span) for o in query.using).get("chat_template"))
    decoding = Decoding(**{name: opts[name] for name, spec in OPTIONS.items() if spec.where == "decoding"})
    if query.sample is not None and query.order:
        raise PlanError("a query either samples (SAMPLE n) or ranks (ORDER BY), not both", query.order[0].span, source)
    limit = _count(query.limit, params, source, "LIMIT") if query.limit is not None else None

    groups = _group_names(matching)
    outputs, aggregate, group_by = _select(query, source, groups, len(models) > 1)
    where, exclude = _where(query, source, params, groups, opts)
    push = limit if where is None else None  # the traversal may stop at LIMIT only when no row is filtered out
    measured = next((n for o in outputs for n in o.expr.walk() if isinstance(n, A.Call) and n.name == "probability"),
                    None)
    if measured is not None:
        if query.order:
            raise PlanError("probability() measures the whole language; it cannot be combined with ORDER BY",
                            query.order[0].span, source, hint="leave out ORDER BY, or use sum(prob) over ranked rows")
        if limit is not None:
            raise PlanError("probability() measures the whole language; LIMIT would cut it short",
                            query.limit.span, source)
        sampled = query.sample is not None
        traversal = Measure(exact_limit=0 if sampled else opts["exact_limit"],
                            samples=_count(query.sample, params, source, "SAMPLE") if sampled
                            else opts["estimate_samples"],
                            seed=opts["seed"], mode=opts["sampling"], max_tokens=opts["max_tokens"],
                            batch_size=opts["batch_size"], max_prefix_tokens=opts["max_prefix_tokens"],
                            confidence=opts["confidence"], max_memory=opts["max_memory"],
                            max_draws=opts["max_draws"],
                            # the bound is of the whole language: of no use to groups, filtered rows, a model of several
                            bound_nodes=opts["bound_nodes"] if not (group_by or where is not None or len(models) > 1)
                            else 0)
        if traversal.samples < 1:
            raise PlanError("an estimate needs at least one sample", query.sample.span, source)
    elif query.sample is not None:
        n = _count(query.sample, params, source, "SAMPLE")
        if push is not None:
            n = min(n, push)
        traversal = Sample(n=n, seed=opts["seed"], mode=opts["sampling"], max_tokens=opts["max_tokens"],
                           batch_size=opts["batch_size"] or SAMPLE_BATCH_SIZE,
                           max_prefix_tokens=opts["max_prefix_tokens"], max_memory=opts["max_memory"],
                           max_draws=opts["max_draws"])
    else:
        order, why = "prob", None
        if prefix is not None and opts["edits"] and opts["edit_scope"] != "completion":
            # ORDER BY prob could release no row before every edited prefix is read; the whole
            # sequence's probability (ReLM's order) streams, each prefix bounding what is below it
            order, why = "total_prob", "the prefix has edits"
        if query.order:
            if len(query.order) > 1:
                raise PlanError("ORDER BY takes one column: prob or total_prob", query.order[1].span, source)
            key = query.order[0]
            if key.column not in ORDER_COLUMNS:
                near = closest(key.column, ORDER_COLUMNS)
                raise PlanError(f"cannot order by {key.column!r}: results come most probable first, by prob or "
                                f"total_prob" + (f"; did you mean {near}?" if near else ""), key.span, source)
            if not key.descending:
                raise PlanError("results come most probable first: only ORDER BY ... DESC is possible", key.span,
                                source)
            order, why = ORDER_COLUMNS[key.column], None
        traversal = ShortestPath(order=order, order_default=why, limit=push, max_tokens=opts["max_tokens"],
                                 **ShortestPath.batches(opts["batch_size"]),
                                 max_prefix_tokens=opts["max_prefix_tokens"],
                                 max_nodes=opts["max_nodes"], max_nodes_per_row=opts["max_nodes_per_row"],
                                 max_memory=opts["max_memory"])
        if not query.select and order == "total_prob":
            outputs = tuple(_output(c, A.Column(c)) for c in ("model",) * bool(len(models) > 1) +
                            ("rank", "text", "total_prob"))
    compile_options = CompileOptions(tokenization=opts["tokenization"], prefix_tokenization=opts["prefix_tokenization"],
                                     edits=opts["edits"], edit_scope=opts["edit_scope"],
                                     exclude=tuple(x.regex for x in exclude),
                                     max_states=opts["max_states"])
    m_off = string_literal_at(source, query.matching.span) if isinstance(query.matching, A.Literal) else None
    p_off = string_literal_at(source, query.prefix.span) if isinstance(query.prefix, A.Literal) else None
    return QueryPlan(source=source, model=model, matching=matching, prefix=prefix, compile=compile_options,
                     decoding=decoding, traversal=traversal, outputs=outputs, where=where, group_by=group_by,
                     aggregate=aggregate, limit=limit, params=tuple(sorted(params.items(), key=lambda kv: kv[0])),
                     group_names=groups, matching_span=query.matching.span,
                     prefix_span=query.prefix.span if query.prefix is not None else None,
                     model_span=query.model.span if query.model is not None else None,
                     matching_offsets=m_off,
                     prefix_offsets=p_off,
                     test=_test(query.test, outputs, aggregate, source, opts["test_draws"]),
                     exclude_spans=tuple(x.span for x in exclude),
                     exclude_offsets=tuple(x.offsets for x in exclude),
                     option_spans=tuple((option(o.name).name, o.span) for o in query.using),
                     prompt=prompt, prompt_span=query.prompt.span if query.prompt is not None else None,
                     models=models if len(models) > 1 else (),
                     under=under_models(outputs, where, group_by, opts, params, source),
                     expect=plan_expect(query.expect, [o.name for o in outputs], query.test is not None, source,
                                            opts["confidence"]))


def _options(query: A.Query, source: str, settings, params) -> Dict[str, Any]:
    opts = dict(settings)
    seen = {}
    for o in query.using:
        spec = option(o.name, o.name_span, source)
        if spec.session_only:
            how = "FROM model" if spec.name == "model" else f"SET {spec.name} = ..."
            raise PlanError(f"{spec.name} cannot be set per query; use {how}", o.name_span, source)
        if spec.name in seen:
            raise PlanError(f"option {spec.name} is given twice", o.name_span, source)
        seen[spec.name] = True
        if o.value is None:
            if spec.kind != "bool":
                raise PlanError(f"{spec.name} needs a value", o.name_span, source, hint=f"{spec.name}: {spec.doc}")
            value = True
        else:
            value = constant(o.value, params, source, "USING")
        opts[spec.name] = spec.check(value, o.value.span if o.value is not None else o.span, source)
    return opts


_NAMED_GROUP = re.compile(r"\(\?P<([^\W\d]\w*)>")
READ_WHOLE = 100_000  # re compiles about 250,000 characters of a pattern a second


def _group_names(matching: str) -> Tuple[str, ...]:
    if "(?P<" not in matching:
        return ()  # Python's only syntax for a named group
    if len(matching) > READ_WHOLE:  # the names as written: the compiler reads the pattern, and refuses it if too large
        return tuple(dict.fromkeys(_NAMED_GROUP.findall(matching)))
    try:
        return tuple(compiled(matching).groupindex)
    except (re.error, RecursionError, OverflowError, ValueError):
        return ()  # the compiler reports the pattern's error with its position


def _check_columns(node: A.Node, source: str, known, extra=()) -> None:
    names = list(known) + list(extra)
    for n in node.walk():
        if isinstance(n, A.Column) and n.name not in names:
            near = closest(n.name, names)
            hint = None if near else f"columns: {', '.join(names)}" if names else \
                "the dataset's WHERE chooses data rows before any query runs: it reads their fields (:name)"
            raise PlanError(f"unknown column {n.name!r}" + (f"; did you mean {near}?" if near else ""), n.span, source,
                            hint=hint)


def _select(query: A.Query, source: str, groups, several: bool = False
            ) -> Tuple[Tuple[Output, ...], bool, Tuple[A.Node, ...]]:
    """The output columns, whether they aggregate, and GROUP BY's expressions; ``several``: FROM
    names several models (the default columns and ``*`` include ``model``)."""
    known = tuple(COLUMNS) + COMPUTED_COLUMNS + tuple(groups)
    items: List[Output] = []
    for item in query.select:
        if isinstance(item.expr, A.Star):
            items.extend(_output(c, A.Column(c)) for c in ("model",) * several + COLUMNS
                         + ("prompt",) * (query.prompt is not None))
            continue
        check_calls(item.expr, source, allow_aggregates=True, allow_rows=True)
        _check_columns(item.expr, source, known)
        items.append(_output(item.alias or (item.expr.name if isinstance(item.expr, A.Column)
                                            else unparse(item.expr)), item.expr))
    if not items:
        items = [_output(c, A.Column(c)) for c in ("model",) * several + DEFAULT_COLUMNS]
    aliases = {o.name: o.expr for o in items}
    group_by = []
    for g in query.group_by:
        if isinstance(g, A.Column) and g.name not in known and g.name in aliases:
            g = aliases[g.name]
        elif isinstance(g, A.Literal) and isinstance(g.value, int) and not isinstance(g.value, bool):
            if not 1 <= g.value <= len(items):  # GROUP BY 1: the first output column
                there = "is 1 output column" if len(items) == 1 else f"are {len(items)} output columns"
                raise PlanError(f"GROUP BY {g.value}: there {there}", g.span, source)
            g = items[g.value - 1].expr
        check_calls(g, source, allow_aggregates=False, allow_rows=True)
        _check_columns(g, source, known)
        group_by.append(g)
    aggregate = bool(group_by) or any(is_aggregate(o.expr) for o in items)
    if aggregate:
        for o, item in zip(items, query.select or ()):
            if not is_aggregate(o.expr) and o.expr not in group_by and _refers_to_row(o.expr):
                raise PlanError(f"{o.name} must be in GROUP BY or inside an aggregate such as count()",
                                item.span, source)
    return _unique_names(items), aggregate, tuple(group_by)


def _unique_names(items: List[Output]) -> Tuple[Output, ...]:
    """The output columns with a name given twice told apart: the first keeps it (``SELECT *,
    prob`` still has its ``prob``), the next are ``prob_2``, ``prob_3`` (past any name taken)."""
    used = {o.name for o in items}
    seen: Dict[str, int] = {}
    out = []
    for o in items:
        k = seen[o.name] = seen.get(o.name, 0) + 1
        if k > 1:
            while f"{o.name}_{k}" in used:
                k += 1
            used.add(f"{o.name}_{k}")
            o = replace(o, name=f"{o.name}_{k}")
        out.append(o)
    return tuple(out)


def _test(test: Optional[A.Test], outputs, aggregate: bool, source: str, draws: int) -> Optional[TestPlan]:
    """The TEST clause against the output columns."""
    if test is None:
        return None
    if test.kind not in TESTS:
        near = closest(test.kind, TESTS)
        raise PlanError(f"unknown test {test.kind!r}; relmql tests: {', '.join(t.upper() for t in TESTS)}",
                        test.kind_span, source, hint=f"did you mean TEST {near.upper()}?" if near else None)

    def column(node) -> Output:
        for o in outputs:
            if o.expr == node or (isinstance(node, A.Column) and node.name == o.name):
                return o
        raise PlanError(f"TEST compares output columns; {unparse(node)} is not one", node.span, source,
                        hint=f"output columns: {', '.join(o.name for o in outputs)}")

    if len(test.columns) != 2:
        cols = test.columns
        raise PlanError(f"TEST {test.kind.upper()} compares two columns (OF a, b), not {len(cols)}",
                        (cols[0].span[0], cols[-1].span[1]), source)
    a, b = column(test.columns[0]), column(test.columns[1])
    if a.name == b.name:
        raise PlanError("a test of independence needs two different columns", test.columns[1].span, source)

    tested = next((o for o in (a, b) if is_aggregate(o.expr)), None)
    if tested is not None:  # OF g, n with n a count(*) or probability() column: each value is no category
        raise PlanError(f"TEST compares two category columns; {tested.name} is an aggregate: it weighs the "
                        f"cells, it is not a category", test.columns[(a, b).index(tested)].span, source,
                        hint="name a second GROUP BY column: SELECT g, h, count(*) AS n ... GROUP BY g, h "
                             "TEST INDEPENDENCE OF g, h")
    name = cell_weight(a.name, b.name, [o.name for o in outputs if weighs_cells(o.expr)],
                       {o.name for o in outputs if is_probability(o.expr)})
    weight = next(o for o in outputs if o.name == name) if name is not None else None
    if weight is None and aggregate:
        raise PlanError("TEST over grouped rows needs a count(*), sum(...) or probability() column to weigh "
                        "the cells", test.span, source)
    return TestPlan(a=a.name, b=b.name, weight=weight.name if weight else None,
                    n_per_row=draws if weight is not None and is_probability(weight.expr) else None)


def cell_weight(a: str, b: str, aggregates: Sequence[str], probabilities: Collection[str]) -> Optional[str]:
    """The column that weighs a test's cells over grouped rows, as TEST and ``Result.chi2`` take
    it: the first probability column among ``aggregates`` (the columns that can weigh cells,
    ``expr.weighs_cells``) other than ``a`` and ``b``, else the first of them (None where there
    is none)."""
    others = [w for w in aggregates if w not in (a, b)]
    return next((w for w in others if w in probabilities), others[0] if others else None)


def _refers_to_row(node: A.Node) -> bool:
    return any(isinstance(n, A.Column) or (isinstance(n, A.Call) and n.name == "group") for n in node.walk())


def _conjuncts(node: A.Node) -> List[A.Node]:
    if isinstance(node, A.Binary) and node.op == "AND":
        return _conjuncts(node.left) + _conjuncts(node.right)
    return [node]


@dataclass(frozen=True)
class _Exclusion:
    """A compiled WHERE filter: its regex, the text it was written as, and (for a string literal)
    where each of the regex's characters is in the query."""

    regex: str
    span: Tuple[int, int]
    offsets: Optional[Sequence[int]]


def _where(query: A.Query, source: str, params, groups, opts) -> Tuple[Optional[A.Node], List[_Exclusion]]:
    """WHERE split into regexes the automaton can exclude and the rest, evaluated on rows."""
    if query.where is None:
        return None, []
    check_calls(query.where, source, allow_aggregates=False, allow_rows=True)
    _check_columns(query.where, source, tuple(COLUMNS) + COMPUTED_COLUMNS + tuple(groups))
    for n in query.where.walk():
        if isinstance(n, A.Column) and n.name == "rank":  # each row would be the next one: rank 1 at the time
            raise PlanError("WHERE cannot use rank: rank numbers the rows that WHERE keeps", n.span, source,
                            hint="LIMIT n keeps the first n rows; to leave out the best ones, filter on prob or "
                                 "text instead")
    exclude, rest = [], []
    for c in _conjuncts(query.where):
        regex = _exclusion(c, params, source)
        if regex is None:
            rest.append(c)
            continue
        exclude.append(regex)
        if opts["edits"]:
            rest.append(c)  # an edited string can match what the unedited language excluded
    if not rest:
        return None, exclude
    node = rest[0]
    for c in rest[1:]:
        node = A.Binary("AND", node, c, (node.span[0], c.span[1]))
    return node, exclude


def _exclusion(node: A.Node, params, source) -> Optional[_Exclusion]:
    """``text NOT MATCHING 'r'``, ``NOT (text MATCHES 'r')``, ``text NOT IN ('a', ...)`` and
    ``text <> 'a'`` with constant right sides: regexes."""
    if isinstance(node, A.Unary) and node.op == "NOT" and isinstance(node.operand, A.Matches):
        node = A.Matches(node.operand.operand, node.operand.pattern, not node.operand.negated, node.span)
    if isinstance(node, A.Binary) and node.op == "<>" and node.left == A.Column("text") and \
            not _refers_to_row(node.right):
        value = constant(node.right, params, source, "<>")
        return _Exclusion(escape(value), node.right.span, None) if isinstance(value, str) else None
    if isinstance(node, A.Matches) and node.negated and node.operand == A.Column("text"):
        if _refers_to_row(node.pattern):
            return None
        offsets = string_literal_at(source, node.pattern.span) if isinstance(node.pattern, A.Literal) else None
        return _Exclusion(_text(node.pattern, params, source, "NOT MATCHING"), node.pattern.span,
                          offsets)
    if isinstance(node, A.InList) and node.negated and node.operand == A.Column("text"):
        if any(_refers_to_row(i) for i in node.items):
            return None
        values = []
        for i in node.items:
            v = constant(i, params, source, "NOT IN")
            values.extend(v if isinstance(v, (list, tuple)) else [v])
        if not all(isinstance(v, str) for v in values) or not values:
            return None
        return _Exclusion("|".join(escape(v) for v in values), node.span, None)
    return None


# -- datasets

def _plan_dataset(query: A.Query, source: str, settings, params) -> DatasetPlan:
    d = query.dataset
    if d.where is not None:  # what the text alone says is wrong comes before what the file system says
        check_calls(d.where, source, allow_aggregates=False, allow_rows=False)
        _check_columns(d.where, source, ())
    path = _text(d.source, params, source, "FOR EACH ROW IN", "a data file's path")
    if not Path(path).expanduser().is_file():
        raise PlanError(f"no data file {path!r}", d.source.span, source,
                        hint=f"relative paths start at the current directory, {Path.cwd()}")
    if not path.lower().endswith((".jsonl", ".csv", ".json", ".ndjson", ".tsv")):
        raise PlanError(f"{path!r}: data files are .jsonl, .json, .csv or .tsv", d.source.span, source)
    row_limit = _count(d.limit, params, source, "LIMIT") if d.limit is not None else None
    # outputs are checked against a representative row plan when the first row is planned
    groups = ()
    if query.matching is not None:
        try:
            first = next(iter_rows(path, source, d.source.span), None)
        except Error:
            first = None
        if first is not None:
            try:
                groups = _group_names(_text(query.matching, {**params, **first}, source, "MATCHING"))
            except Error:
                groups = ()
    outputs, aggregate, group_by = _select(query, source, groups, several_models(query.model, params))
    once = {"test_draws": settings["test_draws"], "confidence": settings["confidence"]}
    for o in query.using:  # TEST and EXPECT apply to all data rows: their options are read once, not per row
        if o.name in once and o.value is not None:
            once[o.name] = option(o.name).check(constant(o.value, params, source, f"USING {o.name}"), o.value.span,
                                                source)
    draws, confidence = once["test_draws"], once["confidence"]
    return DatasetPlan(source=source, query=query, path=path, settings=tuple(settings.items()),
                       params=tuple(params.items()), outputs=outputs, aggregate=aggregate, group_by=group_by,
                       row_where=d.where, row_limit=row_limit,
                       test=_test(query.test, outputs, aggregate, source, draws),
                       expect=plan_expect(query.expect, [o.name for o in outputs], query.test is not None, source,
                                            confidence))


def iter_rows(path: str, source: str = "", span=None) -> Iterator[Dict[str, Any]]:
    """The rows of a JSONL, JSON (a list of objects), CSV or TSV file as dicts, each with its 1-based
    ``row_number``. The file is UTF-8 text (a byte-order mark at its start is dropped)."""
    try:
        f = Path(path).expanduser().open(encoding="utf-8-sig", newline="")
    except OSError as e:
        raise PlanError(f"cannot open {path!r}: {e.strerror}", span, source or None) from None
    with f:
        try:
            yield from _file_rows(f, path, source, span)
        except UnicodeDecodeError as e:
            raise PlanError(f"cannot read {path!r}: not UTF-8 text ({e.reason})", span, source or None,
                            hint="save it as UTF-8 (iconv -f latin1 -t utf-8 does for Latin-1)") from None


def _file_rows(f, path: str, source: str, span) -> Iterator[Dict[str, Any]]:
    """``iter_rows`` of the open file ``f``."""
    lower = path.lower()
    if lower.endswith((".csv", ".tsv")):
        tsv = lower.endswith(".tsv")  # TSV has no quoting: a cell is its text, quotes and all
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else csv.DictReader(f)
        header = reader.fieldnames or []
        twice = next((h for i, h in enumerate(header) if h in header[:i]), None)
        if twice is not None:  # a dict keeps only the last
            raise PlanError(f"{path}: the header names {twice!r} twice", span, source or None,
                            hint="rename one of the columns in the file")
        for i, row in enumerate(reader, 1):
            cells = len(header) + len(row.get(None, ())) - sum(v is None for v in row.values())
            if cells != len(header):  # DictReader drops the cells past the header and fills missing ones with None
                raise PlanError(f"{path}, line {reader.line_num}: {cells} cell{'s' if cells != 1 else ''} where the "
                                f"header names {len(header)}", span, source or None,
                                hint=("a TSV cell cannot hold a tab: write the file as .csv, quoting that cell"
                                      if tsv else "quote a cell that holds the separator") if cells > len(header)
                                else "an empty cell is written as nothing between two separators")
            yield _fields(row, i, f"{path}, row {i}", span, source)
        return
    if lower.endswith(".json"):
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise PlanError(f"{path}: not JSON: {e}", span, source or None) from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise PlanError(f"{path}: a .json data file is a list of objects", span, source or None)
        for i, row in enumerate(data, 1):
            yield _fields(row, i, f"{path}, row {i}", span, source)
        return
    n = 0
    for line_no, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PlanError(f"{path}, line {line_no}: not JSON: {e.msg}", span, source or None) from None
        if not isinstance(row, dict):
            raise PlanError(f"{path}, line {line_no}: each line must be a JSON object", span, source or None)
        n += 1
        yield _fields(row, n, f"{path}, line {line_no}", span, source)


def _field(name: str) -> str:
    return re.sub(r"\W", "_", str(name).strip())


def _fields(row: Mapping[Any, Any], number: int, where: str, span, source: str) -> Dict[str, Any]:
    """A data row's fields as parameters (names made :name-able) and its ``row_number``; two
    fields that would be one parameter are an error, not a silent choice."""
    out: Dict[str, Any] = {}
    named: Dict[str, Any] = {}
    for k, v in row.items():
        name = _field(k)
        if name in named or name == "row_number":
            first = "row_number (the row's number)" if name == "row_number" else repr(named[name])
            raise PlanError(f"{where}: the fields {first} and {k!r} would both be :{name}", span, source or None,
                            hint="rename one of them in the file")
        named[name], out[name] = k, v
    out["row_number"] = number
    return out


def plan_row(dplan: DatasetPlan, row: Mapping[str, Any]) -> QueryPlan:
    """The query of one data row (a pure function of the dataset plan and the row)."""
    params = {**dict(dplan.params), **row}
    query = A.Query(**{f: getattr(dplan.query, f) for f in dplan.query.__dataclass_fields__ if f != "dataset"})
    qplan = _plan_query(query, dplan.source, dict(dplan.settings), params)
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
        raise _sourced(e, dplan.source) from None


__all__ = ["TestPlan", "TESTS", "plan", "plan_row", "row_selected", "selected_rows", "count_selected", "constant",
           "iter_rows", "QueryPlan", "DatasetPlan", "Plan", "ModelRef", "Output",
           "OPTIONS", "AGGREGATES"]
