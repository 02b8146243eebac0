"""Query planning: one query (no ``FOR EACH ROW IN``) → its ``QueryPlan``, in named steps
(docs/architecture.md, "Planning")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import closest
from ..records import (COLUMNS, COMPUTED_COLUMNS, SAMPLE_BATCH_SIZE, CompileOptions, Decoding, Measure,
                       Sample, ShortestPath)
from ..syntax import ast as A
from ..syntax import string_literal_at
from .columns import check_columns, group_names, output, plan_test, refers_to_row, select
from .expect import plan_expect
from .expr import check_calls, escape
from .models import plan_models, under_models
from .options import OPTIONS, PlanError, option
from .plans import QueryPlan
from .prompt import plan_prompt
from .values import ConstEnv, constant, count_of, text_of

ORDER_COLUMNS = {"prob": "prob", "total_prob": "total_prob", "logprob": "prob", "total_logprob": "total_prob"}


def plan_query(query: A.Query, source: str, settings, params) -> QueryPlan:
    """The plan of ``query`` (its text is ``source``, with no ``FOR EACH ROW IN``): its regexes,
    options and models, its columns and filters, then how to walk the automaton."""
    if query.matching is None:
        raise PlanError("a query needs MATCHING 'regex': the set of strings to look for",
                        (query.span[0], query.span[1]) if query.span != (0, 0) else None, source)
    matching = text_of(query.matching, params, source, "MATCHING")
    prefix = text_of(query.prefix, params, source, "PREFIX") if query.prefix is not None else None
    opts = query_options(query, source, settings, params)
    models = plan_models(query.model, opts, params, source)
    model = models[0]
    prompt = plan_prompt(query.prompt, ConstEnv(params, source, "PROMPT"), source, opts["chat_template"],
                         dict((o.name, o.span) for o in query.using).get("chat_template"))
    decoding = Decoding(**{name: opts[name] for name, spec in OPTIONS.items() if spec.where == "decoding"})
    if query.sample is not None and query.order:
        raise PlanError("a query either samples (SAMPLE n) or ranks (ORDER BY), not both", query.order[0].span, source)
    limit = count_of(query.limit, params, source, "LIMIT") if query.limit is not None else None

    groups = group_names(matching)
    outputs, aggregate, group_by = select(query, source, groups, len(models) > 1)
    where, exclude = _where(query, source, params, groups, opts)
    push = limit if where is None else None  # the traversal may stop at LIMIT only when no row is filtered out
    if any(isinstance(n, A.Call) and n.name == "probability" for o in outputs for n in o.expr.walk()):
        # the bound is of the whole language: of no use to groups, filtered rows, a model of several
        whole = not (group_by or where is not None or len(models) > 1)
        traversal = _measure(query, source, params, opts, limit, whole)
    elif query.sample is not None:
        traversal = _sample(query, source, params, opts, push)
    else:
        traversal = _shortest_path(query, source, opts, prefix, push)
        if not query.select and traversal.order == "total_prob":
            outputs = tuple(output(c, A.Column(c)) for c in ("model",) * bool(len(models) > 1) +
                            ("rank", "text", "total_prob"))
    compile_options = CompileOptions(tokenization=opts["tokenization"], prefix_tokenization=opts["prefix_tokenization"],
                                     edits=opts["edits"], edit_scope=opts["edit_scope"],
                                     exclude=tuple(x.regex for x in exclude),
                                     max_states=opts["max_states"])
    return QueryPlan(source=source, model=model, matching=matching, prefix=prefix, compile=compile_options,
                     decoding=decoding, traversal=traversal, outputs=outputs, where=where, group_by=group_by,
                     aggregate=aggregate, limit=limit, params=tuple(sorted(params.items(), key=lambda kv: kv[0])),
                     group_names=groups, **_spans(query, source, exclude),
                     test=plan_test(query.test, outputs, aggregate, source, opts["test_draws"]),
                     prompt=prompt, models=models if len(models) > 1 else (),
                     under=under_models(outputs, where, group_by, opts, params, source),
                     expect=plan_expect(query.expect, [o.name for o in outputs], query.test is not None, source,
                                        opts["confidence"]))


def _spans(query: A.Query, source: str, exclude: Sequence["_Exclusion"]) -> Dict[str, Any]:
    """Where the query writes its regexes, model, options and prompt: a ``QueryPlan``'s spans and offsets."""
    m_off = string_literal_at(source, query.matching.span) if isinstance(query.matching, A.Literal) else None
    p_off = string_literal_at(source, query.prefix.span) if isinstance(query.prefix, A.Literal) else None
    return dict(matching_span=query.matching.span,
                prefix_span=query.prefix.span if query.prefix is not None else None,
                model_span=query.model.span if query.model is not None else None,
                matching_offsets=m_off,
                prefix_offsets=p_off,
                exclude_spans=tuple(x.span for x in exclude),
                exclude_offsets=tuple(x.offsets for x in exclude),
                option_spans=tuple((option(o.name).name, o.span) for o in query.using),
                prompt_span=query.prompt.span if query.prompt is not None else None)


