"""Runs a plan: compile → execute → filter → project or aggregate (docs/architecture.md).

Entry points: ``run(plan, models, listener)`` → the output tuples of a statement;
``query_rows(plan, models, listener)`` → the rows of one query on one model, then its ``QueryReport``.
"""

from __future__ import annotations

from .datasets import in_data_row
from .query import Models, compile_plan, load, query_rows, row_context
from .report import (QUIET, REREAD_NOTE, Listener, QueryReport, closing_notes, draws_note, ended, floor_warning,
                     no_row_note, no_row_rows_note, nodes_note, say, speaking, stop_warning, stopped_rows_warning)
from .rows import RowEnv, edit_position, match_regex, prefix_end, unedited_match, value_of
from .run import RowSource, model_rows, run

__all__ = ["run", "query_rows", "model_rows", "RowSource", "Listener", "QUIET", "QueryReport", "ended",
           "closing_notes", "in_data_row", "compile_plan", "load", "row_context", "Models", "RowEnv", "match_regex",
           "value_of", "edit_position", "prefix_end", "unedited_match", "stop_warning", "stopped_rows_warning",
           "floor_warning", "no_row_note", "no_row_rows_note", "nodes_note", "draws_note", "REREAD_NOTE", "say",
           "speaking"]
