"""FROM's models and the models that ``logprob_under()`` names → ``ModelRef``s."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ..errors import Error
from ..models import check_model_name
from ..records import ModelRef
from ..syntax import ast as A
from .options import PlanError, shown

UNDER = ("logprob_under", "prob_under")  # row functions that score a row's reply with another model


def plan_models(node: Optional[A.Node], opts: Mapping[str, Any], params: Mapping[str, Any],
                source: str) -> Tuple[ModelRef, ...]:
    """The models a query runs on: FROM's (one, several, or a parameter holding a list), else
    the session's model; each checked by name, none twice."""
    if node is None:
        return (ModelRef(opts["model"], opts["device"], opts["dtype"]),)
    refs = node.items if isinstance(node, A.Models) else (node,)
    named: List[Tuple[str, A.Node]] = []
    for ref in refs:
        value = params.get(ref.name) if isinstance(ref, A.Param) else ref.value
        if isinstance(ref, A.Param) and ref.name not in params:
            raise PlanError(f"parameter :{ref.name} has no value", ref.span, source,
                            hint=f"bind it with params={{...}} in Python, --param name=value, or "
                                 f"SET :{ref.name} = value (a script's default)")
        values = value if isinstance(value, (list, tuple)) else [value]
        if not values:
            raise PlanError(f"FROM :{ref.name} holds no model names", ref.span, source)
        for v in values:
            if not isinstance(v, str) or not v:
                raise PlanError(f"FROM needs a model name, not {shown(v)}", ref.span, source)
            named.append((v, ref))
    seen: Dict[str, A.Node] = {}
    for name, ref in named:
        if name in seen:
            raise PlanError(f"FROM names the model {name!r} twice", ref.span, source,
                            hint="each model is queried once; a model compared with itself needs no FROM list")
        seen[name] = ref
        _checked(name, ref, source)
    return tuple(ModelRef(name, opts["device"], opts["dtype"]) for name, _ in named)


def several_models(node: Optional[A.Node], params: Mapping[str, Any]) -> bool:
    """Whether FROM names several models (a list, or a parameter that holds one): the rows then
    carry the column ``model``."""
    if isinstance(node, A.Models):
        return True
    value = params.get(node.name) if isinstance(node, A.Param) else None
    return isinstance(value, (list, tuple)) and len(value) > 1


def under_models(outputs: Iterable[Any], where: Optional[A.Node], group_by: Iterable[A.Node],
                 opts: Mapping[str, Any], params: Mapping[str, Any], source: str) -> Tuple[ModelRef, ...]:
    """The models named by ``logprob_under()`` and ``prob_under()`` calls in the columns, WHERE and
    GROUP BY (each a string or a parameter), checked by name, in the order they are written."""
    exprs = [o.expr for o in outputs] + ([where] if where is not None else []) + list(group_by)
    out: Dict[str, ModelRef] = {}
    for expr in exprs:
        for n in expr.walk():
            if not (isinstance(n, A.Call) and n.name in UNDER):
                continue
            name = under_name(n, params, source)
            out.setdefault(name, ModelRef(name, opts["device"], opts["dtype"]))
    return tuple(out.values())


def under_name(call: A.Call, params: Mapping[str, Any], source: str) -> str:
    """The model that a ``logprob_under()`` call names (a string or a :parameter), checked."""
    if len(call.args) != 1:
        raise PlanError(f"{call.name}() takes one argument: a model's name", call.span, source)
    arg = call.args[0]
    if isinstance(arg, A.Literal):
        value = arg.value
    elif isinstance(arg, A.Param) and arg.name in params:
        value = params[arg.name]
    else:
        raise PlanError(f"{call.name}() takes a model's name, written as a string or a :parameter", arg.span,
                        source)
    if not isinstance(value, str) or not value:
        raise PlanError(f"{call.name}() takes a model's name, not {shown(value)}", arg.span, source)
    return _checked(value, arg, source)


def _checked(name: str, node: A.Node, source: str) -> str:
    try:
        check_model_name(name)
    except Error as e:
        e.span, e.source = node.span, source
        raise e from None
    return name


__all__ = ["plan_models", "several_models", "under_models", "under_name", "UNDER"]
