"""Traversals of a token automaton on a model: exact shortest path and sampling.

Entry point: ``execute(automaton, model, traversal, rules)`` → an iterator of ``Row``s. The records it
takes and the errors it raises live in ``relmql.records`` (below the planner, which makes them) and are
named here too.
"""

from __future__ import annotations

import threading
from typing import Iterator, Optional, Union

from ..automata.tokens import TokenAutomaton
from ..models.base import LanguageModel
from ..records import Cancelled, Decoding, ExecutionError, Measure, Sample, ShortestPath, Stop, Traversal
from .measure import Mass, measure
from .rows import Row
from .sampling import SampleStats, sample
from .ledger import SearchStats
from .shortest import shortest_path


def execute(automaton: TokenAutomaton, model: LanguageModel, traversal: Traversal,
            rules: Decoding = Decoding(), cancel: Optional[threading.Event] = None,
            stats: Optional[Union[SearchStats, SampleStats]] = None) -> Iterator[Row]:
    """Rows of ``automaton`` on ``model``: the most probable first (``ShortestPath``) or random
    samples (``Sample``), under the decoding ``rules``. Setting ``cancel`` stops the iterator
    with ``Cancelled`` before its next model call; ``stats`` collects a search's statistics
    (``SearchStats``) or a sampler's (``SampleStats``)."""
    if isinstance(traversal, ShortestPath):
        return shortest_path(automaton, model, rules, traversal, cancel,
                             stats if isinstance(stats, SearchStats) else None)
    if isinstance(traversal, Sample):
        return sample(automaton, model, rules, traversal, cancel, stats if isinstance(stats, SampleStats) else None)
    if isinstance(traversal, Measure):
        searched = stats if isinstance(stats, SearchStats) else None
        return (r for r in measure(automaton, model, rules, traversal, cancel, searched)[1] if not r.miss)
    raise ExecutionError(f"unknown traversal {traversal!r}")


__all__ = ["execute", "shortest_path", "sample", "measure", "ShortestPath", "Sample", "Measure", "Traversal", "Mass",
           "Decoding", "Row", "Cancelled", "ExecutionError", "SampleStats", "SearchStats", "Stop"]
