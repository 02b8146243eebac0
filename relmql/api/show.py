"""SHOW: the models, the options (or one), the functions, the parameters, each a table of rows."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping

from ..errors import closest
from ..models import BUILTIN_MODELS
from ..plan import OPTIONS, PlanError
from ..plan.options import shown
from ..syntax import ast as A
from .result import Result

SHOW_WHAT = ("models", "options", "functions", "parameters")


def show(st: A.Show, text: str, settings: Dict[str, Any], loaded, defaults: Mapping[str, Any] = None,
         params: Mapping[str, Any] = None) -> Result:
    """The result of ``SHOW what`` under the connection's ``settings`` (``loaded``: the names of
    the models it has loaded; ``defaults``: its ``SET :name`` values; ``params``: the caller's)."""
    what = st.what
    if what == "parameters":  # the caller's values win over the defaults, as in a query
        rows = [(name, shown(value), "caller") for name, value in (params or {}).items()]
        rows += [(name, shown(value), "SET") for name, value in (defaults or {}).items() if name not in (params or {})]
        return Result(("parameter", "value", "from"), lambda r: iter(sorted(rows, key=lambda row: str(row[0]))))
    if what in _SHOWN:
        return _SHOWN[what](settings, loaded)
    if what in OPTIONS:  # SHOW topk: one option's value, as psql's SHOW name
        spec = OPTIONS[what]
        return Result(("option", "value", "default", "meaning"),
                      lambda r: iter([(what, settings[what], spec.default, spec.doc)]))
    near = closest(what, SHOW_WHAT + tuple(OPTIONS))
    word = text.lower().rfind(what, st.span[0], st.span[1])
    span = (word, word + len(what)) if word >= 0 else st.span
    raise PlanError(f"SHOW {what.upper()} is not known; SHOW " + " | ".join(w.upper() for w in SHOW_WHAT) +
                    " | an option's name", span, text,
                    hint=f"did you mean SHOW {near.upper() if near in SHOW_WHAT else near}?" if near else None)


def _models(settings: Dict[str, Any], loaded) -> Result:
    current = settings["model"]
    rows = [(name, name == current, name in loaded) for name in BUILTIN_MODELS]
    if current not in BUILTIN_MODELS:
        rows.append((current, True, current in loaded))
    return Result(("model", "default", "loaded"), lambda r: iter(rows), kinds=("text", "bool", "bool"))


def _options(settings: Dict[str, Any], loaded) -> Result:
    rows = [(name, settings[name], spec.default, spec.doc) for name, spec in OPTIONS.items()]
    return Result(("option", "value", "default", "meaning"), lambda r: iter(rows))


def _functions(settings: Dict[str, Any], loaded) -> Result:
    from ..plan.expr import AGGREGATES, FUNCTIONS, ROW_FUNCTIONS
    rows = [(f.name, "scalar", f.doc) for f in FUNCTIONS.values()]
    rows += [(n, "row", d) for n, d in ROW_FUNCTIONS.items()]
    rows += [(n, "aggregate", d) for n, d in AGGREGATES.items()]
    return Result(("function", "kind", "meaning"), lambda r: iter(rows))


_SHOWN: Dict[str, Callable[[Dict[str, Any], Any], Result]] = {
    "models": _models, "options": _options, "functions": _functions}
