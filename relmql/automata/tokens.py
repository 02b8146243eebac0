"""Token automata: the byte language seen through a model's vocabulary, a state at a time.
``TokenAutomaton`` holds the states and their arcs; its canonical steps (``steps.py``), the
fitting of the byte DFA to the vocabulary (``fitting.py``) and its counts (``counting.py``) are
objects and functions it calls (design: docs/compiler.md, "Inside the token automaton")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import CompileError
from ..memory import Lru
from ..models.vocab import Vocabulary
from ..records import TOKENIZATIONS
from .bytearcs import ByteArcs, lookup
from .bytedfa import SPLIT_COL
from .counting import FEWEST_STATES, Counting, Stats
from .fitting import canonical_tables, check_special_texts, fit, phases, tag_tokens
from .language import Language
from .steps import CanonicalSteps
from .trie import VocabTrie, trie_for

CACHE_BYTES = 256 * 2 ** 20  # cached transitions per automaton until a query sets its share of max_memory


@dataclass
class Arcs:
    """The transitions out of one state: ``tokens[i]`` leads to ``targets[i]``; ``prefix[i]``
    is true when that token is part of the prefix."""
    tokens: np.ndarray  # the tokens, prefix arcs first (each part sorted by token)
    targets: np.ndarray  # the packed state each leads to
    prefix: np.ndarray  # bool: whether each is a prefix token

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_prefix(self) -> int:
        """Prefix arcs come first (each part sorted by token)."""
        got = self.__dict__.get("_n_prefix")
        if got is None:
            got = self.__dict__["_n_prefix"] = int(self.prefix.sum())
        return got


class TokenAutomaton:
    """The token sequences that spell the strings of a ``Language`` with a ``Vocabulary``.

    ``tokenization`` applies to the completion and ``prefix_tokenization`` to the prefix:
    "all" admits every token sequence that spells the text, "canonical" only the sequence the
    model's tokenizer produces for it.
    """

    def __init__(self, language: Language, vocabulary: Vocabulary, tokenization: str = "canonical",
                 prefix_tokenization: str = "canonical", context: Tuple[int, ...] = ()):
        for name, mode in (("tokenization", tokenization), ("prefix_tokenization", prefix_tokenization)):
            if mode not in TOKENIZATIONS:
                raise CompileError(f"unknown {name} {mode!r}; use canonical or all")
        self.language = language
        self.vocabulary = vocabulary
        self.tokenization = tokenization
        self.prefix_tokenization = prefix_tokenization
        self.warnings: List[str] = []
        self.trie: VocabTrie = trie_for(vocabulary)
        self.context = tuple(context)
        # without a prefix, the prefix region is empty and its tokenization does not matter
        self.canonical = (prefix_tokenization == "canonical" and language.has_prefix, tokenization == "canonical")
        self.dfa = fit(language, vocabulary, self.trie, self.canonical, self.context, self.warnings)
        # the added tokens the tokenizer cuts out of the text, where relmql reads them as such
        self.tags = tag_tokens(vocabulary) if any(self.canonical) else None
        self.delta = self.dfa.delta
        self.dead = self.dfa.dead
        self.phase = phases(self.dfa)
        self.bq = max(1, int(self.dfa.num_states + 1).bit_length())
        self.bt = self.fb_base = 0
        self.tracker = self.pairs = self.fb = None
        if any(self.canonical):
            self.pairs, self.tracker, self.bt, self.fb_base, self.fb = canonical_tables(
                vocabulary, self.dfa.num_states, self.bq)
        self.start = self.pack(0, self.fresh(0), 0)
        self._after_context = (self.fresh(1), 0)  # the tracker at the split, where the prefix is empty
        if self.context and any(self.canonical):
            self._follow_context()
        if any(self.canonical):
            check_special_texts(self.dfa, vocabulary, self.canonical, self.phase, self.warnings)
        self.bytes = ByteArcs(self.dfa, self.trie, len(vocabulary.tokens), CACHE_BYTES // 2)  # byte states' arcs
        self.steps = CanonicalSteps(self) if any(self.canonical) else None  # the canonical regions' steps
        self.counts = Counting(self)  # counts of strings and paths
        self._arcs_cache = Lru(CACHE_BYTES // 2)  # state -> Arcs
        self._twin: Optional[Tuple[Optional["TokenAutomaton"]]] = None  # canonical_twin(), once built

    def canonical_twin(self) -> Optional["TokenAutomaton"]:
        """This language with a canonical completion (the prefix tokenized as here): this automaton
        where its completion is canonical already; None where canonical tokenization cannot be
        compiled for it. Built once."""
        if self.canonical[1]:
            return self
        if self._twin is None:
            try:
                twin = TokenAutomaton(self.language, self.vocabulary, "canonical", self.prefix_tokenization,
                                      self.context)
            except CompileError:
                twin = None
            self._twin = (twin,)
        return self._twin[0]

    def set_cache_budget(self, nbytes: int) -> None:
        """Keep at most about ``nbytes`` of cached transitions (least recently used are dropped
        and computed again when asked for): under canonical tokenization a quarter of it for the
        tracker's walks (shared by the automata of one tokenizer), the rest split evenly."""
        walks = 0
        if self.tracker is not None:
            walks = nbytes // 4
            self.tracker.set_walk_budget(walks)
        for cache in (self.bytes.cache, self._arcs_cache):
            cache.budget = max(1, (nbytes - walks) // 2)
            cache.shrink()

    # -- packing
    def pack(self, q, tau, lam):
        """States (q, tau, lam) packed into int64s (arrays or scalars)."""
        return np.asarray(q, np.int64) | (np.asarray(tau, np.int64) << self.bq) | (
            np.asarray(lam, np.int64) << (self.bq + self.bt))

    def unpack(self, state: int) -> Tuple[int, int, int]:
        state = int(state)
        q = state & ((1 << self.bq) - 1)
        tau = (state >> self.bq) & ((1 << self.bt) - 1) if self.bt else 0
        lam = state >> (self.bq + self.bt)
        return q, tau, lam

    def _unpack_all(self, states: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``unpack`` of many states at once, as arrays."""
        q = states & ((1 << self.bq) - 1)
        tau = (states >> self.bq) & ((1 << self.bt) - 1) if self.bt else np.zeros_like(states)
        return q, tau, states >> (self.bq + self.bt)

    def fresh(self, region: int) -> int:
        """The tracker state where ``region`` begins a chunk."""
        return self.tracker.start if self.canonical[region] else 0

    def _follow_context(self) -> None:
        """Start the text where the tokenizer would be after the context's tokens: the tracker's
        state and the last token's class, read by walking them through the automaton of their own
        text (in the prefix where there is one, else in the completion)."""
        from .context import context_state
        tau, lam = context_state(self.vocabulary, self.context, self.tracker, self.pairs)
        if self.language.has_prefix:
            if self.canonical[0]:
                self.start = self.pack(0, tau, lam)
        elif self.canonical[1]:
            self._after_context = (tau, lam)

    # -- queries
    @property
    def num_strings(self) -> Optional[int]:
        """How many strings this model can produce (None: infinitely many)."""
        return self.counts.num_strings

    def in_prefix(self, state: int) -> bool:
        """Whether the text so far is still (a prefix of) the prefix."""
        return self.phase[self.unpack(state)[0]] == 0

    def final_edits(self, state: int) -> int:
        """-1 if the text may not end here, else the edit count of the text."""
        q, tau, _ = self.unpack(state)
        region = self.phase[q]
        if region == 0:
            if self.canonical[0] and not self.tracker.accepts_end(tau):
                return -1
            first = state == self.start
            q = int(self.delta[q, SPLIT_COL])
            if q == self.dead:
                return -1
            tau = self._after_context[0] if first else self.fresh(1)
        if self.dfa.final[q] < 0:
            return -1
        if self.canonical[1] and not self.tracker.accepts_end(tau):
            return -1
        return int(self.dfa.final[q])

    def is_final(self, state: int) -> bool:
        return self.final_edits(state) >= 0

    def arcs(self, state: int) -> Arcs:
        """The transitions out of ``state`` (cached)."""
        state = int(state)
        got = self._arcs_cache.get(state)
        if got is not None:
            return got
        q, tau, lam = self.unpack(state)
        parts = []
        if self.phase[q] == 0:
            toks, tgts = self._region_arcs(q, tau, lam, 0)
            parts.append((toks, tgts, np.ones(len(toks), bool)))
            q2 = int(self.delta[q, SPLIT_COL])
            if q2 != self.dead and (not self.canonical[0] or self.tracker.accepts_end(tau)):
                tau2, lam2 = self._after_context if state == self.start else (self.fresh(1), 0)
                toks, tgts = self._region_arcs(q2, tau2, lam2, 1)
                parts.append((toks, tgts, np.zeros(len(toks), bool)))
        else:
            toks, tgts = self._region_arcs(q, tau, lam, 1)
            parts.append((toks, tgts, np.zeros(len(toks), bool)))
        arcs = Arcs(*(np.concatenate(x) for x in zip(*parts)))
        self._arcs_cache.put(state, arcs, arcs.tokens.nbytes + arcs.targets.nbytes + arcs.prefix.nbytes)
        return arcs

    def arcs_among(self, state: int, tokens: Optional[np.ndarray]) -> Arcs:
        """Every prefix arc of ``state`` and the completion arcs whose token is in ``tokens``
        (sorted; None: every arc), as ``arcs_of`` finds them for one state."""
        _, toks, tgts, pre = self.arcs_of([state], [tokens])
        return Arcs(toks, tgts, pre)

    def arcs_of(self, states: Sequence[int], kept: Optional[Sequence[Optional[np.ndarray]]] = None
                ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The arcs out of each of ``states`` at once, as flat arrays ``(row, token, target,
        prefix)`` grouped by row (row i: ``states[i]``'s prefix arcs, then its completion arcs,
        each part by token). With ``kept``, row i keeps every prefix arc (decoding rules do not
        apply to the prefix) and the completion arcs whose token is in ``kept[i]`` (sorted; None:
        all); a state whose arcs are not known yet has them found for those tokens alone (a
        search whose rules keep the top k tokens reads k of them, not the whole vocabulary). One
        difference from the whole state's arcs: a token that leads into a dead end only BPE's
        pair rule makes (found by looking ahead, which ``arcs`` does for few siblings) may be
        kept; no string lies beyond it. Such arcs are not cached: a search reads each state
        once."""
        pieces = []  # (rows, tokens, targets, prefix), each row in exactly one piece or one group's two
        groups: Dict[int, List[int]] = {}
        states = np.asarray(states, np.int64).reshape(-1)
        mine = np.zeros(len(states), bool)  # rows whose arcs are found for their kept tokens
        if kept is not None and self.canonical[1]:  # only a canonical completion's states can be
            # found for the kept tokens even where the whole state's arcs are cached: the same
            # (state, tokens) always gives the same list, which a chunk of children read again
            # (CHUNK) counts on
            q, tau, lam = self._unpack_all(states)
            mine = self._per_token_all(q, lam) & np.array([k is not None for k in kept], bool)
            if mine.any():
                at = np.flatnonzero(mine)
                pieces += self.steps.batch_arcs(at, q[at], tau[at], lam[at], [kept[b] for b in at.tolist()])
        for b, state in zip(np.flatnonzero(~mine).tolist(), states[~mine].tolist()):
            groups.setdefault(state, []).append(b)
        for state, rows in groups.items():
            pieces += _pieces(self.arcs(state), rows, kept)
        return _by_row(pieces)

    def may_continue(self, state: int) -> bool:
        """Whether a token can follow ``state``: exact where its arcs are known or cheap to know;
        for a new state of a canonical completion, whether the byte automaton reads on (its
        tokens may still all be refused by BPE's rules: such a state expands to nothing)."""
        state = int(state)
        got = self._arcs_cache.get(state)
        if got is None:
            q, _, lam = self.unpack(state)
            if self._per_token(q, lam):
                return bool(self.bytes.reads_on[q])
            got = self.arcs(state)
        return len(got) > 0

    def _per_token(self, q: int, lam: int) -> bool:
        """Whether a state's arcs are costly and can be found for a few tokens alone: a state of
        a canonical completion after a BPE token (not inside a byte-fallback character)."""
        return self.phase[q] != 0 and self.canonical[1] and lam < self.fb_base

    def _per_token_all(self, q: np.ndarray, lam: np.ndarray) -> np.ndarray:
        """``_per_token`` of many states at once."""
        if not self.canonical[1]:
            return np.zeros(len(q), bool)
        return (self.phase[q] != 0) & (lam < self.fb_base)

    def accepts(self, tokens, prefix_len: Optional[int] = None) -> bool:
        """Whether a token sequence is in the automaton (with the first ``prefix_len`` tokens
        as prefix tokens, when given)."""
        states = [self.start]
        for states in self.runs(tokens, prefix_len):
            if not states:
                return False
        return any(self.is_final(s) for s in states)

    def state_after(self, tokens, prefix_len: Optional[int] = None) -> Optional[int]:
        """The state a token sequence reaches (the first, where it may reach several; with the
        first ``prefix_len`` tokens as prefix tokens, when given); None where it cannot."""
        states = [self.start]
        for states in self.runs(tokens, prefix_len):
            pass
        return states[0] if states else None

    def runs(self, tokens, prefix_len: Optional[int] = None) -> Iterator[List[int]]:
        """The states a token sequence can reach after each of its tokens (with the first
        ``prefix_len`` tokens as prefix tokens, when given); stops after the first empty list."""
        states = [self.start]
        for k, tok in enumerate(tokens):
            nxt = []
            for s in states:
                arcs = self.arcs(s)
                for i in np.flatnonzero(arcs.tokens == tok):
                    if prefix_len is None or bool(arcs.prefix[i]) == (k < prefix_len):
                        nxt.append(int(arcs.targets[i]))
            states = nxt
            yield states
            if not states:
                return

    # -- region transitions
    def _region_arcs(self, q: int, tau: int, lam: int, region: int) -> Tuple[np.ndarray, np.ndarray]:
        if not self.canonical[region]:
            return self.bytes.arcs(q)
        return self.steps.region_arcs(q, tau, lam, region)

    # -- counting (counting.py)
    def build_eager(self, max_states: int = 1_000_000) -> Stats:
        """Compute every reachable state's arcs (all-tokenization automata are built in one
        vectorized pass over all DFA states)."""
        return self.counts.build_eager(max_states)

    def paths(self):
        """Every accepted (tokens, number of prefix tokens) of a finite automaton, depth first
        (an infinite one never ends: bound it with ``itertools.islice``)."""
        return self.counts.paths()

    def count_paths(self, state: int, max_tokens: int, prefix_only: bool = False) -> int:
        """The number of accepted token paths of at most ``max_tokens`` tokens from ``state``
        (with ``prefix_only``: paths to the end of the prefix). Cycles are unrolled."""
        return self.counts.count_paths(state, max_tokens, prefix_only)

    def prefix_nodes(self, max_tokens: int, limit: int) -> Optional[int]:
        """The nodes of the prefix's token tree within ``max_tokens`` tokens, None past ``limit``."""
        return self.counts.prefix_nodes(max_tokens, limit)

    def fewest_tokens(self, most: int, budget: int = FEWEST_STATES) -> int:
        """A lower bound on the completion tokens of every string (``Counting.fewest_tokens``)."""
        return self.counts.fewest_tokens(most, budget)

    def too_long(self, max_tokens: int) -> Optional[int]:
        """Where no string can be spelt in ``max_tokens`` completion tokens, a lower bound on the
        tokens each takes (``fewest_tokens``, looked for up to twice as deep); else None."""
        return self.counts.too_long(max_tokens)

    def _ends_here(self, state: int, prefix_only: bool) -> int:
        """1 where a counted path may end at ``state`` (with ``prefix_only``: the prefix may end
        there), else 0."""
        return self.counts.ends_here(state, prefix_only)


def _pieces(arcs: Arcs, rows: List[int],
            kept: Optional[Sequence[Optional[np.ndarray]]]) -> List[Tuple[np.ndarray, ...]]:
    """``arcs_of``'s pieces for batch rows ``rows`` of one state whose arcs are ``arcs``: the whole
    arcs for rows without kept tokens, every prefix arc and the kept completion arcs for the others."""
    pieces = []
    whole = [b for b in rows if kept is None or kept[b] is None]
    if whole:
        n = len(arcs)
        pieces.append((np.repeat(whole, n), *(np.tile(x, len(whole)) for x in
                                               (arcs.tokens, arcs.targets, arcs.prefix))))
    few = [b for b in rows if kept is not None and kept[b] is not None]
    if not few:
        return pieces
    npre = arcs.n_prefix
    if npre:
        sel = np.tile(np.arange(npre), len(few))
        pieces.append((np.repeat(few, npre), arcs.tokens[sel], arcs.targets[sel], arcs.prefix[sel]))
    want = [kept[b] for b in few]
    pos, hit = lookup(arcs.tokens[npre:], want)
    sel = npre + pos[hit]
    pieces.append((np.repeat(few, [len(w) for w in want])[hit], arcs.tokens[sel], arcs.targets[sel],
                   arcs.prefix[sel]))
    return pieces


def _by_row(pieces: List[Tuple[np.ndarray, ...]]) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``arcs_of``'s pieces as one set of flat arrays ``(row, token, target, prefix)`` in row order."""
    if not pieces:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, np.zeros(0, bool)
    rows, toks, tgts, pre = (np.concatenate(x) for x in zip(*pieces))
    if len(pieces) > 1 and (rows[1:] < rows[:-1]).any():  # pieces out of row order
        order = np.argsort(rows, kind="stable")
        rows, toks, tgts, pre = rows[order], toks[order], tgts[order], pre[order]
    return rows.astype(np.int64, copy=False), toks, tgts, pre
