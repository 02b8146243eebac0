"""Token automata: the byte language seen through a model's vocabulary.

A token automaton state stands for a byte-DFA state ``q`` and, in regions tokenized
canonically, the pre-tokenizer tracker state ``tau`` and the right-edge class ``lam`` of the
previous token (for BPE's pair test). States are packed into one int64, ``q | tau << bq |
lam << (bq + bt)``, so that a state's id is its content and nothing needs interning.

Transitions are computed when a state is first asked for (``arcs``), vectorized over the
vocabulary trie, and cached; ``build_eager`` computes all of them at once.

Regions: the text is ``prefix SPLIT completion``. Each region is tokenized on its own (a token
never crosses the split), with all tokenizations or canonically (what the tokenizer produces
for that region's text alone). Arcs out of a prefix state also include the completion's first
tokens when the prefix may end there; ``Arcs.prefix`` tells which tokens belong to the prefix.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import CompileError, ModelError
from ..models.vocab import SENTENCEPIECE, Vocabulary
from ..records import TOKENIZATIONS
from .bytedfa import SPLIT_COL, ByteDFA, count_strings, format_count, restrict, to_dfa, trim
from .language import Language
from .tokenizers import Tracker, added_runs, added_words, rules_for, tracker_for, word_scanner
from .trie import VocabTrie, trie_for

CACHE_BYTES = 256 * 2 ** 20  # cached transitions per automaton until a query sets its share of max_memory
ALIVE_DEPTH = 16  # tokens looked ahead for a way on where BPE's pair rule could block the next token
ALIVE_STEPS = 4096  # states one such look-ahead steps into at most
FEWEST_STATES = 4096  # byte states read at most to bound a language's fewest tokens (fewest_tokens)
DENSE_LOOKUP = 64  # kept tokens of one byte state in a batch past which their arcs are read from a
#                    vocabulary-wide array of targets (TokenAutomaton._dfa_targets), not searched for


@dataclass
class Arcs:
    """The transitions out of one state: ``tokens[i]`` leads to ``targets[i]``; ``prefix[i]``
    is true when that token is part of the prefix."""
    tokens: np.ndarray
    targets: np.ndarray
    prefix: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_prefix(self) -> int:
        """Prefix arcs come first (each part sorted by token)."""
        got = self.__dict__.get("_n_prefix")
        if got is None:
            got = self.__dict__["_n_prefix"] = int(self.prefix.sum())
        return got


@dataclass
class Stats:
    """Sizes of an eagerly built token automaton."""
    states: int
    arcs: int
    seconds: float


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
        dfa = language.dfa
        self.context = tuple(context)
        if vocabulary.prepend and not self.context:  # after a prompt, a text does not start
            if vocabulary.prepend_unless_there:
                dfa = _absorb_leading(dfa, vocabulary.prepend)
            dfa = _with_prepend(dfa, vocabulary.prepend)
        # without a prefix, the prefix region is empty and its tokenization does not matter
        self.canonical = (prefix_tokenization == "canonical" and language.has_prefix, tokenization == "canonical")
        dfa = self._producible(dfa)
        if any(self.canonical) and vocabulary.kind == SENTENCEPIECE:
            dfa = self._canonical_part(dfa)
        # the added tokens the tokenizer cuts out of the text, where relmql reads them as such
        self.tags = _tag_tokens(vocabulary) if any(self.canonical) else None
        self.dfa = dfa
        self.delta = self.dfa.delta
        self.dead = self.dfa.dead
        self.phase = _phases(self.dfa)
        self.bq = max(1, int(self.dfa.num_states + 1).bit_length())
        self.bt = 0
        self.tracker = self.pairs = None
        if any(self.canonical):
            try:
                self.pairs = _pair_table(vocabulary)
                self.tracker = tracker_for(rules_for(vocabulary))
            except ModelError as e:
                raise CompileError(e.message, hint="use tokenization all (every tokenization of each string)") from None
            self.bt = Tracker.MAX_STATES.bit_length()
            # lam past the pair classes: inside a character spelt with byte-fallback tokens
            self.fb_base = self.pairs.classes
            self.fb = _fallback_chars(vocabulary) if getattr(self.pairs, "fallback_splits", False) else None
            lams = self.fb_base + (len(self.fb[1]) if self.fb is not None else 0)
            if self.bq + self.bt + lams.bit_length() > 63:
                raise CompileError(f"the automaton is too large for canonical tokenization "
                                   f"({self.dfa.num_states:,} byte states)", hint="use tokenization all")
        self.start = self._pack(0, self._fresh(0), 0)
        self._after_context = (self._fresh(1), 0)  # the tracker at the split, where the prefix is empty
        if self.context and any(self.canonical):
            self._follow_context()
        if any(self.canonical):
            self._check_special_texts()
        self._dfa_cache = _Lru(CACHE_BYTES // 2)
        self._arcs_cache = _Lru(CACHE_BYTES // 2)
        self._live_cache: Dict[tuple, object] = {}
        self._alive_memo: Dict[tuple, Tuple[int, int]] = {}  # (state, region) -> (leads on, ends within)
        self._alive_via: Dict[tuple, int] = {}  # (state, region) -> the target through which it last led on
        self._alive_assumed: set = set()
        self._alive_left = 0
        self._bounds: Dict[int, Tuple[int, int]] = {}
        self._counts: Dict[Tuple[int, int, int], int] = {}
        self._too_long: Dict[int, Optional[int]] = {}  # max_tokens -> too_long(max_tokens)
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
        for cache in (self._dfa_cache, self._arcs_cache):
            cache.budget = max(1, (nbytes - walks) // 2)
            cache.shrink()

    # -- packing
    def _pack(self, q, tau, lam):
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

    def _fresh(self, region: int) -> int:
        return self.tracker.start if self.canonical[region] else 0

    def _follow_context(self) -> None:
        """Start the text where the tokenizer would be after the context's tokens: the tracker's
        state and the last token's class, read by walking them through the automaton of their own
        text (in the prefix where there is one, else in the completion)."""
        from .context import context_state
        tau, lam = context_state(self.vocabulary, self.context, self.tracker, self.pairs)
        if self.language.has_prefix:
            if self.canonical[0]:
                self.start = self._pack(0, tau, lam)
        elif self.canonical[1]:
            self._after_context = (tau, lam)

    # -- queries
    @functools.cached_property
    def num_strings(self) -> Optional[int]:
        """How many strings this model can produce (None: infinitely many)."""
        return count_strings(self.dfa)

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
            tau = self._after_context[0] if first else self._fresh(1)
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
                tau2, lam2 = self._after_context if state == self.start else (self._fresh(1), 0)
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
                pieces += self._new_arcs(at, q[at], tau[at], lam[at], [kept[b] for b in at.tolist()])
        for b, state in zip(np.flatnonzero(~mine).tolist(), states[~mine].tolist()):
            groups.setdefault(state, []).append(b)
        for state, rows in groups.items():
            arcs = self.arcs(state)
            whole = [b for b in rows if kept is None or kept[b] is None]
            if whole:
                n = len(arcs)
                pieces.append((np.repeat(whole, n), *(np.tile(x, len(whole)) for x in
                                                       (arcs.tokens, arcs.targets, arcs.prefix))))
            few = [b for b in rows if kept is not None and kept[b] is not None]
            if not few:
                continue
            npre = arcs.n_prefix
            if npre:
                sel = np.tile(np.arange(npre), len(few))
                pieces.append((np.repeat(few, npre), arcs.tokens[sel], arcs.targets[sel], arcs.prefix[sel]))
            want = [kept[b] for b in few]
            pos, hit = _lookup(arcs.tokens[npre:], want)
            sel = npre + pos[hit]
            pieces.append((np.repeat(few, [len(w) for w in want])[hit], arcs.tokens[sel], arcs.targets[sel],
                           arcs.prefix[sel]))
        if not pieces:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty, np.zeros(0, bool)
        rows, toks, tgts, pre = (np.concatenate(x) for x in zip(*pieces))
        if len(pieces) > 1 and (rows[1:] < rows[:-1]).any():  # pieces out of row order
            order = np.argsort(rows, kind="stable")
            rows, toks, tgts, pre = rows[order], toks[order], tgts[order], pre[order]
        return rows.astype(np.int64, copy=False), toks, tgts, pre

    def _new_arcs(self, rows: np.ndarray, qs: np.ndarray, tau_of: np.ndarray, lam_r: np.ndarray,
                  kept: List[np.ndarray]) -> List[Tuple[np.ndarray, ...]]:
        """``arcs_of``'s piece for new states of a canonical completion (batch rows ``rows``, as
        byte state, tracker state and class), each found for its kept tokens, all states at once:
        what ``_region_arcs`` does for one state, on flat arrays of (state, token) with one lookup
        per distinct byte state and tracker state, not per state."""
        known, back = np.unique(tau_of, return_inverse=True)
        bounds = np.array([self._boundaries(t) for t in known.tolist()], np.int64).reshape(-1, 2)[back.reshape(-1)]
        # the tokens each state's byte state reads among its kept ones (looked up once per byte state)
        lens = np.fromiter(map(len, kept), np.int64, len(kept))
        flat, flat_r = np.concatenate(kept), np.repeat(np.arange(len(kept)), lens)
        flat_q = qs[flat_r]
        parts = []
        for q in np.unique(qs).tolist():
            sel = np.flatnonzero(flat_q == q)
            if len(sel) > DENSE_LOOKUP:  # one read per token, not a binary search
                tq = self._dfa_targets(q)[flat[sel]]
                hit = tq >= 0
                parts.append((flat_r[sel[hit]], flat[sel[hit]], tq[hit]))
            else:
                toks, tq = self._dfa_arcs(q)
                pos, hit = _lookup(toks, [flat[sel]])
                parts.append((flat_r[sel[hit]], toks[pos[hit]], tq[pos[hit]]))
        r, toks, tq = (np.concatenate(x).astype(np.int64, copy=False) for x in zip(*parts))
        # BPE's pair test against the token before, then the tracker over each token's bytes from
        # the boundary before it (where BPE produces the pair, or where it does not)
        pairs = self.pairs
        ok = (lam_r[r] == 0) | ~pairs.forbidden_pairs(lam_r[r], toks)
        start = np.where(ok, bounds[r, 0], bounds[r, 1])
        end = np.full(len(toks), -1, np.int64)
        order = np.argsort(start, kind="stable")
        taus, at = np.unique(start[order], return_index=True)
        for tau, a, e in zip(taus.tolist(), at.tolist(), at[1:].tolist() + [len(order)]):
            if tau >= 0:
                sel = order[a:e]
                codes, evals = self._tracker_coded(tau)
                end[sel] = evals[codes[toks[sel]]]
        keep = pairs.self_canonical[toks] & (end >= 0)
        r, toks, tq, end = r[keep], toks[keep], tq[keep], end[keep]
        lam2 = pairs.right_class[toks]
        # children by (byte state, tracker state): those whose text cannot be finished canonically
        # go; where BPE's pair rule may block every next token, look a few tokens ahead
        groups, inv = np.unique(self._pack(tq, end, 0), return_inverse=True)
        inv = inv.reshape(-1)
        gq, gt = (groups & ((1 << self.bq) - 1)).tolist(), (groups >> self.bq).tolist()
        alive = np.array([self._live(a, b, 1) for a, b in zip(gq, gt)], bool)
        check = np.array([live and self._pair_can_block(a, b, 1) and self._few_arcs(a)
                          for live, a, b in zip(alive.tolist(), gq, gt)], bool)
        keep = alive[inv]
        idx = np.flatnonzero(check[inv])
        if len(idx):
            states, back = np.unique(self._pack(tq[idx], end[idx], lam2[idx]), return_inverse=True)
            fine = np.array([self._alive(s, 1) for s in states.tolist()], bool)
            keep[idx] = fine[back.reshape(-1)]
        r, toks, tq, end, lam2 = r[keep], toks[keep], tq[keep], end[keep], lam2[keep]
        # byte-fallback and added tokens, after BPE's, where a chunk may end before them: the kept
        # tokens that are such tokens, looked up among those each byte state reads (once per state)
        extra = []
        if self._extra_tokens is not None:
            at = flat_r
            hit = np.flatnonzero(self._extra_tokens[flat])
            ends = {i: self.tracker.accepts_end(int(tau_of[i])) for i in np.unique(at[hit]).tolist()}
            hit = hit[np.array([ends[i] for i in at[hit].tolist()], bool).reshape(-1)]
            hr, ht = at[hit], flat[hit]
            hq = qs[hr]
            for q in np.unique(hq).tolist():
                mine = hq == q
                steps = ([self._fallback_step(q, 0, 1)[:4]] if self.fb is not None else []) + (
                    [self._tag_step(q, 1)] if self.tags is not None else [])
                for f_toks, f_tq, f_end, f_lam in steps:
                    pos, ok = _lookup(f_toks, [ht[mine]])
                    if ok.any():
                        p = pos[ok]
                        extra.append((hr[mine][ok], f_toks[p], f_tq[p], f_end[p], f_lam[p]))
        if extra:
            r, toks, tq, end, lam2 = (np.concatenate(x) for x in zip((r, toks, tq, end, lam2), *extra))
        # each state's arcs by token (stable: BPE's before the others of the same token)
        order = np.argsort(r * len(self.vocabulary.tokens) + toks, kind="stable")
        r, toks = r[order], toks[order]
        return [(rows[r], toks, self._pack(tq[order], end[order], lam2[order]), np.zeros(len(toks), bool))]

    @functools.cached_property
    def _extra_tokens(self) -> Optional[np.ndarray]:
        """Which tokens a canonical step may add after BPE's: byte-fallback and added tokens (None
        where there are neither)."""
        if self.fb is None and self.tags is None:
            return None
        mask = np.zeros(len(self.vocabulary.tokens), bool)
        if self.fb is not None:
            ftoks = self.fb[2]
            mask[ftoks[ftoks >= 0]] = True
        if self.tags is not None:
            mask[self.tags[0]] = True
        return mask

    def may_continue(self, state: int) -> bool:
        """Whether a token can follow ``state``: exact where its arcs are known or cheap to know;
        for a new state of a canonical completion, whether the byte automaton reads on (its
        tokens may still all be refused by BPE's rules: such a state expands to nothing)."""
        state = int(state)
        got = self._arcs_cache.get(state)
        if got is None:
            q, _, lam = self.unpack(state)
            if self._per_token(q, lam):
                return bool(self._reads_on[q])
            got = self.arcs(state)
        return len(got) > 0

    @functools.cached_property
    def _reads_on(self) -> np.ndarray:
        """Whether each byte state reads another byte."""
        return (self.delta[:, :256] != self.dead).any(axis=1)

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
    def _dfa_arcs(self, q: int) -> Tuple[np.ndarray, np.ndarray]:
        got = self._dfa_cache.get(q)
        if got is None:
            _, toks, tgts = self.trie.walk_dfa(self.delta, [q])
            got = (toks, tgts)
            self._dfa_cache.put(q, got, got[0].nbytes + got[1].nbytes)
        return got

    def _tracker_walk(self, tau: int) -> np.ndarray:
        """The tracker state after each token's bytes from ``tau`` (-1 where rejected)."""
        _, toks, tgts = self.trie.walk(self.tracker.step, -1, [tau])
        out = np.full(len(self.vocabulary.tokens), -1, np.int64)
        out[toks] = tgts
        return out

    def _tracker_ends(self, tau: int, toks: np.ndarray) -> np.ndarray:
        """The tracker state after each of a few tokens from ``tau`` (-1 where rejected)."""
        cached = self.tracker.walks.get((self.vocabulary.fingerprint, tau))
        if cached is not None or not len(toks):
            return cached[1][cached[0][toks]] if cached is not None else np.empty(0, np.int64)
        data = [self.vocabulary.tokens[t] for t in toks.tolist()]
        width = max(map(len, data))
        mat = np.zeros((len(data), width), np.uint8)
        lens = np.fromiter(map(len, data), np.int64, len(data))
        for i, d in enumerate(data):
            mat[i, :len(d)] = np.frombuffer(d, np.uint8)
        state = np.full(len(data), tau, np.int64)
        for j in range(width):
            going = (lens > j) & (state >= 0)
            if going.any():
                state[going] = self.tracker.step(state[going], mat[going, j])
        return state

    def _region_arcs(self, q: int, tau: int, lam: int, region: int) -> Tuple[np.ndarray, np.ndarray]:
        if not self.canonical[region]:
            return self._dfa_arcs(q)
        toks, tq, end, lam2, groups = self._step(q, tau, lam, region)
        if groups is not None:
            # BPE's pair rule may block every next token: look ahead for a way on (for a crowd of
            # siblings only where the next token must pair with theirs and few can come next)
            n = len(groups.key)  # byte-fallback and added tokens after them are not checked
            check = np.zeros(len(toks), bool)
            check[:n] = groups.counts[groups.key] <= 64
            for k in np.flatnonzero(groups.counts > 64).tolist():
                q2, t2 = groups.state(k)
                if self._pair_can_block(q2, t2, region) and self._few_arcs(q2):
                    check[:n] |= groups.key == k
            idx = np.flatnonzero(check)
            if len(idx):
                states, inv = np.unique(self._pack(tq[idx], end[idx], lam2[idx]), return_inverse=True)
                ok = np.array([self._alive(s, region) for s in states.tolist()], bool)
                keep = np.ones(len(toks), bool)
                keep[idx] = ok[inv.reshape(-1)]
                if not keep.all():
                    toks, tq, end, lam2 = toks[keep], tq[keep], end[keep], lam2[keep]
        if len(toks) > 1 and (np.diff(toks) < 0).any():  # byte-fallback or added tokens appended
            order = np.argsort(toks, kind="stable")
            toks, tq, end, lam2 = toks[order], tq[order], end[order], lam2[order]
        return toks, self._pack(tq, end, lam2)

    def _step(self, q: int, tau: int, lam: int, region: int):
        """The tokens allowed from (q, tau, lam) in a canonical region, with their byte state,
        tracker state and right-edge class, keeping those whose (byte state, tracker state) can
        still finish the region; and the children grouped by (byte state, tracker state)."""
        if lam >= self.fb_base:
            return self._fallback_step(q, lam - self.fb_base, region)
        toks, tq, end, lam2, groups = self._bpe_step(q, tau, lam, region)
        extra = []
        if (self.fb is not None or self.tags is not None) and self.tracker.accepts_end(tau):
            if self.fb is not None:
                extra.append(self._fallback_step(q, 0, region)[:4])
            if self.tags is not None:
                extra.append(self._tag_step(q, region))
        for f_toks, f_tq, f_end, f_lam in extra:
            if len(f_toks):
                toks, tq, end, lam2 = (np.concatenate(x) for x in ((toks, f_toks), (tq, f_tq), (end, f_end),
                                                                    (lam2, f_lam)))
        return toks, tq, end, lam2, groups

    def _tag_step(self, q: int, region: int):
        """The added tokens whose text byte state ``q`` can read (by token): each a chunk of its
        own, as the tokenizer cuts them out before it pre-tokenizes (the tracker keeps their text
        out of every other chunk)."""
        key = ("tags", q)
        got = self._live_cache.get(key)
        if got is None:
            ids, data, lens = self.tags
            state = np.full(len(ids), q, np.int64)
            for j in range(data.shape[1]):
                going = lens > j
                state[going] = self.delta[state[going], data[going, j]]
            keep = np.flatnonzero(state != self.dead)
            keep = keep[np.argsort(ids[keep], kind="stable")]  # by token
            got = self._live_cache[key] = (ids[keep], state[keep])
        toks, tq = got
        n = len(toks)
        return toks, tq, np.full(n, self._fresh(region), np.int64), np.zeros(n, np.int64)

    def _fallback_step(self, q: int, f: int, region: int):
        """The byte-fallback tokens allowed at byte state ``q``, ``f`` bytes into a character the
        vocabulary lacks (state 0: at its start). Such a character is a chunk of its own (BPE
        never merges across it): before it the chunk ends, after it a fresh one begins. Memoized
        (read-only arrays): every state at ``q`` after a whole token asks again."""
        key = ("fallback", q, f, region)
        got = self._live_cache.get(key)
        if got is None:
            got = self._live_cache[key] = self._fallback_arrays(q, f, region)
        return got

    def _fallback_arrays(self, q: int, f: int, region: int):
        fdelta, ffinal, ftoks = self.fb
        byts = np.flatnonzero((fdelta[f] >= 0) & (self.delta[q, :256] != self.dead))
        f2 = fdelta[f, byts]
        tq = self.delta[q, byts].astype(np.int64)
        done = ffinal[f2]
        end = np.full(len(byts), self._fresh(region), np.int64)
        lam2 = np.where(done, 0, self.fb_base + f2).astype(np.int64)
        toks = ftoks[byts]
        order = np.argsort(toks, kind="stable")
        out = (toks[order], tq[order], end[order], lam2[order])
        for a in out:
            a.flags.writeable = False
        return (*out, None)

    def _bpe_step(self, q: int, tau: int, lam: int, region: int):
        toks, tq, qcode, qvals = self._dfa_coded(q)
        pairs = self.pairs
        keep = pairs.self_canonical[toks]
        if lam == 0 or not len(toks):
            ok = np.ones(len(toks), bool)
        else:
            ok = ~pairs.forbidden_after(lam)[toks]
        t_ok, t_bad = self._boundaries(tau)
        codes, evals = self._tracker_coded(int(t_ok))
        ecode = codes[toks].astype(np.int64)
        end = evals[ecode]
        if not ok.all():
            if t_bad >= 0:
                codes_b, evals_b = self._tracker_coded(int(t_bad))
                code_b = codes_b[toks].astype(np.int64)
                end = np.where(ok, end, evals_b[code_b])
                ecode = np.where(ok, ecode, code_b + len(evals))
                evals = np.concatenate([evals, evals_b])
            else:
                end = np.where(ok, end, -1)
        keep &= end >= 0
        toks, tq, end, qcode, ecode = toks[keep], tq[keep], end[keep], qcode[keep], ecode[keep]
        lam2 = pairs.right_class[toks]
        groups = None
        if len(toks):
            # the children grouped by (byte state, tracker state), through small codes of both
            # (a count, not a sort): those whose text cannot be finished canonically go
            ne = len(evals)
            key = qcode.astype(np.int64) * ne + ecode
            counts = np.bincount(key, minlength=len(qvals) * ne)
            present = np.flatnonzero(counts)
            alive = np.zeros(len(counts), bool)
            for k in present.tolist():
                alive[k] = self._live(int(qvals[k // ne]), int(evals[k % ne]), region)
            if not alive[present].all():
                keep = alive[key]
                toks, tq, end, lam2, key = toks[keep], tq[keep], end[keep], lam2[keep], key[keep]
            groups = _Groups(key, counts, qvals, evals)
        return toks, tq, end, lam2, groups

    def _boundaries(self, tau: int) -> Tuple[int, int]:
        """The tracker states after a token boundary at ``tau`` where BPE produces the pair there
        and where it does not (memoized: a search meets the same few tracker states again)."""
        got = self._bounds.get(tau)
        if got is None:
            ok, bad = self.tracker.boundary(np.array([tau, tau]), np.array([True, False])).tolist()
            got = self._bounds[tau] = (ok, bad)
        return got

    def _dfa_targets(self, q: int) -> np.ndarray:
        """``_dfa_arcs(q)`` over the whole vocabulary: each token's target (-1 where none)."""
        key = ("dense", q)
        got = self._dfa_cache.get(key)
        if got is None:
            toks, tq = self._dfa_arcs(q)
            got = np.full(len(self.vocabulary.tokens), -1, np.int32)
            got[toks] = tq
            self._dfa_cache.put(key, got, got.nbytes)
        return got

    def _dfa_coded(self, q: int):
        """``_dfa_arcs(q)`` with each target's code among the distinct targets, and those."""
        key = ("coded", q)
        got = self._dfa_cache.get(key)
        if got is None:
            toks, tq = self._dfa_arcs(q)
            qvals, qcode = _unique_small(tq)
            got = (toks, tq, qcode.reshape(-1).astype(np.int32), qvals)
            self._dfa_cache.put(key, got, sum(a.nbytes for a in got))
        return got

    def _tracker_coded(self, tau: int) -> Tuple[np.ndarray, np.ndarray]:
        """``_tracker_walk(tau)`` as ``(codes, evals)``: the distinct tracker states (-1 included)
        and each token's index among them, ``evals[codes]`` being the walk. Kept by the tracker
        (a wide canonical search reads thousands): int16 codes where the states are few, an
        eighth of the walk's bytes."""
        def compute():
            evals, codes = _unique_small(self._tracker_walk(tau))
            codes = codes.reshape(-1).astype(np.int16 if len(evals) <= np.iinfo(np.int16).max else np.int32)
            codes.flags.writeable = evals.flags.writeable = False
            return codes, evals
        return self.tracker.walk((self.vocabulary.fingerprint, tau), compute)

    def _alive(self, state: int, region: int) -> bool:
        """Whether the region's text may end at ``state`` or some token sequence leads from it to
        where it may (chains of tokens that end in a pair BPE never produces are cut): looked
        ``ALIVE_DEPTH`` tokens ahead, beyond which, from a state thousands of tokens leave (as
        ``_pair_can_block`` assumes), or after ``ALIVE_STEPS`` states stepped into, a way on is
        assumed. The answer is the same whenever asked (a chunk of children read again counts on
        it): within the depth it is a function of the automaton; one the step bound cut is kept."""
        key = (state, region)
        if key in self._alive_assumed:
            return True
        self._alive_left = ALIVE_STEPS
        got = self._alive_within(state, region, ALIVE_DEPTH)
        if self._alive_left <= 0:
            self._alive_assumed.add(key)
            return True
        return got

    def _alive_within(self, state: int, region: int, depth: int) -> bool:
        """``_alive`` looking ``depth`` tokens ahead. Remembered per state as the depth it is known
        to lead on to and the depth it is known to end within: a state that leads on ``d``
        tokens does for any fewer, one whose every way ends within ``d`` tokens does for more."""
        if depth <= 0:
            return True
        key = (state, region)
        on, ends = self._alive_memo.get(key, (0, ALIVE_DEPTH + 1))
        if depth <= on:
            return True
        if depth >= ends:
            return False
        if self._alive_left <= 0:
            return True  # not remembered: _alive keeps the answer it gives
        q, tau, lam = self.unpack(state)
        if self._region_end_ok(q, tau, region) or not self._few_arcs(q):
            self._alive_memo[key] = (ALIVE_DEPTH, ends)
            return True
        # the target it last led on through, first: along a long text each state is asked again
        # one token deeper than it was (by the next state's children), and this extends the way
        # already found by one step instead of walking it again
        via = self._alive_via.get(key)
        result = via is not None and self._alive_within(via, region, depth - 1)
        if not result:
            self._alive_left -= 1
            toks, tq, end, lam2, _ = self._step(q, tau, lam, region)
            # the longest tokens first: a long forced text is crossed in the fewest steps
            order = np.argsort(-self.trie.depth[self.trie.token_node[toks]], kind="stable")
            for t in dict.fromkeys(self._pack(tq[order], end[order], lam2[order]).tolist()):
                if t != via and self._alive_within(t, region, depth - 1):
                    self._alive_via[key] = t
                    result = True
                    break
        if self._alive_left > 0:
            on, ends = self._alive_memo.get(key, (0, ALIVE_DEPTH + 1))
            self._alive_memo[key] = (max(on, depth), ends) if result else (on, min(ends, depth))
        return result

    def _few_arcs(self, q: int, most: int = 4096) -> bool:
        """Whether at most ``most`` tokens can leave byte state ``q``: at once where few tokens
        begin with the bytes it reads, else counted (the tokens it reads, which its expansion
        needs anyway: "e latte" reads few of the thousands of tokens that begin with "e")."""
        live = self.delta[q, :256] != self.dead
        return int(self.trie.first_byte_weight[live].sum()) <= most or len(self._dfa_arcs(q)[0]) <= most

    def _pair_can_block(self, q: int, tau: int, region: int) -> bool:
        """Whether the token after (q, tau) must pair with the token before it: the region
        cannot end here and no next token may start a new chunk. States that thousands of
        tokens leave are assumed free (BPE forbids about 3% of pairs)."""
        key = (q, tau, region, "block")
        got = self._live_cache.get(key)
        if got is None:
            got = False
            if not self._region_end_ok(q, tau, region) and self._few_arcs(q):
                toks, _ = self._dfa_arcs(q)
                toks = toks[self.pairs.self_canonical[toks]]
                t_bad = self._boundaries(tau)[1]
                got = not (t_bad >= 0 and (self._tracker_ends(t_bad, toks) >= 0).any())
            self._live_cache[key] = got
        return got

    def _live(self, q: int, tau: int, region: int, budget: int = 4000) -> bool:
        """Whether some continuation of the region's text lets the tokenizer's chunking agree
        with the tokens so far (future tokens assumed canonical). Breadth-first over bytes with a
        token boundary at every character boundary; gives up (True) after ``budget`` states."""
        key = (q, tau, region)
        got = self._live_cache.get(key)
        if got is not None:
            return got
        tracker = self.tracker
        if tracker.settled(tau):  # the byte DFA is trimmed: some continuation exists
            self._live_cache[key] = True
            return True
        seen = {(q, tau)}
        frontier = [(q, tau)]
        result = None
        while frontier and result is None:
            nxt = []
            for q1, t1 in frontier:
                if tracker.settled(t1) or self._region_end_ok(q1, t1, region):
                    result = True
                    break
                if self.tags is not None and tracker.accepts_end(t1) and len(self._tag_step(q1, region)[0]):
                    result = True  # an added token ends the chunk here (the byte DFA is trimmed)
                    break
                if len(seen) > budget:
                    result = True
                    break
                tb = self._boundaries(t1)[0]
                if tb < 0:
                    continue
                byts = np.flatnonzero(self.delta[q1, :256] != self.dead)
                if not len(byts):
                    continue
                q2 = self.delta[q1, byts]
                at_char = (tracker.reader_start == t1 % tracker.nreader)
                t2 = tracker.step(np.full(len(byts), tb if at_char else t1), byts)
                for a, b in zip(q2.tolist(), t2.tolist()):
                    if b >= 0 and (a, b) not in seen:
                        seen.add((a, b))
                        nxt.append((a, b))
            frontier = nxt
        result = bool(result)
        self._live_cache[key] = result
        return result

    def _region_end_ok(self, q: int, tau: int, region: int) -> bool:
        if region == 0:
            if self.delta[q, SPLIT_COL] == self.dead:
                return False
        elif self.dfa.final[q] < 0:
            return False
        return self.tracker.accepts_end(tau)

    # -- whole-automaton operations
    def build_eager(self, max_states: int = 1_000_000) -> Stats:
        """Compute every reachable state's arcs (all-tokenization automata are built in one
        vectorized pass over all DFA states)."""
        import time
        t0 = time.perf_counter()
        if not any(self.canonical):
            bounds, toks, tgts = self.trie.walk_dfa(self.delta, np.arange(self.dfa.num_states))
            self._dfa_cache.budget = max(self._dfa_cache.budget, toks.nbytes + tgts.nbytes + 1)
            for q in range(self.dfa.num_states):
                got = (toks[bounds[q]:bounds[q + 1]], tgts[bounds[q]:bounds[q + 1]])
                self._dfa_cache.put(q, got, got[0].nbytes + got[1].nbytes)
        seen = {int(self.start)}
        todo = [int(self.start)]
        narcs = 0
        while todo:
            s = todo.pop()
            arcs = self.arcs(s)
            narcs += len(arcs)
            for t in np.unique(arcs.targets).tolist():
                if t not in seen:
                    if len(seen) >= max_states:
                        raise CompileError(f"the token automaton has more than {max_states:,} states")
                    seen.add(t)
                    todo.append(t)
        return Stats(len(seen), narcs, time.perf_counter() - t0)

    def paths(self):
        """Every accepted (tokens, number of prefix tokens) of a finite automaton, depth first
        (an infinite one never ends: bound it with ``itertools.islice``)."""
        stack = [(self.start, (), 0)]
        while stack:
            state, toks, npre = stack.pop()
            if self.is_final(state):
                yield toks, npre
            arcs = self.arcs(state)
            for t, n, p in zip(arcs.tokens.tolist(), arcs.targets.tolist(), arcs.prefix.tolist()):
                stack.append((n, toks + (t,), npre + p))

    def count_paths(self, state: int, max_tokens: int, prefix_only: bool = False) -> int:
        """The number of accepted token paths of at most ``max_tokens`` tokens from ``state``
        (with ``prefix_only``: paths to the end of the prefix). Cycles are unrolled."""
        memo = self._counts
        pre = bool(prefix_only)
        root = (int(state), int(max_tokens), pre)
        stack = [root]
        while stack:  # depth-first, without recursion: a child's count before its parent's
            key = stack[-1]
            if key in memo:
                stack.pop()
                continue
            s, budget, pre = key
            targets = self._count_targets(s, pre) if budget else ([], [])
            missing = [(t, budget - 1, pre) for t in targets[0] if (t, budget - 1, pre) not in memo]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            memo[key] = self._ends_here(s, pre) + sum(
                c * memo[(t, budget - 1, pre)] for t, c in zip(*targets))
        return memo[root]

    def prefix_nodes(self, max_tokens: int, limit: int) -> Optional[int]:
        """The nodes of the prefix's token tree within ``max_tokens`` tokens (every token sequence
        that begins the prefix, the empty one included), or None as soon as they are known to be
        more than ``limit``: counted level by level, so that a prefix with astronomically many
        tokenizations (text pasted with unescaped dots) is refused after its first levels, not
        after every state's arcs."""
        frontier, total = {self.start: 1}, 1
        for _ in range(max_tokens):
            nxt: Dict[int, int] = {}
            for s, c in frontier.items():
                for t, k in zip(*self._count_targets(s, True)):
                    nxt[t] = nxt.get(t, 0) + c * k
            if not nxt:
                break
            total += sum(nxt.values())
            if total > limit:
                return None
            frontier = nxt
        return total

    def fewest_tokens(self, most: int, budget: int = FEWEST_STATES) -> int:
        """A lower bound on the completion tokens of every string: the fewest with which any
        sequence of steps spells one, a step being a token of the vocabulary, a single byte (byte
        fallback) or an added token (every tokenization counts, so the canonical one takes at
        least as many), from any place the prefix may end, whatever its length. Breadth first over
        the byte automaton; where ``most`` tokens or ``budget`` byte states are reached first, the
        depth it got to (at most ``most + 1``)."""
        delta, dead, final = self.delta, self.dead, self.dfa.final
        frontier = np.unique(delta[np.flatnonzero(self.phase[:dead] == 0), SPLIT_COL])
        frontier = frontier[frontier != dead]
        seen = np.zeros(len(delta), bool)
        seen[frontier] = True
        read = 0
        for depth in range(most + 1):
            if (final[frontier] >= 0).any():
                return depth
            read += len(frontier)
            if depth == most or read > budget:
                return depth + 1
            if not len(frontier):  # no string at all
                return most + 1
            steps = [delta[frontier, :256].ravel()]
            for q in frontier.tolist():
                steps.append(self._dfa_arcs(q)[1])
                if self.tags is not None:
                    steps.append(self._tag_step(q, 1)[1])
            frontier = np.unique(np.concatenate(steps))
            frontier = frontier[(frontier != dead) & ~seen[frontier]]
            seen[frontier] = True
        return most + 1

    def too_long(self, max_tokens: int) -> Optional[int]:
        """Where no string can be spelt in ``max_tokens`` completion tokens, a lower bound on the
        tokens each takes (``fewest_tokens``, looked for up to twice as deep); else None."""
        got = self._too_long.get(max_tokens, ())
        if got == ():
            need = self.fewest_tokens(max(2 * max_tokens, max_tokens + 16))
            got = self._too_long[max_tokens] = need if need > max_tokens else None
        return got

    def _ends_here(self, state: int, prefix_only: bool) -> int:
        """1 where a counted path may end at ``state`` (with ``prefix_only``: the prefix may end
        there), else 0."""
        if not prefix_only:
            return int(self.is_final(state))
        q, tau, _ = self.unpack(state)
        return int(self.phase[q] == 0 and self.delta[q, SPLIT_COL] != self.dead
                   and (not self.canonical[0] or self.tracker.accepts_end(tau)))

    def _count_targets(self, state: int, prefix_only: bool):
        if prefix_only and self.phase[self.unpack(state)[0]] != 0:
            return [], []
        arcs = self.arcs(state)
        targets = arcs.targets[arcs.prefix] if prefix_only else arcs.targets
        uniq, counts = np.unique(targets, return_counts=True)
        return uniq.tolist(), counts.tolist()

    # -- producibility
    def _canonical_part(self, dfa: ByteDFA) -> ByteDFA:
        """Leave out (and report) the strings whose canonical SentencePiece tokenization relmql
        does not model: characters spelt with several byte-fallback tokens where those are not
        chunks of their own, and added tokens where ``_tag_tokens`` cannot read them."""
        try:
            allowed, what = _sentencepiece_allowed(self.vocabulary)
        except ModelError:
            return dfa  # not a BPE vocabulary: the pair table's own error follows
        kept = restrict(dfa, allowed, self.canonical)
        if kept.num_states == dfa.num_states and kept.num_arcs == dfa.num_arcs:
            return dfa
        lost = _lost(dfa, kept)
        if kept.is_empty():
            # the caret under the first ▁ written in MATCHING or PREFIX, else under MATCHING
            spec = self.language.spec
            role, text = next(((r, t) for r, t in (("MATCHING", spec.matching), ("PREFIX", spec.prefix or ""))
                               if "\u2581" in t), ("MATCHING", spec.matching))
            at = text.find("\u2581")
            err = CompileError(f"canonical tokenization of these strings is not supported: they contain {what}",
                               (at, at + 1) if at >= 0 else (0, len(text)), text,
                               hint="use tokenization all (and prefix_tokenization all)")
            err.role = role
            raise err
        one = lost == "1"
        self.warnings.append(f"{lost} string{'' if one else 's'} of this query left out of canonical "
                             f"tokenization: {'it contains' if one else 'they contain'} {what}; tokenization all "
                             f"includes {'it' if one else 'them'}")
        return kept

    def _check_special_texts(self) -> None:
        """Report the strings that hold the text of a special token (``<eos>``): the tokenizer
        reads that text as the special token, which relmql never produces, so the tracker keeps
        them out of canonical tokenization; a query with no other string is an error."""
        words, ids = added_words(self.vocabulary)
        special = tuple(w for w, i in zip(words, ids) if self.vocabulary.tokens[i] is None)
        if not special:
            return
        found, other = _holds_word(self.dfa, word_scanner(special).delta, self.canonical, self.phase)
        if not found:
            return
        names = ", ".join(w.decode("utf-8", "replace") for w in special[:3]) + (", ..." if len(special) > 3 else "")
        why = (f"the text of a special token ({names}), which the tokenizer reads as that token and relmql "
               "never generates")
        if not other:
            raise CompileError(f"no string of this query has a canonical tokenization: each holds {why}",
                               hint="use tokenization all (and prefix_tokenization all) to spell such text "
                                    "with ordinary tokens")
        self.warnings.append(f"strings of this query that hold {why} are left out of canonical tokenization; "
                             "tokenization all spells them with ordinary tokens")

    def _producible(self, dfa: ByteDFA) -> ByteDFA:
        """Drop (and report) strings that need a byte no token contains."""
        present = np.zeros(256, bool)
        present[np.unique(self.trie.node_byte[1:])] = True
        missing = np.flatnonzero(~present)
        used = [b for b in missing if (dfa.delta[:-1, b] != dfa.dead).any()]
        if not used:
            return dfa
        delta = dfa.delta.copy()
        delta[:, used] = dfa.dead
        kept = trim(ByteDFA(delta, dfa.final.copy()))
        shown = ", ".join(f"0x{b:02X}" for b in used[:8])
        msg = (f"{_lost(dfa, kept)} strings of this query cannot be produced by this model: its vocabulary has no "
               f"token containing byte(s) {shown}")
        if kept.is_empty():
            raise CompileError("no string of this query can be produced by this model: its vocabulary "
                               f"has no token containing byte(s) {shown}")
        self.warnings.append(msg)
        return kept


def _unique_small(values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` for small integers from -1 (automaton and
    tracker states over the vocabulary) by counting rather than sorting: a tenth of the time
    for 49,152 tokens, where a wide canonical search asks for it thousands of times."""
    shifted = values.astype(np.int64) + 1
    if not len(values) or shifted.min() < 0 or shifted.max() > 4 * len(values):
        return np.unique(values, return_inverse=True)
    present = np.bincount(shifted) > 0
    return (np.flatnonzero(present) - 1).astype(values.dtype), (np.cumsum(present) - 1)[shifted]


def _lookup(sorted_values: np.ndarray, wanted: List[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """Where each value of the arrays ``wanted`` (concatenated) would sit in ``sorted_values``,
    and whether it is there."""
    flat = np.concatenate(wanted) if len(wanted) > 1 else wanted[0]
    pos = np.searchsorted(sorted_values, flat)
    hit = pos < len(sorted_values)
    hit[hit] = sorted_values[pos[hit]] == flat[hit]
    return pos, hit


class _Groups:
    """The children of a canonical step grouped by (byte state, tracker state): ``key[i]`` is
    child i's group, ``counts`` the size of each group (zero where none), and ``state(k)`` the
    (byte state, tracker state) of group k. The first children of a step are BPE's; byte-fallback
    and added tokens appended after them have no group."""

    __slots__ = ("key", "counts", "qvals", "evals")

    def __init__(self, key: np.ndarray, counts: np.ndarray, qvals: np.ndarray, evals: np.ndarray):
        self.key, self.counts, self.qvals, self.evals = key, counts, qvals, evals

    def state(self, k: int) -> Tuple[int, int]:
        ne = len(self.evals)
        return int(self.qvals[k // ne]), int(self.evals[k % ne])


def _lost(dfa: ByteDFA, kept: ByteDFA) -> str:
    """How many strings of ``dfa`` ``kept`` lacks, for a message ("some" for big languages, where
    counting costs more than the message is worth)."""
    if dfa.num_states <= 1000:
        total, left = count_strings(dfa), count_strings(kept)
        if total is not None and left is not None:
            return format_count(total - left)
    return "some"


@functools.lru_cache(maxsize=4)
def _fallback_chars(vocab: Vocabulary) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The characters (above ASCII) a SentencePiece vocabulary lacks, as a small DFA over their
    UTF-8 bytes: ``delta[f, byte]`` (-1: none), ``final[f]``, and the byte-fallback token of each
    byte."""
    from .charset import MAX_CP, CodepointSet
    from .primitives import chars_fst, optimize
    pairs = _pair_table(vocab)
    lacking = pairs.known().complement().intersection(CodepointSet([(0x80, MAX_CP)]))
    dfa = to_dfa(optimize(chars_fst(lacking), 1_000_000))
    delta = dfa.delta[:-1, :256].astype(np.int64)
    delta[delta == dfa.dead] = -1
    return delta, dfa.final[:-1] >= 0, pairs.fallback.copy()


SPACE_MARK = "\u2581".encode()  # ▁: a SentencePiece tokenizer writes it for a space, and reads it as one


@functools.lru_cache(maxsize=4)
def _sentencepiece_allowed(vocab: Vocabulary) -> Tuple[ByteDFA, str]:
    """For a SentencePiece vocabulary, the texts whose canonical tokenization relmql models:
    every character a unit of the vocabulary or ASCII (unless the others are byte-fallback chunks
    of their own, ``PairTable.fallback_splits``), no ▁ (the tokenizer reads it as a space: no
    token sequence is the tokenizer's own encoding of a text that holds it), and no added token
    that ``_tag_tokens`` cannot read (special tokens are left to the tracker); and what the others
    contain, for a message."""
    from .charset import ALL
    from .primitives import bytes_fst, chars_fst, difference, optimize, sigma_star
    pairs = _pair_table(vocab)
    known = chars_fst(ALL if pairs.fallback_splits else pairs.known()).closure()
    parts = [] if pairs.fallback_splits else ["characters this tokenizer spells with byte-fallback tokens"]
    words, ids = added_words(vocab)
    other = [w for w, i in zip(words, ids) if vocab.tokens[i] is not None]
    banned = [SPACE_MARK]
    if other and _tag_tokens(vocab) is None:
        banned += other
        parts.append(f"its added tokens ({', '.join(w.decode('utf-8', 'replace') for w in other[:3])}, ...)")
    parts.append("the character \u2581 (U+2581), which the tokenizer reads as a space")
    inner = bytes_fst(banned[0])
    for t in banned[1:]:
        inner = inner.union(bytes_fst(t))
    bad = optimize(sigma_star().concat(inner).concat(sigma_star()), 1_000_000)
    known = difference(optimize(known, 1_000_000), bad)
    return to_dfa(optimize(known, 1_000_000)), " or ".join(parts)


@functools.lru_cache(maxsize=4)
def _tag_tokens(vocab: Vocabulary) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The added tokens (not special) that the tokenizer cuts out of the text before it
    pre-tokenizes and relmql reads as tokens of their own: their ids, their bytes as rows of a
    matrix, and their lengths. None where there are none, or where they are not modelled: their
    occurrences could overlap (``WordScanner.overlap``), they strip spaces or match only whole
    words, or a normalizer puts ▁ in front of the text (it does so again after each one)."""
    words, ids = added_words(vocab)
    spec = {a["id"]: a for a in vocab.spec.get("added_tokens", [])}
    tags = [(w, i) for w, i in zip(words, ids) if vocab.tokens[i] is not None]
    if not tags:
        return None
    runs = tuple(chr(c).encode("utf-8") for c, _ in added_runs(vocab)[0]) if vocab.kind == SENTENCEPIECE else ()
    if (vocab.prepend or word_scanner(words + runs).overlap is not None
            or any(spec[i].get(k) for _, i in tags for k in ("lstrip", "rstrip", "single_word"))):
        return None
    width = max(len(w) for w, _ in tags)
    data = np.zeros((len(tags), width), np.int64)
    for k, (w, _) in enumerate(tags):
        data[k, :len(w)] = np.frombuffer(w, np.uint8)
    return (np.array([i for _, i in tags], np.int64), data, np.array([len(w) for w, _ in tags], np.int64))


def _holds_word(dfa: ByteDFA, scanner: np.ndarray, canonical: Tuple[bool, bool], phase: np.ndarray,
                budget: int = 2_000_000) -> Tuple[bool, bool]:
    """Whether some string of ``dfa`` holds a word of ``scanner`` (a ``WordScanner`` table,
    restarted at the split) inside a canonical region, and whether some string holds none there:
    breadth first over pairs (byte state, scanner state), until both are known (beyond
    ``budget`` pairs, a string with no word is assumed)."""
    nh = len(scanner)
    seen = {0}  # pair q * nh + h
    frontier = np.zeros(1, np.int64)
    found = other = False
    while len(frontier) and not (found and other):
        q, h = np.divmod(frontier, nh)
        other = other or bool((dfa.final[q] >= 0).any())
        nxt = []
        for lo in range(0, len(q), 4096):
            qs, hs = q[lo:lo + 4096], h[lo:lo + 4096]
            watch = np.array(canonical)[phase[qs]]
            q2 = dfa.delta[qs, :256].astype(np.int64)
            h2 = np.where(watch[:, None], scanner[hs], 0)
            live = q2 != dfa.dead
            found = found or bool((live & (h2 < 0)).any())
            ok = live & (h2 >= 0)
            nxt.append(q2[ok] * nh + h2[ok])
            split = dfa.delta[qs, SPLIT_COL].astype(np.int64)
            nxt.append(split[split != dfa.dead] * nh)
        cand = np.unique(np.concatenate(nxt))
        cand = cand[[c not in seen for c in cand.tolist()]]
        seen.update(cand.tolist())
        frontier = cand
        if len(seen) > budget:
            return found, True
    return found, other

@functools.lru_cache(maxsize=8)
def _pair_table(vocab: Vocabulary):
    from .tokenizers.bpe import PairTable
    return PairTable(vocab)


def _phases(dfa: ByteDFA) -> np.ndarray:
    """0 for states before the split, 1 after."""
    n = dfa.num_states
    phase = np.ones(n + 1, np.int8)
    seen = np.zeros(n + 1, bool)
    seen[0] = True
    frontier = np.array([0])
    while len(frontier):
        phase[frontier] = 0
        nxt = np.unique(dfa.delta[frontier, :256])
        nxt = nxt[(nxt != dfa.dead) & ~seen[nxt]]
        seen[nxt] = True
        frontier = nxt
    return phase


def _absorb_leading(dfa: ByteDFA, prepend: bytes) -> ByteDFA:
    """For a tokenizer that puts ``prepend`` (one byte) in front of a text unless the text starts
    with it (``Metaspace``): the texts that, after ``_with_prepend``, spell what the tokenizer
    reads. A text that starts with ``prepend`` loses it (the tokenizer reads " Hello" as it reads
    "Hello"); a text starts before the prefix, or after the split when the prefix is empty (a
    prefix that is ``prepend`` alone becomes an empty one).

    A subset construction over items: an old state q, or ~q, q at a text's start, which does
    not read ``prepend`` (an item beside it reads the text after it). Sets of one old state are
    that state; the few others are new states."""
    if len(prepend) != 1:
        raise ModelError("relmql models a prepended text of one byte only")
    p, n, dead, cols = prepend[0], dfa.num_states, dfa.dead, dfa.delta.shape[1]
    old = dfa.delta.astype(np.int64)
    s1 = int(old[0, SPLIT_COL])
    ids: Dict[FrozenSet[int], int] = {}
    sets: List[FrozenSet[int]] = []

    def state(items) -> int:
        items = frozenset(i for i in items if i != dead and i != ~dead)
        if not items:
            return dead
        if len(items) == 1 and min(items) >= 0:
            return min(items)
        if items not in ids:
            if len(sets) > n:
                raise CompileError("the automaton is too large for this tokenizer's leading space",
                                   hint="use a narrower pattern, or raise max_states")
            ids[items] = n + 1 + len(sets)
            sets.append(items)
        return ids[items]

    def after(item: int, c: int) -> Tuple[int, ...]:
        if item >= 0:
            return (int(old[item, c]),)
        q = ~item
        if c == p:
            return ()
        if c == SPLIT_COL and q == 0 and s1 != dead:
            return (~s1, int(old[s1, p]))
        return (int(old[q, c]),)

    start = state([~0, int(old[0, p])])
    rows = []
    while len(rows) < len(sets):
        items = sets[len(rows)]
        rows.append([state(x for i in items for x in after(i, c)) for c in range(cols)])
    total = n + 1 + len(sets)  # old states, the old dead row, the new states; a new dead row last
    delta = np.vstack([old, np.array(rows, np.int64).reshape(len(sets), cols), np.full((1, cols), dead)])
    delta[delta == dead] = total
    ends = [[int(dfa.final[i if i >= 0 else ~i]) for i in items] for items in sets]
    fewest = [min([e for e in es if e >= 0], default=-1) for es in ends]  # the fewest edits
    final = np.concatenate([dfa.final, np.array(fewest, np.int16), [np.int16(-1)]]).astype(np.int16)
    order = np.array([start] + [i for i in range(total) if i != start], np.int64)
    remap = np.empty(total + 1, np.int64)
    remap[order] = np.arange(total)
    remap[total] = total
    return trim(ByteDFA(remap[delta[np.append(order, total)]].astype(np.int32), final[np.append(order, total)]))


def _with_prepend(dfa: ByteDFA, prepend: bytes) -> ByteDFA:
    """The language with ``prepend`` in front of the text, inside whichever region the text
    starts in: before the prefix, or right after the split when the prefix is empty; the empty
    text stays empty (tokenizers put nothing in front of it)."""
    n, k = dfa.num_states, len(prepend)
    cols = dfa.delta.shape[1]
    # layout: new start 0; old states 1..n; a copy of the old start without its split (n+1);
    # chains for the prepend before the prefix (A) and after the split (B); dead last
    start_copy = n + 1
    chain_a = list(range(n + 2, n + 2 + k - 1))
    chain_b = list(range(n + 1 + k, n + 1 + 2 * k))
    total = n + 1 + 2 * k
    dead = total
    delta = np.full((total + 1, cols), dead, np.int32)
    old = dfa.delta[:n].astype(np.int64)
    delta[1:n + 1] = np.where(old == dfa.dead, dead, old + 1)
    delta[start_copy] = delta[1]
    delta[start_copy, SPLIT_COL] = dead
    a_path = [0] + chain_a + [start_copy]
    for i, b in enumerate(prepend):
        delta[a_path[i], b] = a_path[i + 1]
    after_split = int(dfa.delta[0, SPLIT_COL])
    if after_split != dfa.dead:
        delta[0, SPLIT_COL] = chain_b[0]
        b_path = chain_b + [after_split + 1]
        for i, b in enumerate(prepend):
            delta[b_path[i], b] = b_path[i + 1]
    final = np.full(total + 1, -1, np.int16)
    final[1:n + 1] = dfa.final[:n]
    if after_split != dfa.dead:
        final[chain_b[0]] = dfa.final[after_split]  # the empty text: nothing is put in front of it
    return trim(ByteDFA(delta, final))


class _Lru:
    """A cache of numpy-backed values bounded by their total size (bytes)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.items: "OrderedDict[int, object]" = OrderedDict()
        self.sizes: Dict[int, int] = {}
        self.total = 0

    def get(self, key):
        got = self.items.get(key)
        if got is not None:
            self.items.move_to_end(key)
        return got

    def put(self, key, value, size: int):
        if key in self.items:
            self.total -= self.sizes[key]
        self.items[key] = value
        self.sizes[key] = size
        self.total += size
        self.shrink()

    def shrink(self):
        while self.total > self.budget and len(self.items) > 1:
            old, _ = self.items.popitem(last=False)
            self.total -= self.sizes.pop(old)
