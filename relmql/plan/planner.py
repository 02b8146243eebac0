"""The planner's entry: a parsed query → its plan (docs/architecture.md, "Planning")."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from ..syntax import ast as A
from .datasets import plan_dataset
from .plans import Plan
from .query import plan_query


def plan(query: A.Query, source: str, settings: Mapping[str, Any], params: Optional[Mapping[str, Any]] = None) -> Plan:
    """The plan of ``query`` (its text is ``source``) under the session ``settings`` and ``params``."""
    params = dict(params or {})
    if query.dataset is not None:
        return plan_dataset(query, source, settings, params)
    return plan_query(query, source, settings, params)
