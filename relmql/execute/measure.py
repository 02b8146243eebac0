"""The probability of a language: summed exactly, or estimated by sampling (design:
docs/executor.md, "The probability of a language" and "Inside measurement")."""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from ..automata.bytedfa import SPLIT_COL
from ..automata.tokens import TokenAutomaton
from ..models.base import LanguageModel
from ..records import Decoding, Measure
from .bounds import Bound, bound_search
from .rows import Row
from .sampling import SampleStats, sample
from .ledger import NO_ROW, SearchStats
from .shortest import shortest_path


@dataclass
class Mass:
    """How the rows of a measured language were found: ``exact`` (every token sequence, each
    row's ``prob`` counts once, and one row that only counts per prefix path) or from ``draws``
    independent samples, one row each, a hit standing for its ``weight`` (``binary``: every
    weight is 1), and beside them, where the canonical part is summed, rows with ``summed`` set
    whose ``prob`` counts once. ``prefixes``: the prefix's token paths. ``bound``: where the
    search bounded the value first (no draws at all with ``Measure.bound_only``)."""

    exact: bool
    draws: int = 0
    prefixes: int = 1
    binary: bool = False
    confidence: float = 0.95
    sequences: Optional[int] = None  # token sequences in the language, where counted
    bound: Optional[Bound] = None  # where the search bounded it first, for certain (``execute.bounds``)
    strata: int = 1  # draws that measure disjoint parts: draw i (rank i + 1) part i % strata, the value their sum

    def stratum(self, rank: int) -> int:
        """The part a draw of this rank measures (0 where there is one)."""
        return (rank - 1) % self.strata


def token_sequences(automaton: TokenAutomaton, opts: Measure) -> Optional[int]:
    """The number of token sequences of the language within the token budgets, or None when
    there are more than ``opts.exact_limit`` (or infinitely many), or more prefix token paths;
    0 where no string fits in max_tokens (``TokenAutomaton.too_long``), which the search then says
    at once, where draws would give up."""
    if automaton.count_paths(automaton.start, opts.max_prefix_tokens, prefix_only=True) > opts.exact_limit:
        return None
    strings = automaton.num_strings
    if strings is None or strings > opts.exact_limit:
        return 0 if automaton.too_long(opts.max_tokens) is not None else None
    n = automaton.count_paths(automaton.start, opts.max_prefix_tokens + opts.max_tokens)
    return n if n <= opts.exact_limit else None


def measure(automaton: TokenAutomaton, model: LanguageModel, rules: Decoding, opts: Measure,
            cancel: Optional[threading.Event] = None, stats: Optional[SearchStats] = None
            ) -> Tuple[Mass, Iterator[Row]]:
    """How the language will be measured, and its rows: one row that only counts per prefix
    path, then every token sequence with nonzero probability (exact); or one row per draw
    (estimate). Rows that only count (prefix paths, draws that found no string of the
    language) have ``miss`` set. ``stats``: the search's (exact); of draws, once they are all
    read, the bounds that cut one short (``cut``)."""
    opts = opts.check()
    prefixes = automaton.count_paths(automaton.start, opts.max_prefix_tokens, prefix_only=True)
    n = token_sequences(automaton, opts)
    reps = _Representatives(automaton)
    if n is not None:
        mass = Mass(True, prefixes=prefixes, confidence=opts.confidence, sequences=n)
        return mass, _chain(prefix_rows(automaton, opts.max_prefix_tokens, reps),
                            shortest_path(automaton, model, rules, opts.exact(), cancel, stats))
    bound = None
    if bounds_first(opts, prefixes):
        bound, done = _bounded(automaton, model, rules, opts, cancel, stats, reps)
        if done is not None:
            return done
    twin, count = canonical_part(automaton, opts, prefixes) or (None, None)
    summed = twin if count is not None else None  # the canonical tokenizations summed, else drawn half the time
    halves = twin is not None and count is None
    mass = Mass(False, opts.samples, prefixes, opts.mode == "exact", opts.confidence, strata=2 if halves else 1,
                bound=bound)
    drawn = SampleStats()
    draws = sample(automaton, model, rules, opts.estimate(), cancel, drawn, twin=twin if halves else None)
    # local draws over every tokenization can miss the few that carry the probability (Gemma 3
    # reads its bare space token first): the strings' canonical tokenizations bound it from below
    check = (twin is None and opts.mode == "local" and not automaton.canonical[1] and prefixes == 1
             and not rules.describe())

    def rows() -> Iterator[Row]:
        cut = set()
        head = set()
        if summed is not None:
            found = SearchStats()
            for r in shortest_path(summed, model, rules, opts.exact(), cancel, found):
                head.add(r.tokens)
                if rules.eos or not _begins_earlier(automaton, r):  # (with eos, no string ends another's event)
                    yield dataclasses.replace(r, summed=True)
            cut.update(found.cut)
        hits, n, total, squares = [], 0, 0.0, 0.0
        for r in draws:
            n += 1
            if not r.miss and r.tokens in head:
                r = dataclasses.replace(r, miss=True)  # summed already
            if check and not r.miss:
                total, squares = total + r.weight, squares + r.weight ** 2
                if len(hits) < 4 * FLOOR_STRINGS:
                    hits.append(r)
            yield reps.row(r.tokens[:r.prefix_tokens], rank=r.rank) if r.miss else r
        if stats is not None:  # the bounds that ended a draw (or the summed search) where the language went on
            cut.update(drawn.cut)
            stats.cut = tuple(c for c in NO_ROW if c in cut)
        if stats is not None and hits and n > 1:
            stats.floor = _floor(automaton, model, hits, n, total, squares, bound) or stats.floor  # (None: kept)
    return mass, rows()


