"""The pre-tokenizer tracker: a lazily built DFA over the bytes of tokens, token boundaries and
the end of the text that accepts exactly the token sequences whose chunk boundaries are the
tokenizer's own. Design: docs/tokenizers.md."""

from __future__ import annotations

import functools
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np
import pynini

from ...errors import ModelError
from ...memory import Lru
from ..charset import CodepointSet
from ..primitives import ONE, TAG, chars_fst, optimize
from .classes import word_scanner
from .rules import ChunkRules

REJECT = -1
_UNKNOWN = -2

# A chunker core is a set of hypotheses (a nondeterministic automaton, determinized lazily by
# the tracker). A hypothesis guesses, at each chunk start, which alternative wins and, at a
# token boundary, whether the chunk ends there; it carries what that guess still needs from the
# text that follows:
#   (cur, state, need, owed)
#   cur:   the alternative guessed to win the current chunk, in DFA state ``state``; -1: a chunk
#          starts here (nothing guessed yet)
#   need:  an alternative whose look-ahead must hold for the next character (the chunk just
#          ended on its match), or -1
#   owed:  frozenset of (alternative, DFA state, look-ahead pending): alternatives that must
#          never match from here on — those before a chunk's winner (run from the chunk's
#          start), and each winner after the end of its chunk (the engine's match is its last)
# A chunk ends only at a token boundary, always at one BPE does not produce (TB_BAD), and only
# after a match of its winner.
Core = frozenset


class _Chunker:
    def __init__(self, rules: ChunkRules):
        self.alts = rules.alternatives
        self.before = [frozenset((j, 0, False) for j in range(i)) for i in range(len(self.alts))]

    def fresh(self) -> Core:
        return frozenset({(-1, 0, -1, frozenset())})

    def _owe(self, owed: FrozenSet[tuple], k: int) -> Optional[FrozenSet[tuple]]:
        """The debts after character class ``k``, or None when one of them matches."""
        out = []
        for j, state, pending in owed:
            alt = self.alts[j]
            if pending and k not in alt.not_before:
                return None  # its look-ahead holds: it matched before k
            nxt = alt.delta[state].get(k, -1)
            if nxt < 0:
                continue  # it can no longer match: paid
            if nxt in alt.accepting:
                if alt.not_before is None:
                    return None
                out.append((j, nxt, True))
            else:
                out.append((j, nxt, False))
        return frozenset(out)

    def feed(self, core: Core, k: int) -> Optional[Core]:
        out = set()
        for cur, state, need, owed in core:
            if need >= 0 and k in self.alts[need].not_before:
                continue
            owed = self._owe(owed, k)
            if owed is None:
                continue
            if cur >= 0:
                nxt = self.alts[cur].delta[state].get(k, -1)
                if nxt >= 0:
                    out.add((cur, nxt, -1, owed))
                continue
            for i, alt in enumerate(self.alts):  # guess the winner; those before it must not match
                nxt = alt.delta[0].get(k, -1)
                if nxt < 0:
                    continue
                first = self._owe(self.before[i], k)
                if first is not None:
                    out.add((i, nxt, -1, owed | first))
        return frozenset(out) or None

    def token_boundary(self, core: Core, ok: bool) -> Optional[Core]:
        out = set()
        for h in core:
            cur, state, need, owed = h
            if cur < 0:  # the start of the text
                out.add(h)
                continue
            if ok:
                out.add(h)  # the chunk goes on
            alt = self.alts[cur]
            if state in alt.accepting:  # or ends on this match, the last one its winner has
                out.add((-1, 0, -1 if alt.not_before is None else cur, owed | {(cur, state, False)}))
        return frozenset(out) or None

    def end(self, core: Optional[Core]) -> bool:
        """Whether the text may end here (the end of the text is a token boundary, and satisfies
        every look-ahead)."""
        if core is None:
            return False
        for cur, state, need, owed in core:
            if any(pending for _, _, pending in owed):
                continue
            if cur < 0 or state in self.alts[cur].accepting:
                return True
        return False

    def settled(self, core: Core) -> bool:
        """Whether any continuation of the text is fine: a hypothesis owes nothing, and is at a
        chunk start or inside a chunk whose winner has matched."""
        for cur, state, need, owed in core:
            if not owed and need < 0 and (cur < 0 or (self.alts[cur].not_before is None
                                                      and state in self.alts[cur].accepting)):
                return True
        return False


