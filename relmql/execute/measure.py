"""The probability of a language: summed exactly, or estimated by sampling.

The event measured is "given the prefix, the model's generation begins with a string of the
language" (with ``eos``: "is a string of the language, then the end of text"). Without ``eos``
a generation that begins with ``ab`` also begins with ``a`` when both are in the language, so
only the shortest such token sequences count (first_match): the events are then disjoint and
their probabilities add up. Summed over every prefix token path p, the total is
Σ_p P(language after p | p), and per group of strings the same sum over the group.

Exact: a ``ShortestPath`` with ``first_match`` over every token sequence (shared token
prefixes are read once, from the search tree's cache). Estimate: ``Sample`` draws with
``misses`` and ``first_match``: the prefix path is uniform over the N prefix paths and the
completion is drawn locally with importance weight w (or by rejection, w = 1), so
N · E[w · 1(string in group)] is the group's probability, with a normal (or Wilson) interval.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

from ..automata.tokens import TokenAutomaton
from ..models.base import LanguageModel
from .options import Decoding, Measure
from .rows import Row
from .sampling import sample
from .shortest import SearchStats, shortest_path


@dataclass
class Mass:
    """How the rows of a measured language were found: ``exact`` (every token sequence, each
    row's ``prob`` counts once) or from ``draws`` independent samples, of which the rows are
    the hits, each standing for ``scale`` · ``weight`` (``binary``: every weight is 1)."""

    exact: bool
    draws: int = 0
    scale: float = 1.0
    binary: bool = False
    confidence: float = 0.95
    sequences: Optional[int] = None  # token sequences in the language, where counted


def token_sequences(automaton: TokenAutomaton, opts: Measure) -> Optional[int]:
    """The number of token sequences of the language within the token budgets, or None when
    there are more than ``opts.exact_limit`` (or infinitely many)."""
    strings = automaton.num_strings
    if strings is None or strings > opts.exact_limit:
        return None
    n = automaton.count_paths(automaton.start, opts.max_prefix_tokens + opts.max_tokens)
    return n if n <= opts.exact_limit else None


def measure(automaton: TokenAutomaton, model: LanguageModel, rules: Decoding, opts: Measure,
            cancel: Optional[threading.Event] = None, stats: Optional[SearchStats] = None
            ) -> Tuple[Mass, Iterator[Row]]:
    """How the language will be measured, and its rows: every token sequence with nonzero
    probability (exact), or one row per draw (estimate; draws that found no string of the
    language have ``miss`` set)."""
    opts = opts.check()
    n = token_sequences(automaton, opts)
    if n is not None:
        return (Mass(True, confidence=opts.confidence, sequences=n),
                shortest_path(automaton, model, rules, opts.exact(), cancel, stats))
    prefixes = automaton.count_paths(automaton.start, opts.max_prefix_tokens, prefix_only=True)
    mass = Mass(False, opts.samples, float(prefixes), opts.mode == "exact", opts.confidence)
    return mass, sample(automaton, model, rules, opts.estimate(), cancel)
