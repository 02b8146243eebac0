"""The planner: a parsed query → a typed ``QueryPlan`` (every option checked).

Entry point: ``plan(query, source, settings, params)``. It makes the records of ``relmql.records``
and imports no later stage; EXPLAIN, which needs the compiler and the executor, is ``relmql.explain``.
The design: docs/architecture.md, "Planning".
"""

from ..records import ModelRef
from .columns import cell_weight
from .datasets import count_selected, plan_row, row_selected, selected_rows
from .expr import AGGREGATES, FUNCTIONS, Env, escape, evaluate
from .options import OPTIONS, OptionSpec, PlanError, defaults, option
from .planner import plan
from .plans import DatasetPlan, Output, Plan, QueryPlan, TestPlan
from .readers import iter_rows
from .values import check_params, constant

__all__ = ["plan", "plan_row", "check_params", "cell_weight", "row_selected", "selected_rows", "count_selected",
           "constant", "iter_rows", "QueryPlan", "DatasetPlan", "Plan", "ModelRef", "Output", "TestPlan",
           "OPTIONS", "OptionSpec", "PlanError", "defaults", "option", "FUNCTIONS", "AGGREGATES", "Env", "escape",
           "evaluate"]
