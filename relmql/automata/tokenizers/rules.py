"""Chunking rules: a pre-tokenizer as ordered alternatives, each a small DFA over classes of code
points, with the texts the tokenizer cuts out first. Design: docs/tokenizers.md."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Tuple

from ..charset import MAX_CP, CodepointSet

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@dataclass(frozen=True, eq=False)
class Alternative:
    """One alternative of the split regex as a DFA over class ids (start state 0).

    ``not_before``: a negative look-ahead at the end (``(?!C)``): a match may not be followed by
    a character of these classes (the end of the text always satisfies it)."""
    delta: Tuple[Dict[int, int], ...]  # per state: class id -> next state
    accepting: FrozenSet[int]  # the states after a match (or, with a look-ahead, one to confirm)
    not_before: Optional[FrozenSet[int]] = None  # the classes a match may not be followed by (``(?!C)``)


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
    """A pre-tokenizer: a partition of code points into classes, and ordered alternatives; and
    ``words``, the texts the tokenizer cuts out before it (its added and special tokens, UTF-8),
    which are never part of a chunk's text (``with_words``)."""
    name: str  # for messages and cache keys ("gpt2", "split-<hash>", "runs-...", "none")
    classes: Tuple[CodepointSet, ...]  # the partition of the code points; class ids index it
    alternatives: Tuple[Alternative, ...]  # in the engine's order: the first that matches wins
    words: Tuple[bytes, ...] = ()  # texts cut out before the pre-tokenizer (sorted), never in a chunk


def with_words(rules: ChunkRules, words: Tuple[bytes, ...]) -> ChunkRules:
    """``rules`` with ``words`` cut out of the text first. The words must not overlap
    (``nonoverlapping``): then the tokenizer's leftmost-longest scan cuts out every occurrence,
    and a chunk's text is exactly a text that contains none."""
    if not words:
        return rules
    return ChunkRules(f"{rules.name}+{len(words)}-words", rules.classes, rules.alternatives, tuple(sorted(words)))


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

