"""Traversals of a token automaton on a model: exact shortest path and sampling.

Entry point: ``execute(automaton, model, traversal, rules)`` → an iterator of ``Row``s.
"""

from __future__ import annotations

import threading
from typing import Iterator, Optional, Union

from ..automata.tokens import TokenAutomaton
from ..models.base import LanguageModel
from .measure import Mass, measure
from .options import Cancelled, Decoding, ExecutionError, Measure, Sample, ShortestPath, Stop
from .rows import COLUMNS, COMPUTED_COLUMNS, Row
from .sampling import SampleStats, sample
from .shortest import SearchStats, shortest_path

Traversal = Union[ShortestPath, Sample, Measure]


def execute(automaton: TokenAutomaton, model: LanguageModel, traversal: Traversal,
            rules: Decoding = Decoding(), cancel: Optional[threading.Event] = None,
            stats: Optional[SearchStats] = None) -> Iterator[Row]:
    """Rows of ``automaton`` on ``model``: the most probable first (``ShortestPath``) or random
    samples (``Sample``), under the decoding ``rules``. Setting ``cancel`` stops the iterator
    with ``Cancelled`` before its next model call; ``stats`` collects a search's statistics."""
    if isinstance(traversal, ShortestPath):
        return shortest_path(automaton, model, rules, traversal, cancel, stats)
    if isinstance(traversal, Sample):
        return sample(automaton, model, rules, traversal, cancel)
    if isinstance(traversal, Measure):
        return (r for r in measure(automaton, model, rules, traversal, cancel, stats)[1] if not r.miss)
    raise ExecutionError(f"unknown traversal {traversal!r}")


__all__ = ["execute", "shortest_path", "sample", "measure", "ShortestPath", "Sample", "Measure", "Mass", "Decoding", "Row", "COLUMNS", "COMPUTED_COLUMNS",
           "Cancelled", "ExecutionError", "SampleStats", "SearchStats", "Stop"]