def _measure(query: A.Query, source: str, params, opts, limit: Optional[int], whole: bool) -> Measure:
    """probability()'s traversal: an exact sum, else an estimate (``whole``: the value is the whole
    language's, so the exact search's bound applies)."""
    if query.order:
        raise PlanError("probability() measures the whole language; it cannot be combined with ORDER BY",
                        query.order[0].span, source, hint="leave out ORDER BY, or use sum(prob) over ranked rows")
    if limit is not None:
        raise PlanError("probability() measures the whole language; LIMIT would cut it short",
                        query.limit.span, source)
    sampled = query.sample is not None
    traversal = Measure(exact_limit=0 if sampled else opts["exact_limit"],
                        samples=count_of(query.sample, params, source, "SAMPLE") if sampled
                        else opts["estimate_samples"],
                        seed=opts["seed"], mode=opts["sampling"], max_tokens=opts["max_tokens"],
                        batch_size=opts["batch_size"], max_prefix_tokens=opts["max_prefix_tokens"],
                        confidence=opts["confidence"], max_memory=opts["max_memory"],
                        max_draws=opts["max_draws"],
                        bound_nodes=opts["bound_nodes"] if whole else 0)
    if traversal.samples < 1:
        raise PlanError("an estimate needs at least one sample", query.sample.span, source)
    return traversal


def _sample(query: A.Query, source: str, params, opts, push: Optional[int]) -> Sample:
    """SAMPLE n's traversal (no more draws than a LIMIT that no filter thins out)."""
    n = count_of(query.sample, params, source, "SAMPLE")
    if push is not None:
        n = min(n, push)
    return Sample(n=n, seed=opts["seed"], mode=opts["sampling"], max_tokens=opts["max_tokens"],
                  batch_size=opts["batch_size"] or SAMPLE_BATCH_SIZE,
                  max_prefix_tokens=opts["max_prefix_tokens"], max_memory=opts["max_memory"],
                  max_draws=opts["max_draws"])


def _shortest_path(query: A.Query, source: str, opts, prefix: Optional[str], push: Optional[int]) -> ShortestPath:
    """A ranking query's traversal: the search, in the order ORDER BY names (or the default's)."""
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
    return ShortestPath(order=order, order_default=why, limit=push, max_tokens=opts["max_tokens"],
                        **ShortestPath.batches(opts["batch_size"]),
                        max_prefix_tokens=opts["max_prefix_tokens"], max_prefix_nodes=opts["max_prefix_nodes"],
                        max_nodes=opts["max_nodes"], max_nodes_per_row=opts["max_nodes_per_row"],
                        max_memory=opts["max_memory"], pipeline=opts["pipeline"])


def query_options(query: A.Query, source: str, settings, params) -> Dict[str, Any]:
    """The session's ``settings`` with the query's ``USING`` options, each checked."""
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


def _conjuncts(node: A.Node) -> List[A.Node]:
    """The conditions that ``AND`` joins in ``node``."""
    if isinstance(node, A.Binary) and node.op == "AND":
        return _conjuncts(node.left) + _conjuncts(node.right)
    return [node]


@dataclass(frozen=True)
class _Exclusion:
    """A compiled WHERE filter: its regex, the text it was written as, and (for a string literal)
    where each of the regex's characters is in the query."""

    regex: str  # the regex the automaton leaves out
    span: Tuple[int, int]  # where the filter's value is written
    offsets: Optional[Sequence[int]]  # each regex character's place in the query (None: not a string literal)


def _where(query: A.Query, source: str, params, groups, opts) -> Tuple[Optional[A.Node], List[_Exclusion]]:
    """WHERE split into regexes the automaton can exclude and the rest, evaluated on rows."""
    if query.where is None:
        return None, []
    check_calls(query.where, source, allow_aggregates=False, allow_rows=True)
    check_columns(query.where, source, tuple(COLUMNS) + COMPUTED_COLUMNS + tuple(groups))
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
            not refers_to_row(node.right):
        value = constant(node.right, params, source, "<>")
        return _Exclusion(escape(value), node.right.span, None) if isinstance(value, str) else None
    if isinstance(node, A.Matches) and node.negated and node.operand == A.Column("text"):
        if refers_to_row(node.pattern):
            return None
        offsets = string_literal_at(source, node.pattern.span) if isinstance(node.pattern, A.Literal) else None
        return _Exclusion(text_of(node.pattern, params, source, "NOT MATCHING"), node.pattern.span,
                          offsets)
    if isinstance(node, A.InList) and node.negated and node.operand == A.Column("text"):
        if any(refers_to_row(i) for i in node.items):
            return None
        values = []
        for i in node.items:
            v = constant(i, params, source, "NOT IN")
            values.extend(v if isinstance(v, (list, tuple)) else [v])
        if not all(isinstance(v, str) for v in values) or not values:
            return None
        return _Exclusion("|".join(escape(v) for v in values), node.span, None)
    return None

