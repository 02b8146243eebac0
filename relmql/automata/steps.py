"""The canonical steps of a token automaton: the tokens a canonically tokenized region allows
from a state, one state at a time or for a batch of states and their kept tokens (design:
docs/compiler.md, "Inside the token automaton")."""

from __future__ import annotations

import functools
import weakref
from typing import List, NamedTuple, Optional, Tuple

import numpy as np

from .bytearcs import lookup, unique_small
from .lookahead import LookAhead

DENSE_LOOKUP = 64  # kept tokens of one byte state in a batch past which their arcs are read from a
#                    vocabulary-wide array of targets (ByteArcs.targets), not searched for


class Children(NamedTuple):
    """Children of a batch of states, one per entry: each array as long as the others."""
    rows: np.ndarray  # the batch row (parent state) of each child
    tokens: np.ndarray  # its token
    q: np.ndarray  # the byte state it reaches
    tau: np.ndarray  # the tracker state after it
    lam: np.ndarray  # its right-edge class


class CanonicalSteps:
    """The steps of a canonical region, owned by its ``TokenAutomaton``: from (byte state ``q``,
    tracker state ``tau``, class ``lam`` of the token before), the tokens BPE's pair rule and
    the pre-tokenizer's chunks allow, then byte-fallback and added tokens; ``ahead`` looks a
    few tokens ahead where the pair rule may block every way on."""

    def __init__(self, automaton):
        self.automaton = weakref.proxy(automaton)  # the TokenAutomaton these steps serve (it owns them)
        self.vocabulary, self.trie, self.bytes = automaton.vocabulary, automaton.trie, automaton.bytes
        self.delta, self.dead = automaton.delta, automaton.dead
        self.tracker, self.pairs, self.tags = automaton.tracker, automaton.pairs, automaton.tags
        self.fb, self.fb_base = automaton.fb, automaton.fb_base
        self.bq = automaton.bq
        self._bounds: dict = {}  # tracker state -> boundaries(tracker state)
        self._memo: dict = {}  # ("tags", q) and ("fallback", q, f, region) -> read-only arrays
        self.ahead = LookAhead(self)

    # -- one state
    def region_arcs(self, q: int, tau: int, lam: int, region: int) -> Tuple[np.ndarray, np.ndarray]:
        """The tokens (sorted) and packed targets out of (q, tau, lam) in canonical ``region``."""
        toks, tq, end, lam2, groups = self.step(q, tau, lam, region)
        if groups is not None:
            # BPE's pair rule may block every next token: look ahead for a way on (for a crowd of
            # siblings only where the next token must pair with theirs and few can come next)
            n = len(groups.key)  # byte-fallback and added tokens after them are not checked
            check = np.zeros(len(toks), bool)
            check[:n] = groups.counts[groups.key] <= 64
            for k in np.flatnonzero(groups.counts > 64).tolist():
                q2, t2 = groups.state(k)
                if self.ahead.pair_can_block(q2, t2, region) and self.bytes.few(q2):
                    check[:n] |= groups.key == k
            idx = np.flatnonzero(check)
            if len(idx):
                states, inv = np.unique(self.automaton.pack(tq[idx], end[idx], lam2[idx]), return_inverse=True)
                ok = np.array([self.ahead.alive(s, region) for s in states.tolist()], bool)
                keep = np.ones(len(toks), bool)
                keep[idx] = ok[inv.reshape(-1)]
                if not keep.all():
                    toks, tq, end, lam2 = toks[keep], tq[keep], end[keep], lam2[keep]
        if len(toks) > 1 and (np.diff(toks) < 0).any():  # byte-fallback or added tokens appended
            order = np.argsort(toks, kind="stable")
            toks, tq, end, lam2 = toks[order], tq[order], end[order], lam2[order]
        return toks, self.automaton.pack(tq, end, lam2)

    def step(self, q: int, tau: int, lam: int, region: int):
        """The tokens allowed from (q, tau, lam) in a canonical region, with their byte state,
        tracker state and right-edge class, keeping those whose (byte state, tracker state) can
        still finish the region; and the children grouped by (byte state, tracker state)."""
        if lam >= self.fb_base:
            return self.fallback_step(q, lam - self.fb_base, region)
        toks, tq, end, lam2, groups = self.bpe_step(q, tau, lam, region)
        extra = []
        if (self.fb is not None or self.tags is not None) and self.tracker.accepts_end(tau):
            if self.fb is not None:
                extra.append(self.fallback_step(q, 0, region)[:4])
            if self.tags is not None:
                extra.append(self.tag_step(q, region))
        for f_toks, f_tq, f_end, f_lam in extra:
            if len(f_toks):
                toks, tq, end, lam2 = (np.concatenate(x) for x in ((toks, f_toks), (tq, f_tq), (end, f_end),
                                                                    (lam2, f_lam)))
        return toks, tq, end, lam2, groups

    def tag_step(self, q: int, region: int):
        """The added tokens whose text byte state ``q`` can read (by token): each a chunk of its
        own, as the tokenizer cuts them out before it pre-tokenizes (the tracker keeps their text
        out of every other chunk)."""
        key = ("tags", q)
        got = self._memo.get(key)
        if got is None:
            ids, data, lens = self.tags
            state = np.full(len(ids), q, np.int64)
            for j in range(data.shape[1]):
                going = lens > j
                state[going] = self.delta[state[going], data[going, j]]
            keep = np.flatnonzero(state != self.dead)
            keep = keep[np.argsort(ids[keep], kind="stable")]  # by token
            got = self._memo[key] = (ids[keep], state[keep])
        toks, tq = got
        n = len(toks)
        return toks, tq, np.full(n, self.automaton.fresh(region), np.int64), np.zeros(n, np.int64)

    def fallback_step(self, q: int, f: int, region: int):
        """The byte-fallback tokens allowed at byte state ``q``, ``f`` bytes into a character the
        vocabulary lacks (state 0: at its start). Such a character is a chunk of its own (BPE
        never merges across it): before it the chunk ends, after it a fresh one begins. Memoized
        (read-only arrays): every state at ``q`` after a whole token asks again."""
        key = ("fallback", q, f, region)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._fallback_arrays(q, f, region)
        return got

    def _fallback_arrays(self, q: int, f: int, region: int):
        fdelta, ffinal, ftoks = self.fb
        byts = np.flatnonzero((fdelta[f] >= 0) & (self.delta[q, :256] != self.dead))
        f2 = fdelta[f, byts]
        tq = self.delta[q, byts].astype(np.int64)
        done = ffinal[f2]
        end = np.full(len(byts), self.automaton.fresh(region), np.int64)
        lam2 = np.where(done, 0, self.fb_base + f2).astype(np.int64)
        toks = ftoks[byts]
        order = np.argsort(toks, kind="stable")
        out = (toks[order], tq[order], end[order], lam2[order])
        for a in out:
            a.flags.writeable = False
        return (*out, None)

    def bpe_step(self, q: int, tau: int, lam: int, region: int):
        """``step``'s BPE tokens, and their groups (``Groups``)."""
        toks, tq, qcode, qvals = self.bytes.coded(q)
        pairs = self.pairs
        keep = pairs.self_canonical[toks]
        if lam == 0 or not len(toks):
            ok = np.ones(len(toks), bool)
        else:
            ok = ~pairs.forbidden_after(lam)[toks]
        t_ok, t_bad = self.boundaries(tau)
        codes, evals = self.tracker_coded(int(t_ok))
        ecode = codes[toks].astype(np.int64)
        end = evals[ecode]
        if not ok.all():
            if t_bad >= 0:
                codes_b, evals_b = self.tracker_coded(int(t_bad))
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
                alive[k] = self.ahead.live(int(qvals[k // ne]), int(evals[k % ne]), region)
            if not alive[present].all():
                keep = alive[key]
                toks, tq, end, lam2, key = toks[keep], tq[keep], end[keep], lam2[keep], key[keep]
            groups = Groups(key, counts, qvals, evals)
        return toks, tq, end, lam2, groups

    def boundaries(self, tau: int) -> Tuple[int, int]:
        """The tracker states after a token boundary at ``tau`` where BPE produces the pair there
        and where it does not (memoized: a search meets the same few tracker states again)."""
        got = self._bounds.get(tau)
        if got is None:
            ok, bad = self.tracker.boundary(np.array([tau, tau]), np.array([True, False])).tolist()
            got = self._bounds[tau] = (ok, bad)
        return got

    def tracker_walk(self, tau: int) -> np.ndarray:
        """The tracker state after each token's bytes from ``tau`` (-1 where rejected)."""
        _, toks, tgts = self.trie.walk(self.tracker.step, -1, [tau])
        out = np.full(len(self.vocabulary.tokens), -1, np.int64)
        out[toks] = tgts
        return out

    def tracker_coded(self, tau: int) -> Tuple[np.ndarray, np.ndarray]:
        """``tracker_walk(tau)`` as ``(codes, evals)``: the distinct tracker states (-1 included)
        and each token's index among them, ``evals[codes]`` being the walk. Kept by the tracker
        (a wide canonical search reads thousands): int16 codes where the states are few, an
        eighth of the walk's bytes."""
        def compute():
            evals, codes = unique_small(self.tracker_walk(tau))
            codes = codes.reshape(-1).astype(np.int16 if len(evals) <= np.iinfo(np.int16).max else np.int32)
            codes.flags.writeable = evals.flags.writeable = False
            return codes, evals
        return self.tracker.walk((self.vocabulary.fingerprint, tau), compute)

    # -- a batch of states
    def batch_arcs(self, rows: np.ndarray, qs: np.ndarray, tau_of: np.ndarray, lam_r: np.ndarray,
                   kept: List[np.ndarray]) -> List[Tuple[np.ndarray, ...]]:
        """``TokenAutomaton.arcs_of``'s piece for new states of a canonical completion (batch rows
        ``rows``, as byte state, tracker state and class), each found for its kept tokens, all
        states at once: what ``region_arcs`` does for one state, on flat arrays of (state, token)
        with one lookup per distinct byte state and tracker state, not per state."""
        lens = np.fromiter(map(len, kept), np.int64, len(kept))
        flat, flat_r = np.concatenate(kept), np.repeat(np.arange(len(kept)), lens)
        r, toks, tq = self._kept_reads(qs, flat, flat_r)
        kids = self.ahead.living(self._bpe_children(r, toks, tq, tau_of, lam_r))
        extra = self._extra_children(qs, tau_of, flat, flat_r) if self.extra_tokens is not None else []
        if extra:
            kids = Children(*(np.concatenate(x) for x in zip(kids, *extra)))
        # each state's arcs by token (stable: BPE's before the others of the same token)
        order = np.argsort(kids.rows * len(self.vocabulary.tokens) + kids.tokens, kind="stable")
        r, toks = kids.rows[order], kids.tokens[order]
        return [(rows[r], toks, self.automaton.pack(kids.q[order], kids.tau[order], kids.lam[order]),
                 np.zeros(len(toks), bool))]

    def _kept_reads(self, qs: np.ndarray, flat: np.ndarray, flat_r: np.ndarray):
        """The kept tokens (``flat``, of batch row ``flat_r``) that each row's byte state reads,
        as (row, token, byte state reached): looked up once per byte state."""
        flat_q = qs[flat_r]
        parts = []
        for q in np.unique(qs).tolist():
            sel = np.flatnonzero(flat_q == q)
            if len(sel) > DENSE_LOOKUP:  # one read per token, not a binary search
                tq = self.bytes.targets(q)[flat[sel]]
                hit = tq >= 0
                parts.append((flat_r[sel[hit]], flat[sel[hit]], tq[hit]))
            else:
                toks, tq = self.bytes.arcs(q)
                pos, hit = lookup(toks, [flat[sel]])
                parts.append((flat_r[sel[hit]], toks[pos[hit]], tq[pos[hit]]))
        return (np.concatenate(x).astype(np.int64, copy=False) for x in zip(*parts))

    def _bpe_children(self, r: np.ndarray, toks: np.ndarray, tq: np.ndarray, tau_of: np.ndarray,
                      lam_r: np.ndarray) -> Children:
        """BPE's pair test against the token before, then the tracker over each token's bytes from
        the boundary before it (where BPE produces the pair, or where it does not)."""
        known, back = np.unique(tau_of, return_inverse=True)
        bounds = np.array([self.boundaries(t) for t in known.tolist()], np.int64).reshape(-1, 2)[back.reshape(-1)]
        pairs = self.pairs
        ok = (lam_r[r] == 0) | ~pairs.forbidden_pairs(lam_r[r], toks)
        start = np.where(ok, bounds[r, 0], bounds[r, 1])
        end = np.full(len(toks), -1, np.int64)
        order = np.argsort(start, kind="stable")
        taus, at = np.unique(start[order], return_index=True)
        for tau, a, e in zip(taus.tolist(), at.tolist(), at[1:].tolist() + [len(order)]):
            if tau >= 0:
                sel = order[a:e]
                codes, evals = self.tracker_coded(tau)
                end[sel] = evals[codes[toks[sel]]]
        keep = pairs.self_canonical[toks] & (end >= 0)
        r, toks, tq, end = r[keep], toks[keep], tq[keep], end[keep]
        return Children(r, toks, tq, end, pairs.right_class[toks])

    def _extra_children(self, qs: np.ndarray, tau_of: np.ndarray, flat: np.ndarray,
                        flat_r: np.ndarray) -> List[Tuple[np.ndarray, ...]]:
        """Byte-fallback and added tokens, after BPE's, where a chunk may end before them: the
        kept tokens that are such tokens, looked up among those each byte state reads (once per
        state)."""
        extra = []
        at = flat_r
        hit = np.flatnonzero(self.extra_tokens[flat])
        ends = {i: self.tracker.accepts_end(int(tau_of[i])) for i in np.unique(at[hit]).tolist()}
        hit = hit[np.array([ends[i] for i in at[hit].tolist()], bool).reshape(-1)]
        hr, ht = at[hit], flat[hit]
        hq = qs[hr]
        for q in np.unique(hq).tolist():
            mine = hq == q
            steps = ([self.fallback_step(q, 0, 1)[:4]] if self.fb is not None else []) + (
                [self.tag_step(q, 1)] if self.tags is not None else [])
            for f_toks, f_tq, f_end, f_lam in steps:
                pos, ok = lookup(f_toks, [ht[mine]])
                if ok.any():
                    p = pos[ok]
                    extra.append((hr[mine][ok], f_toks[p], f_tq[p], f_end[p], f_lam[p]))
        return extra

    @functools.cached_property
    def extra_tokens(self) -> Optional[np.ndarray]:
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


class Groups:
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
