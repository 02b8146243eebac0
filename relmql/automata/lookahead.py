"""The look-ahead of canonical steps: whether a canonical region's text can still be finished
from a state, where BPE's pair rule or the pre-tokenizer's chunks could block every way on
(design: docs/compiler.md, "Inside the token automaton")."""

from __future__ import annotations

import weakref
from typing import Dict, Tuple

import numpy as np

from .bytedfa import SPLIT_COL

ALIVE_DEPTH = 16  # tokens looked ahead for a way on where BPE's pair rule could block the next token
ALIVE_STEPS = 4096  # states one such look-ahead steps into at most


class LookAhead:
    """Owned by ``CanonicalSteps`` (``steps``), whose steps it takes to look ahead: ``live``
    over bytes (can the chunking still agree?), ``alive`` over tokens (can the pair rule still
    let a token through?), ``living`` both for a batch's children."""

    def __init__(self, steps):
        self.steps = weakref.proxy(steps)  # the CanonicalSteps this looks ahead for (they own it)
        self.automaton = automaton = steps.automaton  # a proxy, as in the steps
        self.bq = automaton.bq
        self.delta, self.dead, self.final = automaton.delta, automaton.dead, automaton.dfa.final
        self.tracker, self.pairs, self.tags = steps.tracker, steps.pairs, steps.tags
        self.bytes, self.trie, self.vocabulary = steps.bytes, steps.trie, steps.vocabulary
        self.cache: dict = {}  # (q, tau, region) and (q, tau, region, "block") -> bool
        self.memo: Dict[tuple, Tuple[int, int]] = {}  # (state, region) -> (leads on, ends within)
        self.via: Dict[tuple, int] = {}  # (state, region) -> the target through which it last led on
        self.assumed: set = set()  # (state, region) whose way on the step bound assumed
        self.left = 0  # states the look-ahead under way may still step into

    def living(self, kids):
        """A batch's ``Children`` (of a canonical completion) less those whose text cannot be
        finished canonically, grouped by (byte state, tracker state), looking a few tokens ahead
        where BPE's pair rule may block every next token."""
        r, toks, tq, end, lam2 = kids
        groups, inv = np.unique(self.automaton.pack(tq, end, 0), return_inverse=True)
        inv = inv.reshape(-1)
        gq, gt = (groups & ((1 << self.bq) - 1)).tolist(), (groups >> self.bq).tolist()
        alive = np.array([self.live(a, b, 1) for a, b in zip(gq, gt)], bool)
        check = np.array([live and self.pair_can_block(a, b, 1) and self.bytes.few(a)
                          for live, a, b in zip(alive.tolist(), gq, gt)], bool)
        keep = alive[inv]
        idx = np.flatnonzero(check[inv])
        if len(idx):
            states, back = np.unique(self.automaton.pack(tq[idx], end[idx], lam2[idx]), return_inverse=True)
            fine = np.array([self.alive(s, 1) for s in states.tolist()], bool)
            keep[idx] = fine[back.reshape(-1)]
        return type(kids)(r[keep], toks[keep], tq[keep], end[keep], lam2[keep])

    def alive(self, state: int, region: int) -> bool:
        """Whether the region's text may end at ``state`` or some token sequence leads from it to
        where it may (chains of tokens that end in a pair BPE never produces are cut): looked
        ``ALIVE_DEPTH`` tokens ahead, beyond which, from a state thousands of tokens leave (as
        ``pair_can_block`` assumes), or after ``ALIVE_STEPS`` states stepped into, a way on is
        assumed. The answer is the same whenever asked (a chunk of children read again counts on
        it): within the depth it is a function of the automaton; one the step bound cut is kept."""
        key = (state, region)
        if key in self.assumed:
            return True
        self.left = ALIVE_STEPS
        got = self._within(state, region, ALIVE_DEPTH)
        if self.left <= 0:
            self.assumed.add(key)
            return True
        return got

    def _within(self, state: int, region: int, depth: int) -> bool:
        """``alive`` looking ``depth`` tokens ahead. Remembered per state as the depth it is known
        to lead on to and the depth it is known to end within: a state that leads on ``d``
        tokens does for any fewer, one whose every way ends within ``d`` tokens does for more."""
        if depth <= 0:
            return True
        key = (state, region)
        on, ends = self.memo.get(key, (0, ALIVE_DEPTH + 1))
        if depth <= on:
            return True
        if depth >= ends:
            return False
        if self.left <= 0:
            return True  # not remembered: alive keeps the answer it gives
        q, tau, lam = self.automaton.unpack(state)
        if self.end_ok(q, tau, region) or not self.bytes.few(q):
            self.memo[key] = (ALIVE_DEPTH, ends)
            return True
        # the target it last led on through, first: along a long text each state is asked again
        # one token deeper than it was (by the next state's children), and this extends the way
        # already found by one step instead of walking it again
        via = self.via.get(key)
        result = via is not None and self._within(via, region, depth - 1)
        if not result:
            self.left -= 1
            toks, tq, end, lam2, _ = self.steps.step(q, tau, lam, region)
            # the longest tokens first: a long forced text is crossed in the fewest steps
            order = np.argsort(-self.trie.depth[self.trie.token_node[toks]], kind="stable")
            for t in dict.fromkeys(self.automaton.pack(tq[order], end[order], lam2[order]).tolist()):
                if t != via and self._within(t, region, depth - 1):
                    self.via[key] = t
                    result = True
                    break
        if self.left > 0:
            on, ends = self.memo.get(key, (0, ALIVE_DEPTH + 1))
            self.memo[key] = (max(on, depth), ends) if result else (on, min(ends, depth))
        return result

    def pair_can_block(self, q: int, tau: int, region: int) -> bool:
        """Whether the token after (q, tau) must pair with the token before it: the region
        cannot end here and no next token may start a new chunk. States that thousands of
        tokens leave are assumed free (BPE forbids about 3% of pairs)."""
        key = (q, tau, region, "block")
        got = self.cache.get(key)
        if got is None:
            got = False
            if not self.end_ok(q, tau, region) and self.bytes.few(q):
                toks, _ = self.bytes.arcs(q)
                toks = toks[self.pairs.self_canonical[toks]]
                t_bad = self.steps.boundaries(tau)[1]
                got = not (t_bad >= 0 and (self._tracker_ends(t_bad, toks) >= 0).any())
            self.cache[key] = got
        return got

    def _tracker_ends(self, tau: int, toks: np.ndarray) -> np.ndarray:
        """The tracker state after each of a few tokens from ``tau`` (-1 where rejected)."""
        cached = self.tracker.walks.peek((self.vocabulary.fingerprint, tau))
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

    def live(self, q: int, tau: int, region: int, budget: int = 4000) -> bool:
        """Whether some continuation of the region's text lets the tokenizer's chunking agree
        with the tokens so far (future tokens assumed canonical). Breadth-first over bytes with a
        token boundary at every character boundary; gives up (True) after ``budget`` states."""
        key = (q, tau, region)
        got = self.cache.get(key)
        if got is not None:
            return got
        tracker = self.tracker
        if tracker.settled(tau):  # the byte DFA is trimmed: some continuation exists
            self.cache[key] = True
            return True
        seen = {(q, tau)}
        frontier = [(q, tau)]
        result = None
        while frontier and result is None:
            nxt = []
            for q1, t1 in frontier:
                if tracker.settled(t1) or self.end_ok(q1, t1, region):
                    result = True
                    break
                if self.tags is not None and tracker.accepts_end(t1) and len(self.steps.tag_step(q1, region)[0]):
                    result = True  # an added token ends the chunk here (the byte DFA is trimmed)
                    break
                if len(seen) > budget:
                    result = True
                    break
                tb = self.steps.boundaries(t1)[0]
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
        self.cache[key] = result
        return result

    def end_ok(self, q: int, tau: int, region: int) -> bool:
        """Whether the region may end at byte state ``q`` with the tracker at ``tau``."""
        if region == 0:
            if self.delta[q, SPLIT_COL] == self.dead:
                return False
        elif self.final[q] < 0:
            return False
        return self.tracker.accepts_end(tau)