def _floor(automaton: TokenAutomaton, model: LanguageModel, hits: List[Row], n: int, total: float, squares: float,
           bound: Optional[Bound]) -> Optional[float]:
    """The canonical floor of a local estimate (``canonical_floor``) where it lies above the
    draws' interval (``n`` draws, their weights' ``total`` and sum of ``squares``), else None.
    Where that interval misses the search's ``bound``, the bound is shown: the floor is within it."""
    mean = total / n
    high = mean + 4 * math.sqrt(max(0.0, squares / n - mean ** 2) / (n - 1))
    floor = canonical_floor(automaton, model, hits)
    if floor > max(high, mean * 1.001) and (bound is None or high >= bound.low):
        return floor
    return None


def bounds_first(opts: Measure, prefixes: int) -> bool:
    """Whether an estimate is bounded first by the exact search (``execute.bounds``), most probable
    strings first: for one prefix path, unless ``bound_nodes`` or ``exact_limit`` is 0 (as SAMPLE n
    sets it: draws alone)."""
    return bool(opts.bound_nodes and opts.exact_limit) and prefixes == 1


def _bounded(automaton: TokenAutomaton, model: LanguageModel, rules: Decoding, opts: Measure,
             cancel: Optional[threading.Event], stats: Optional[SearchStats], reps: "_Representatives"
             ) -> Tuple[Bound, Optional[Tuple[Mass, Iterator[Row]]]]:
    """The search's bound of a language of one prefix path, and the measurement where that settles
    it: the exact sum where the search read the language whole, the bound alone with ``bound_only``."""
    searched = SearchStats(watch=stats.watch if stats is not None else None)
    found, bound = bound_search(automaton, model, rules, opts, cancel, searched)
    if bound.exhausted:
        if stats is not None:
            stats.expanded, stats.rows, stats.cut, stats.no_row = (searched.expanded, searched.rows,
                                                                   searched.cut, searched.no_row)
        mass = Mass(True, prefixes=1, confidence=opts.confidence, sequences=len(found))
        return bound, (mass, _chain(prefix_rows(automaton, opts.max_prefix_tokens, reps), found))
    if opts.bound_only:
        mass = Mass(False, 0, 1, confidence=opts.confidence, bound=bound)
        return bound, (mass, prefix_rows(automaton, opts.max_prefix_tokens, reps))
    return bound, None


def canonical_part(automaton: TokenAutomaton, opts: Measure, prefixes: int
                   ) -> Optional[Tuple[TokenAutomaton, Optional[int]]]:
    """Where a local estimate over every tokenization treats its canonical tokenizations apart:
    their automaton, and how many token sequences it has where they are summed exactly (one
    prefix path, at most ``exact_limit``), or None where half the draws measure them instead
    (``sampling.Sampler``'s twin). None where ``not_apart`` says why not, and where no canonical
    tokenization fits in max_tokens."""
    if automaton.canonical[1] or not_apart(automaton, opts):
        return None
    twin = automaton.canonical_twin()
    n = token_sequences(twin, opts)
    return None if n == 0 else (twin, n if prefixes == 1 else None)


def not_apart(automaton: TokenAutomaton, opts: Measure) -> Optional[str]:
    """Why an estimate over every tokenization does not treat its canonical tokenizations apart
    (``canonical_part``), or None where it does or its completion is canonical already."""
    if automaton.canonical[1]:
        return None
    if opts.mode != "local":
        return "sampling exact"
    if automaton.canonical_twin() is None:
        return "canonical tokenization cannot be compiled for this language"
    return None


def _begins_earlier(automaton: TokenAutomaton, row: Row) -> bool:
    """Whether a shorter run of ``row``'s tokens already spells a string of the language, in some
    tokenization: the generation then begins with that string first (first_match), and ``row``
    is not one of the events an estimate over every tokenization measures."""
    for k, states in enumerate(automaton.runs(row.tokens[:-1], row.prefix_tokens), 1):
        if k > row.prefix_tokens and any(automaton.is_final(s) for s in states):
            return True
    return False


FLOOR_STRINGS = 32  # distinct strings drawn whose canonical tokenizations bound an estimate from below