# ---------------------------------------------------------------- the tracker DFA


class Tracker:
    """The canonical-tokenization tracker as a lazily filled DFA over numpy tables.

    A tracker state packs (chunker core id, word scanner state, UTF-8 reader state) as
    ``(core * nwords + word) * nreader + reader``; the word scanner (``WordScanner``) rejects a
    chunk text that contains one of the rules' words. Events: bytes (0-255) via ``step``, token
    boundaries via ``boundary`` and the end of the text via ``accepts_end``. ``REJECT`` (-1) is
    the dead state.
    """

    MAX_STATES = 1 << 24  # tracker ids must fit the bits tokens.py packs them into

    def __init__(self, rules: ChunkRules):
        self.chunker = _Chunker(rules)
        self._build_reader(rules.classes)
        self.words = word_scanner(rules.words).delta if rules.words else np.zeros((1, 256), np.int64)
        self.nwords = len(self.words)
        self.cores: List[Core] = []
        self.core_ids: Dict[Core, int] = {}
        self.nevents = len(rules.classes) + 2  # classes, TB_OK, TB_BAD
        self.TB_OK, self.TB_BAD = len(rules.classes), len(rules.classes) + 1
        self.table = np.full((64, self.nevents), _UNKNOWN, np.int64)
        # (vocabulary, state) -> the tracker states after each token (coded, see
        # CanonicalSteps.tracker_coded), least recently used dropped first past 128 MiB
        self.walks = Lru(128 << 20)
        self.end_ok = np.zeros(64, np.int8)  # 0 unknown, 1 yes, 2 no
        self.start = self._intern(self.chunker.fresh()) * self.nwords * self.nreader + self.reader_start

    def _build_reader(self, classes: Sequence[CodepointSet]):
        """A DFA over bytes that reads one UTF-8 character and tells its class."""
        tag = TAG + 10
        parts = []
        for k, cs in enumerate(classes):
            f = chars_fst(cs.encodable())
            t = pynini.Fst()
            t.add_states(2)
            t.set_start(0)
            t.set_final(1)
            t.add_arc(0, pynini.Arc(tag + k, tag + k, ONE, 1))
            parts.append(f.concat(t))
        one_char = optimize(pynini.union(*parts), 10 ** 6)
        n = one_char.num_states()
        start = one_char.start()
        order = [start] + [s for s in range(n) if s != start]
        new = {s: i for i, s in enumerate(order)}
        self.nreader = n + 1  # last row: dead
        dead = n
        reader = np.full((n + 1, 256), dead, np.int64)
        complete = np.full(n + 1, -1, np.int64)
        for s in range(n):
            for arc in one_char.arcs(s):
                if arc.ilabel >= tag:
                    complete[new[s]] = arc.ilabel - tag
                else:
                    reader[new[s], arc.ilabel - 1] = new[arc.nextstate]
        complete[dead] = -2
        self.reader = reader
        self.complete = complete
        self.reader_start = 0

    def _intern(self, core: Core) -> int:
        cid = self.core_ids.get(core)
        if cid is None:
            if (len(self.cores) + 1) * self.nwords * self.nreader >= self.MAX_STATES:
                raise ModelError("the tokenizer's pre-tokenizer needs more states than relmql supports")
            cid = self.core_ids[core] = len(self.cores)
            self.cores.append(core)
            if cid >= len(self.table):
                grow = len(self.table)
                self.table = np.vstack([self.table, np.full((grow, self.nevents), _UNKNOWN, np.int64)])
                self.end_ok = np.concatenate([self.end_ok, np.zeros(grow, np.int8)])
        return cid

    def _core_step(self, cores: np.ndarray, events: np.ndarray) -> np.ndarray:
        out = self.table[cores, events]
        todo = out == _UNKNOWN
        if todo.any():
            for c, e in set(zip(cores[todo].tolist(), events[todo].tolist())):
                core = self.cores[c]
                if e == self.TB_OK or e == self.TB_BAD:
                    nxt = self.chunker.token_boundary(core, e == self.TB_OK)
                else:
                    nxt = self.chunker.feed(core, e)
                self.table[c, e] = REJECT if nxt is None else self._intern(nxt)
            out = self.table[cores, events]
        return out

    def step(self, states: np.ndarray, data: np.ndarray) -> np.ndarray:
        """The tracker states after one byte each (vectorized)."""
        states = np.asarray(states, np.int64)
        live = states >= 0
        cw, r = np.divmod(np.where(live, states, 0), self.nreader)
        core, w = np.divmod(cw, self.nwords)
        r2 = self.reader[r, data]
        k = self.complete[r2]
        done = k >= 0
        if done.any():
            core[done] = self._core_step(core[done], k[done])
            r2 = np.where(done, self.reader_start, r2)
        w2 = self.words[w, data]
        out = (core * self.nwords + w2) * self.nreader + r2
        out[~live | (k == -2) | (core < 0) | (w2 < 0)] = REJECT
        return out

    def boundary(self, states: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """The tracker states after a token boundary; ``ok``: BPE produces the pair there."""
        states = np.asarray(states, np.int64)
        ok = np.broadcast_to(np.asarray(ok, bool), states.shape)
        live = states >= 0
        cw, r = np.divmod(np.where(live, states, 0), self.nreader)
        core, w = np.divmod(cw, self.nwords)
        mid = r != self.reader_start
        at = live & ~mid
        out = states.copy()
        if at.any():
            ev = np.where(ok[at], self.TB_OK, self.TB_BAD)
            c2 = self._core_step(core[at], ev)
            out[at] = np.where(c2 < 0, REJECT, (c2 * self.nwords + w[at]) * self.nreader + self.reader_start)
        out[live & mid & ~ok] = REJECT  # inside one character: always inside one chunk
        return out

    def settled(self, state: int) -> bool:
        """Whether nothing read so far can still be contradicted: at a character boundary, with
        a hypothesis that owes nothing to the text that follows (``_Chunker.settled``), and no
        word begun. Any continuation is then fine."""
        cw, r = divmod(int(state), self.nreader)
        core, w = divmod(cw, self.nwords)
        if r != self.reader_start or w != 0:
            return False
        return self.chunker.settled(self.cores[core])

    def accepts_end(self, state: int) -> bool:
        """Whether the text may end in this tracker state."""
        if state < 0:
            return False
        cw, r = divmod(int(state), self.nreader)
        core = cw // self.nwords
        if r != self.reader_start:
            return False
        if self.end_ok[core] == 0:
            self.end_ok[core] = 1 if self.chunker.end(self.cores[core]) else 2
        return self.end_ok[core] == 1

    def walk(self, key: Tuple[str, int], compute) -> Tuple[np.ndarray, ...]:
        """The cached result of ``compute()`` (a tuple of arrays) for ``key``; the least recently
        used are dropped first past the walks' budget (bytes)."""
        got = self.walks.get(key)
        if got is None:
            got = compute()
            self.walks.put(key, got, sum(a.nbytes for a in got))
        return got

    def set_walk_budget(self, nbytes: int) -> None:
        """Keep at most about ``nbytes`` of walks (the automaton's share of a query's
        ``max_memory``: ``TokenAutomaton.set_cache_budget``)."""
        self.walks.budget, self.walks.keep = nbytes, 0  # a smaller budget may drop every walk
        self.walks.shrink()
        self.walks.keep = 1  # but the walk just computed stays


@functools.lru_cache(maxsize=8)
def tracker_for(rules: ChunkRules) -> Tracker:
    return Tracker(rules)
