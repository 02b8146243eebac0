"""Verdicts: a query's EXPECT judged on its rows (``judge``), certified where values are estimated,
with what it was judged on (``rounds``)."""

from __future__ import annotations

from .judge import STATUSES, Verdict, judge, judge_rows, round_level

__all__ = ["Verdict", "judge", "judge_rows", "round_level", "STATUSES"]