def canonical_floor(automaton: TokenAutomaton, model: LanguageModel, hits: List[Row]) -> float:
    """A lower bound on what a local estimate over every tokenization measures, from the draws
    that gave a string (one prefix path): the probability of the canonical tokenizations of up
    to ``FLOOR_STRINGS`` distinct strings drawn, those the automaton holds, none the beginning of
    another (disjoint events, each a way to begin with a string of the language)."""
    vocab = automaton.vocabulary
    prefix = list(hits[0].tokens[:hits[0].prefix_tokens])
    texts: Dict[str, None] = {}
    for r in hits:
        texts.setdefault(vocab.decode(list(r.tokens[r.prefix_tokens:])), None)
        if len(texts) >= FLOOR_STRINGS:
            break
    seqs = sorted({tuple(vocab.encode(t)) for t in texts if t}, key=len)
    seqs = [s for s in seqs if s and automaton.accepts(prefix + list(s), len(prefix))]
    kept = [s for i, s in enumerate(seqs) if not any(s[:len(t)] == t for t in seqs[:i])]
    if not kept:
        return 0.0
    start = model.extend([None], [prefix])[0]
    first = start.logprobs.double().cpu().numpy()
    states = model.extend([start] * len(kept), [list(s) for s in kept])
    return float(sum(math.exp(first[s[0]] + float(np.nansum(st.token_logprobs[1:]))) for s, st in zip(kept, states)))


def _chain(*parts):
    for p in parts:
        yield from p


def prefix_paths(automaton: TokenAutomaton, max_tokens: int) -> Iterator[Tuple[Tuple[int, ...], int]]:
    """Every prefix token path of at most ``max_tokens`` tokens (the paths sampling draws a
    prefix from) and the state at its end, depth first."""
    stack = [(automaton.start, ())]
    while stack:
        state, path = stack.pop()
        if automaton._ends_here(state, True):
            yield path, state
        budget = max_tokens - len(path)
        if budget <= 0 or not automaton.in_prefix(state):
            continue
        arcs = automaton.arcs(state)
        pre = np.flatnonzero(arcs.prefix)
        for i in pre[::-1].tolist():
            t, nxt = int(arcs.tokens[i]), int(arcs.targets[i])
            if automaton.count_paths(nxt, budget - 1, prefix_only=True):
                stack.append((nxt, path + (t,)))


def prefix_rows(automaton: TokenAutomaton, max_tokens: int, reps: Optional["_Representatives"] = None
                ) -> Iterator[Row]:
    """One row that only counts per prefix token path (see ``_Representatives.row``)."""
    reps = reps or _Representatives(automaton)
    for path, state in prefix_paths(automaton, max_tokens):
        yield reps.row(path, state)


class _Representatives:
    """Rows that only count: a prefix token path with, as its text, a string of the language
    after it (the fewest edits, then the fewest bytes, then the smallest bytes)."""

    def __init__(self, automaton: TokenAutomaton):
        self.automaton = automaton
        self._after: Dict[int, Tuple[bytes, int]] = {}  # byte state after the prefix -> (completion, edits)
        self._rows: Dict[Tuple[int, ...], Row] = {}

    def row(self, path, state: Optional[int] = None, rank: int = 0) -> Row:
        path = tuple(int(t) for t in path)
        got = self._rows.get(path)
        if got is None:
            a = self.automaton
            if state is None:
                state = a.state_after(path, len(path))
            completion, edits = self._completion(a.unpack(state)[0])
            prefix = a.vocabulary.decode(path)
            rest = completion.decode("utf-8", errors="replace")
            got = self._rows[path] = Row(prefix + rest, prefix, rest, path, -math.inf, -math.inf, False, edits, 0,
                                         0.0, len(path), True)
        return dataclasses.replace(got, rank=rank) if rank else got

    def _completion(self, q: int) -> Tuple[bytes, int]:
        got = self._after.get(q)
        if got is not None:
            return got
        dfa = self.automaton.dfa
        dead = dfa.dead
        start = int(dfa.delta[q, SPLIT_COL])
        back: Dict[int, Tuple[Optional[int], int]] = {start: (None, -1)}
        frontier, best = [start], None
        while frontier:  # breadth first: the first final state of the fewest edits on the shortest path
            for s in frontier:
                e = int(dfa.final[s])
                if e >= 0 and (best is None or e < dfa.final[best]):
                    best = s
            if best is not None and dfa.final[best] == 0:
                break
            nxt = []
            for s in frontier:
                row = dfa.delta[s, :256]
                for b in np.flatnonzero(row != dead).tolist():
                    t = int(row[b])
                    if t not in back:
                        back[t] = (s, b)
                        nxt.append(t)
            frontier = nxt
        out = []
        s = best if best is not None else start
        edits = int(dfa.final[s]) if best is not None else 0
        while back[s][0] is not None:
            s, b = back[s]
            out.append(b)
        got = self._after[q] = (bytes(reversed(out)), edits)
        return got
