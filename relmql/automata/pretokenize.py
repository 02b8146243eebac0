"""A byte-level, streaming model of a tokenizer's pre-tokenizer, for canonical tokenization.

Hugging Face byte-level BPE tokenizers first split text into chunks with a regular expression
(GPT-2's ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``),
then run BPE on each chunk alone. A token sequence is the tokenizer's own exactly when (1) every
chunk boundary is a token boundary and (2) inside each chunk every adjacent token pair is one
BPE produces (see ``bpe.py``).

Where a chunk ends can depend on text that comes later (``\\s+(?!\\S)`` looks ahead), so this
module decides chunk boundaries as the text streams in, remembering the undecided token
boundaries of the last few characters: whether each has a pair BPE would not produce (then it
must turn out to be a chunk boundary) — and rejecting as soon as a decision contradicts the
tokens. The chunker follows the split regex's semantics: at each chunk start the first
alternative (in order) that matches wins, with its longest match (for these patterns, what a
backtracking regex engine returns). Character classes (``\\p{L}``, ``\\p{N}``, ``\\s``) are read
from the tokenizer's own regex engine, so they agree with it for every code point.

The state machine is a lazily built DFA ("tracker") over events: the bytes of tokens, a token
boundary whose pair is (TB_OK) or is not (TB_BAD) one BPE produces, and the end of the text.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import numpy as np
import pynini

from ..cache import cached_json
from ..errors import ModelError
from ..models.vocab import SENTENCEPIECE, Vocabulary
from .charset import MAX_CP, CodepointSet
from .primitives import ONE, TAG, chars_fst, optimize

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

REJECT = -1
_UNKNOWN = -2


# ---------------------------------------------------------------- small DFAs over character classes


@dataclass(frozen=True, eq=False)
class Alternative:
    """One alternative of the split regex as a DFA over class ids (start state 0).

    ``not_before``: a negative look-ahead at the end (``(?!C)``): a match may not be followed by
    a character of these classes (the end of the text always satisfies it)."""
    delta: Tuple[Dict[int, int], ...]
    accepting: FrozenSet[int]
    not_before: Optional[FrozenSet[int]] = None


def _dfa(nfa_start: int, edges: Dict[int, List[Tuple[Optional[int], int]]], final: int) -> Tuple[tuple, frozenset]:
    """Subset construction for a tiny NFA (edges label None = epsilon)."""
    def closure(states):
        stack, seen = list(states), set(states)
        while stack:
            s = stack.pop()
            for lab, t in edges.get(s, ()):
                if lab is None and t not in seen:
                    seen.add(t)
                    stack.append(t)
        return frozenset(seen)
    start = closure([nfa_start])
    ids = {start: 0}
    todo = [start]
    delta: List[Dict[int, int]] = [{}]
    while todo:
        cur = todo.pop()
        moves: Dict[int, set] = {}
        for s in cur:
            for lab, t in edges.get(s, ()):
                if lab is not None:
                    moves.setdefault(lab, set()).add(t)
        for lab, targets in moves.items():
            nxt = closure(targets)
            if nxt not in ids:
                ids[nxt] = len(ids)
                delta.append({})
                todo.append(nxt)
            delta[ids[cur]][lab] = ids[nxt]
    accepting = frozenset(i for st, i in ids.items() if final in st)
    return tuple(delta), accepting


class _Nfa:
    """Thompson construction over class sets: each builder returns (start, end)."""

    def __init__(self):
        self.edges: Dict[int, List[Tuple[Optional[int], int]]] = {}
        self.n = 0

    def state(self) -> int:
        self.n += 1
        return self.n - 1

    def edge(self, a, lab, b):
        self.edges.setdefault(a, []).append((lab, b))

    def chars(self, classes):
        a, b = self.state(), self.state()
        for c in classes:
            self.edge(a, c, b)
        return a, b

    def cat(self, *parts):
        for (_, e1), (s2, _) in zip(parts, parts[1:]):
            self.edge(e1, None, s2)
        return parts[0][0], parts[-1][1]

    def alt(self, *parts):
        a, b = self.state(), self.state()
        for s, e in parts:
            self.edge(a, None, s)
            self.edge(e, None, b)
        return a, b

    def opt(self, part):
        s, e = part
        self.edge(s, None, e)
        return part

    def plus(self, part):
        s, e = part
        self.edge(e, None, s)
        return part


def _alternative(build, not_before=None) -> Alternative:
    nfa = _Nfa()
    s, e = build(nfa)
    delta, accepting = _dfa(s, nfa.edges, e)
    return Alternative(delta, accepting, None if not_before is None else frozenset(not_before))


@dataclass(frozen=True, eq=False)
class ChunkRules:
    """A pre-tokenizer: a partition of code points into classes, and ordered alternatives."""
    name: str
    classes: Tuple[CodepointSet, ...]
    alternatives: Tuple[Alternative, ...]


def _regex_classes(pattern: str) -> List[Tuple[int, int]]:
    """The code points matched by a one-character pattern in the tokenizers library's regex engine."""
    from tokenizers import Regex, pre_tokenizers
    cps = [c for c in range(MAX_CP + 1) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(map(chr, cps))
    gaps = pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(text)
    out, pos = [], 0
    for _, (s, e) in gaps:
        if s > pos:
            out.append((cps[pos], cps[s - 1]))
        pos = e
    if pos < len(text):
        out.append((cps[pos], cps[-1]))
    return out


def _engine_version() -> str:
    import tokenizers
    return tokenizers.__version__


@functools.lru_cache(maxsize=None)
def gpt2_rules() -> ChunkRules:
    """GPT-2's split regex, with its classes as the tokenizers library defines them."""
    key = f"pretok-classes-{_engine_version()}"
    found = cached_json(key, lambda: {p: _regex_classes(p) for p in (r"\p{L}", r"\p{N}", r"\s")})
    letters = CodepointSet(map(tuple, found[r"\p{L}"]))
    numbers = CodepointSet(map(tuple, found[r"\p{N}"]))
    spaces = CodepointSet(map(tuple, found[r"\s"]))
    special = "'strevmld"
    classes = [CodepointSet.of(ord(c)) for c in special]            # 0: ', 1..8: s t r e v m l d
    singles = CodepointSet.of(*map(ord, special))
    classes.append(letters.difference(singles))                      # 9: other letters
    classes.append(numbers.difference(letters))                      # 10: numbers
    classes.append(CodepointSet.of(0x20))                            # 11: space
    classes.append(spaces.difference(CodepointSet.of(0x20)).difference(letters).difference(numbers))  # 12
    used = CodepointSet()
    for c in classes:
        used = used.union(c)
    classes.append(used.complement())                                # 13: everything else
    APOS, SPACE, WS_OTHER, OTHER, NUM = 0, 11, 12, 13, 10
    L = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    O = [APOS, OTHER]
    WS = [SPACE, WS_OTHER]
    nonspace = [c for c in range(len(classes)) if c not in WS]
    letter = {ch: k for k, ch in enumerate(special)}

    def contraction(n: _Nfa):
        words = ["s", "t", "re", "ve", "m", "ll", "d"]
        return n.alt(*[n.cat(n.chars([APOS]), *[n.chars([letter[c]]) for c in w]) for w in words])

    alts = (
        _alternative(contraction),
        _alternative(lambda n: n.cat(n.opt(n.chars([SPACE])), n.plus(n.chars(L)))),
        _alternative(lambda n: n.cat(n.opt(n.chars([SPACE])), n.plus(n.chars([NUM])))),
        _alternative(lambda n: n.cat(n.opt(n.chars([SPACE])), n.plus(n.chars(O)))),
        _alternative(lambda n: n.plus(n.chars(WS)), not_before=nonspace),
        _alternative(lambda n: n.plus(n.chars(WS))),
    )
    return ChunkRules("gpt2", tuple(classes), alts)


@functools.lru_cache(maxsize=None)
def whole_text_rules() -> ChunkRules:
    """No pre-tokenizer: the whole text is one chunk."""
    return ChunkRules("none", (CodepointSet([(0, MAX_CP)]),),
                      (_alternative(lambda n: n.plus(n.chars([0]))),))


@functools.lru_cache(maxsize=None)
def run_rules(runs: Tuple[Tuple[int, int], ...]) -> ChunkRules:
    """Text split around runs of a repeated character: each ``(c, k)`` makes every run of code
    point ``c`` a chunk of at most ``k`` (longest first), as a tokenizer's added tokens ``c``,
    ``cc``, ... (``k`` of them, matched leftmost-longest before BPE) split it; the rest of the
    text between them is one chunk."""
    if not runs:
        return whole_text_rules()
    classes = [CodepointSet.of(c) for c, _ in runs]
    rest = CodepointSet.of(*(c for c, _ in runs)).complement()
    alts = [_alternative(lambda n, i=i, k=k: n.cat(n.chars([i]), *[n.opt(n.chars([i])) for _ in range(k - 1)]))
            for i, (_, k) in enumerate(runs)]
    alts.append(_alternative(lambda n: n.plus(n.chars([len(runs)]))))
    name = "runs-" + "-".join(f"{c:x}x{k}" for c, k in runs)
    return ChunkRules(name, tuple(classes) + (rest,), tuple(alts))


def added_runs(vocab: Vocabulary) -> Tuple[Tuple[Tuple[int, int], ...], Tuple[str, ...]]:
    """The tokenizer's added (non-special) tokens that split text before BPE: runs of one
    character (``\\n``, ``\\n\\n``, ... as ``(code point, longest)``) and the other strings."""
    texts = {a["content"] for a in vocab.spec.get("added_tokens", []) if not a.get("special") and a["content"]}
    runs, other = [], set(texts)
    for c in sorted({t[0] for t in texts if len(set(t)) == 1}):
        k = 0
        while c * (k + 1) in texts:
            k += 1
        if k:
            runs.append((ord(c), k))
            other -= {c * j for j in range(1, k + 1)}
    return tuple(runs), tuple(sorted(other))


_SP_NORMALIZERS = (  # what a SentencePiece-style tokenizer's normalizer may do: space → ▁, a ▁ in front
    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    {"type": "Prepend", "prepend": "\u2581"},
)


def rules_for(vocab: Vocabulary) -> ChunkRules:
    """The chunking rules of ``vocab``'s tokenizer, or ModelError when relmql cannot model them."""
    if vocab.kind == SENTENCEPIECE:
        return _sentencepiece_rules(vocab)
    if vocab.spec.get("normalizer"):
        raise ModelError("canonical tokenization is not supported for tokenizers with a normalizer "
                         f"({json.dumps(vocab.spec['normalizer'])[:80]})")
    pre = vocab.spec.get("pre_tokenizer")
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else ([pre] if pre else [])
    splits = []
    for step in steps:
        kind = step.get("type")
        if kind == "ByteLevel":
            if step.get("add_prefix_space"):
                raise ModelError("canonical tokenization does not support ByteLevel(add_prefix_space=True)")
            if step.get("use_regex", True):
                splits.append("gpt2")
        elif kind == "Split" and step.get("pattern", {}).get("Regex") == GPT2_PATTERN \
                and step.get("behavior") == "Isolated" and not step.get("invert"):
            splits.append("gpt2")
        else:
            raise ModelError(f"canonical tokenization does not support the pre-tokenizer {json.dumps(step)[:120]}")
    if not splits:
        return whole_text_rules()
    if len(splits) == 1:
        return gpt2_rules()
    raise ModelError("canonical tokenization does not support several splitting pre-tokenizers")


def _sentencepiece_rules(vocab: Vocabulary) -> ChunkRules:
    """SentencePiece-style BPE (Gemma, Llama-2, Mistral): the normalizer turns spaces into ▁ (and
    may put one in front, ``Vocabulary.prepend``); the whole text is one BPE chunk but for the
    added tokens, which are cut out first."""
    norm = vocab.spec.get("normalizer")
    steps = norm.get("normalizers", []) if norm and norm.get("type") == "Sequence" else ([norm] if norm else [])
    for step in steps:
        if step not in _SP_NORMALIZERS:
            raise ModelError(f"canonical tokenization does not support the normalizer {json.dumps(step)[:120]}")
    pre = vocab.spec.get("pre_tokenizer")
    # Gemma's Split on " " runs after the normalizer has turned every space into ▁: it never splits
    noop_split = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
    if pre and not (pre == noop_split and _SP_NORMALIZERS[0] in steps):
        raise ModelError(f"canonical tokenization does not support the pre-tokenizer {json.dumps(pre)[:120]}")
    return run_rules(added_runs(vocab)[0])


# ---------------------------------------------------------------- the chunker core (pure Python)

# Core = (alts, acc, look, buf, origin_decided, pending)
#   alts[i]: DFA state of alternative i on the text since the origin (-1: dead)
#   acc[i]:  the longest confirmed match of alternative i, in characters from the origin (-1: none)
#   look[i]: alternative i matches the whole buffer, waiting for the next character's look-ahead
#   buf:     classes of the characters since the origin
#   origin_decided: whether the origin is a decided chunk boundary
#   pending: ((position, pair_ok), ...) token boundaries at undecided positions
Core = tuple


class _Chunker:
    def __init__(self, rules: ChunkRules):
        self.alts = rules.alternatives
        n = len(self.alts)
        self.fresh_alts = (0,) * n
        self.none = (-1,) * n
        self.no_look = (False,) * n

    def fresh(self, pending=()) -> Core:
        return (self.fresh_alts, self.none, self.no_look, (), True, tuple(pending))

    def feed(self, core: Core, k: int) -> Optional[Core]:
        alts, acc, look, buf, od, pend = core
        n = len(buf)
        na, nc, nl = [], [], []
        for i, alt in enumerate(self.alts):
            a, c, l = alts[i], acc[i], look[i]
            if l and k not in alt.not_before:
                c = n
            l = False
            if a >= 0:
                a = alt.delta[a].get(k, -1)
                if a >= 0 and a in alt.accepting:
                    if alt.not_before is not None:
                        l = True
                    else:
                        c = n + 1
            na.append(a)
            nc.append(c)
            nl.append(l)
        return self.resolve((tuple(na), tuple(nc), tuple(nl), buf + (k,), od, pend))

    def token_boundary(self, core: Core, ok: bool) -> Core:
        alts, acc, look, buf, od, pend = core
        if not buf and od:
            return core  # at a decided chunk boundary: nothing to check
        return (alts, acc, look, buf, od, pend + ((len(buf), ok),))

    def end(self, core: Optional[Core]) -> bool:
        """Whether the text may end here."""
        while core is not None:
            alts, acc, look, buf, od, pend = core
            if not buf:
                return True
            n = len(buf)
            acc = tuple(n if l else c for c, l in zip(acc, look))  # the end satisfies (?!...)
            if not pend or pend[-1][0] != n:
                pend = pend + ((n, True),)  # the end of the text is a token boundary
            # nothing more can match: decide; characters read past the chunk start a new one
            core = self.resolve((self.none, acc, self.no_look, buf, od, pend))
        return False

    def resolve(self, core: Core) -> Optional[Core]:
        while True:
            alts, acc, look, buf, od, pend = core
            winner = None
            for i in range(len(alts)):
                if acc[i] >= 0:
                    winner = i
                    break
                if alts[i] >= 0 or look[i]:
                    return core  # a higher-priority alternative may still match
            if winner is None:
                if not buf:
                    return core
                winner, acc = 0, (1,) + acc[1:]  # no alternative matches: the character alone
            if alts[winner] >= 0 or look[winner]:
                return self._rebase(core, winner)
            core = self._decide(core, acc[winner])
            if core is None:
                return None

    def _rebase(self, core: Core, w: int) -> Optional[Core]:
        """The winner is known and still growing: everything before its last match is inside the chunk."""
        alts, acc, look, buf, od, pend = core
        a = acc[w]
        others_dead = all(x < 0 for i, x in enumerate(alts) if i != w) and not any(
            l for i, l in enumerate(look) if i != w)
        if a == 0 and others_dead:
            return core
        kept = []
        for pos, ok in pend:
            if pos < a and (pos > 0 or not od):
                if not ok:
                    return None  # a pair BPE never produces, inside a chunk
            elif pos >= a:
                kept.append((pos - a, ok))
        na = tuple(x if i == w else -1 for i, x in enumerate(alts))
        nc = tuple(0 if i == w else -1 for i in range(len(alts)))
        nl = tuple(l if i == w else False for i, l in enumerate(look))
        return (na, nc, nl, buf[a:], od if a == 0 else False, tuple(kept))

    def _decide(self, core: Core, length: int) -> Optional[Core]:
        """The chunk from the origin has ``length`` characters: check the token boundaries and
        start the next chunk with the characters read past it."""
        alts, acc, look, buf, od, pend = core
        boundary = False
        kept = []
        for pos, ok in pend:
            if pos < length and (pos > 0 or not od):
                if not ok:
                    return None
            elif pos == length:
                boundary = True
            elif pos > length:
                kept.append((pos - length, ok))
        if not boundary and not (length == 0 and od):
            return None  # a token runs across the chunk boundary
        nxt = self.fresh(kept)
        for k in buf[length:]:
            nxt = self.feed(nxt, k)
            if nxt is None:
                return None
        return nxt


# ---------------------------------------------------------------- the tracker DFA


class Tracker:
    """The canonical-tokenization tracker as a lazily filled DFA over numpy tables.

    A tracker state packs (chunker core id, UTF-8 reader state). Events: bytes (0-255) via
    ``step``, token boundaries via ``boundary`` and the end of the text via ``accepts_end``.
    ``REJECT`` (-1) is the dead state.
    """

    MAX_STATES = 1 << 24  # tracker ids must fit the bits tokens.py packs them into

    def __init__(self, rules: ChunkRules):
        self.chunker = _Chunker(rules)
        self._build_reader(rules.classes)
        self.cores: List[Core] = []
        self.core_ids: Dict[Core, int] = {}
        self.nevents = len(rules.classes) + 2  # classes, TB_OK, TB_BAD
        self.TB_OK, self.TB_BAD = len(rules.classes), len(rules.classes) + 1
        self.table = np.full((64, self.nevents), _UNKNOWN, np.int64)
        # (vocabulary, state) -> tracker state after each token: a bounded LRU
        self.walks: "OrderedDict[Tuple[str, int], np.ndarray]" = OrderedDict()
        self.max_walks = 256
        self.end_ok = np.zeros(64, np.int8)  # 0 unknown, 1 yes, 2 no
        self.start = self._intern(self.chunker.fresh()) * self.nreader + self.reader_start

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
            if (len(self.cores) + 1) * self.nreader >= self.MAX_STATES:
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
        core, r = np.divmod(np.where(live, states, 0), self.nreader)
        r2 = self.reader[r, data]
        k = self.complete[r2]
        done = k >= 0
        if done.any():
            core = core.copy()
            core[done] = self._core_step(core[done], k[done])
            r2 = np.where(done, self.reader_start, r2)
        out = core * self.nreader + r2
        out[~live | (k == -2) | (core < 0)] = REJECT
        return out

    def boundary(self, states: np.ndarray, ok: np.ndarray) -> np.ndarray:
        """The tracker states after a token boundary; ``ok``: BPE produces the pair there."""
        states = np.asarray(states, np.int64)
        ok = np.broadcast_to(np.asarray(ok, bool), states.shape)
        live = states >= 0
        core, r = np.divmod(np.where(live, states, 0), self.nreader)
        mid = r != self.reader_start
        at = live & ~mid
        out = states.copy()
        if at.any():
            ev = np.where(ok[at], self.TB_OK, self.TB_BAD)
            c2 = self._core_step(core[at], ev)
            out[at] = np.where(c2 < 0, REJECT, c2 * self.nreader + self.reader_start)
        out[live & mid & ~ok] = REJECT  # inside one character: always inside one chunk
        return out

    def settled(self, state: int) -> bool:
        """Whether nothing read so far can still be contradicted: at a character boundary, no
        character read past the last point where the chunk may end, and no token boundary that
        must turn out to be a chunk boundary. Any continuation is then fine."""
        core, r = divmod(int(state), self.nreader)
        if r != self.reader_start:
            return False
        _, _, _, buf, _, pend = self.cores[core]
        return not buf and all(ok for _, ok in pend)

    def accepts_end(self, state: int) -> bool:
        """Whether the text may end in this tracker state."""
        if state < 0:
            return False
        core, r = divmod(int(state), self.nreader)
        if r != self.reader_start:
            return False
        if self.end_ok[core] == 0:
            self.end_ok[core] = 1 if self.chunker.end(self.cores[core]) else 2
        return self.end_ok[core] == 1

    def walk(self, key: Tuple[str, int], compute) -> np.ndarray:
        """The cached result of ``compute()`` for ``key`` (least recently used dropped first)."""
        got = self.walks.get(key)
        if got is None:
            got = compute()
            self.walks[key] = got
            if len(self.walks) > self.max_walks:
                self.walks.popitem(last=False)
        else:
            self.walks.move_to_end(key)
        return got


@functools.lru_cache(maxsize=8)
def tracker_for(rules: ChunkRules) -> Tracker:
    return Tracker(rules)
