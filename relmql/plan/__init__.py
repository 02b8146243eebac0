"""The planner: a parsed query → a typed ``QueryPlan`` (every option checked).

Entry point: ``plan(query, source, settings, params)``. It makes the records of ``relmql.records`` and
imports no later stage: planning loads neither the compiler nor the executor. EXPLAIN, which needs
both, is ``relmql.explain``.
"""

from .expr import AGGREGATES, FUNCTIONS, Env, escape, evaluate
from .options import OPTIONS, OptionSpec, PlanError, defaults, option
from .planner import (DatasetPlan, ModelRef, Output, Plan, QueryPlan, TestPlan, cell_weight, check_params, constant,
                      iter_rows, plan,
                      plan_row, row_selected, selected_rows, count_selected)

__all__ = ["plan", "plan_row", "check_params", "cell_weight", "row_selected", "selected_rows", "count_selected",
           "constant", "iter_rows", "QueryPlan", "DatasetPlan", "Plan", "ModelRef", "Output", "TestPlan",
           "OPTIONS", "OptionSpec", "PlanError", "defaults", "option", "FUNCTIONS", "AGGREGATES", "Env", "escape",
           "evaluate"]
