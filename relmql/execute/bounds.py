"""Certain bounds on probability() from a best-first search cut short: the strings found so far
from below, everything not yet ruled out from above (the method is in docs/language.md#probability)."""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..automata.tokens import TokenAutomaton
from ..models.base import LanguageModel
from ..records import Decoding, Measure
from .rows import Row
from .ledger import SearchStats
from .shortest import ShortestPathSearch


BATCH = 16  # nodes a model call of the bounding search reads (unless batch_size is set)
ROWS_PER_NODE = 4  # strings it releases at most, per node it may read (each costs a row's making)
SLACK = 1e-5  # a bound's relative allowance for float32 rounding


@dataclass(frozen=True)
class Bound:
    """P(the generation begins with a string of the language) lies in [``low``, ``high``] for
    certain (in the model's own arithmetic): ``low`` is the probability of the strings found,
    ``high`` one less what was ruled out, each widened by ``SLACK`` for float32 rounding. ``nodes``:
    the search's model reads; ``exhausted``: the search read the whole language within its bounds
    (``low`` is then the exact sum)."""

    low: float
    high: float
    nodes: int
    exhausted: bool

    def within(self, low: float, high: float) -> Tuple[float, float]:
        """[low, high] narrowed by the bound (the bound alone where they do not meet)."""
        a, b = max(low, self.low), min(high, self.high)
        return (a, b) if a <= b else (self.low, self.high)


def bound_search(automaton: TokenAutomaton, model: LanguageModel, rules: Decoding, opts: Measure,
                 cancel: Optional[threading.Event] = None, stats: Optional[SearchStats] = None
                 ) -> Tuple[List[Row], Bound]:
    """The exact search of ``opts.exact()`` over a language with one prefix path, cut after
    ``opts.bound_nodes`` nodes, ``ROWS_PER_NODE`` times as many strings or more than
    ``opts.exact_limit`` strings (the most it may sum): the rows it released
    (the most probable strings, each certain) and the bound they and the search's frontier give."""
    base = getattr(model, "base", model)  # a prompted model: the prompt's tokens tell it apart
    key = (id(base), base.name, getattr(base, "dtype", None), str(getattr(base, "device", "")),
           tuple(model.start_tokens), rules, opts.bound_nodes, opts.exact_limit, opts.max_tokens,
           opts.max_prefix_tokens, opts.batch_size, opts.max_memory)
    known = _KNOWN.get(automaton, {}).get(key)
    if known is not None:  # an EXPECT's later rounds: the search is deterministic, read once
        if stats is not None:
            for name in ("expanded", "prefix", "rows", "stop", "no_row", "cut", "fewest"):
                setattr(stats, name, getattr(known[2], name))
        return list(known[0]), known[1]
    stats = stats if stats is not None else SearchStats()
    limit = min(ROWS_PER_NODE * opts.bound_nodes, opts.exact_limit + 1)  # more than exact_limit: not summed
    # small calls reach deeper within the nodes (a phone number is 12 tokens deep in SmolLM2)
    batch = {} if opts.batch_size else {"batch_size": min(BATCH, opts.bound_nodes), "max_batch_size": None}
    search = ShortestPathSearch(automaton, model, rules, dataclasses.replace(
        opts.exact(), max_nodes=opts.bound_nodes, limit=limit, **batch), stats)
    rows = list(search.rows(cancel))
    low = math.fsum(r.prob for r in rows)
    exhausted = stats.stop is None and len(rows) < limit
    if exhausted:
        bound = Bound(min(low, 1.0), min(low, 1.0), stats.expanded, True)
    else:  # float32 scores summed in another batch (an estimate's, another search's) differ in the last digits
        high = min(1.0, max(low, 1.0 - float(search.ledger.lost)) * (1 + SLACK))
        bound = Bound(low * (1 - SLACK), high, stats.expanded, False)
    _KNOWN.setdefault(automaton, {})[key] = (tuple(rows), bound, dataclasses.replace(stats, watch=None))
    return rows, bound


# the bounds found, per automaton (compiled automata are cached, so an EXPECT's rounds meet the same one)
_KNOWN: "weakref.WeakKeyDictionary[TokenAutomaton, Dict[tuple, Tuple[Tuple[Row, ...], Bound, SearchStats]]]" = \
    weakref.WeakKeyDictionary()


__all__ = ["Bound", "bound_search"]
