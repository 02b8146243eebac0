"""A byte-level, streaming model of a tokenizer's pre-tokenizer, for canonical tokenization.

Hugging Face byte-level BPE tokenizers first split text into chunks with a regular expression
(GPT-2's ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``;
Llama 3's, Qwen2's and others' in a ``Split`` pre-tokenizer), then run BPE on each chunk alone.
A token sequence is the tokenizer's own exactly when (1) every chunk boundary is a token
boundary and (2) inside each chunk every adjacent token pair is one BPE produces (see ``bpe.py``).

The tokenizer's split regex is compiled (``split_rules``) into ordered alternatives, each a
small DFA over classes of code points that follows the backtracking engine's choice of match
(leftmost-first); the classes refine every one-character piece of the pattern (``\\p{L}``,
``[^\\r\\n\\p{L}\\p{N}]``, ``(?i:s)``, ...), each read from the tokenizer's own regex engine, so
they agree with it for every code point. The engine splits at each chunk start with the first
alternative that matches, and its match.

Where a chunk ends can depend on text that comes later (``\\s+(?!\\S)`` looks one character
ahead; Llama 3's ``\\s*[\\r\\n]+`` as far as a run of spaces goes), so the chunker keeps a set of
hypotheses as the text streams in: each guesses the winning alternative of the current chunk
and where chunks end (only at token boundaries, always at one whose pair BPE would not
produce), and carries what the text that follows must still confirm — rejecting when no
hypothesis is left.

The state machine is a lazily built DFA ("tracker") over events: the bytes of tokens, a token
boundary whose pair is (TB_OK) or is not (TB_BAD) one BPE produces, and the end of the text.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
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
    """A pre-tokenizer: a partition of code points into classes, and ordered alternatives; and
    ``words``, the texts the tokenizer cuts out before it (its added and special tokens, UTF-8),
    which are never part of a chunk's text (``with_words``)."""
    name: str
    classes: Tuple[CodepointSet, ...]
    alternatives: Tuple[Alternative, ...]
    words: Tuple[bytes, ...] = ()


def with_words(rules: ChunkRules, words: Tuple[bytes, ...]) -> ChunkRules:
    """``rules`` with ``words`` cut out of the text first. The words must not overlap
    (``nonoverlapping``): then the tokenizer's leftmost-longest scan cuts out every occurrence,
    and a chunk's text is exactly a text that contains none."""
    if not words:
        return rules
    return ChunkRules(f"{rules.name}+{len(words)}-words", rules.classes, rules.alternatives, tuple(sorted(words)))


class WordScanner:
    """The texts that contain none of ``words`` (byte strings, none of them empty), as a minimal
    DFA over bytes: ``delta[state, byte]`` is the next state, -1 once a word has been read in
    full; the start is 0. ``overlap`` names two words whose occurrences can overlap (a word
    inside another, or a word's end the beginning of a word, itself included), or is None.

    Built as an Aho-Corasick automaton over the trie of the words (in classes of the bytes they
    use), then minimized by partition refinement: Gemma 3's 6,322 added and special tokens make
    a trie of tens of thousands of nodes and a scanner of a few hundred states."""

    def __init__(self, words: Tuple[bytes, ...]):
        used = sorted({b for w in words for b in w})
        byte_class = np.zeros(256, np.int64)
        byte_class[used] = np.arange(1, len(used) + 1)
        nclass = len(used) + 1
        children: List[Dict[int, int]] = [{}]
        ends: List[int] = []
        paths: List[List[int]] = []
        for w in words:
            v, path = 0, []
            for c in byte_class[np.frombuffer(w, np.uint8)].tolist():
                u = children[v].get(c)
                if u is None:
                    u = children[v][c] = len(children)
                    children.append({})
                path.append(u)
                v = u
            ends.append(v)
            paths.append(path)
        n = len(children)
        goto = np.zeros((n, nclass), np.int64)
        fail = np.zeros(n, np.int64)
        hit = np.zeros(n, bool)
        hit[ends] = True
        order = [0]
        for v in order:  # breadth first: fail[v] is shallower than v, its row already complete
            if v:
                goto[v] = goto[fail[v]]
                hit[v] |= hit[fail[v]]
            for c, u in children[v].items():
                fail[u] = goto[fail[v], c] if v else 0
                goto[v, c] = u
                order.append(u)
        self.overlap: Optional[Tuple[bytes, bytes]] = None
        for w, path in zip(words, paths):
            if fail[path[-1]] or hit[path[:-1]].any():
                other = next(x for x in words if (x != w and x in w)
                             or any(w.endswith(x[:k]) for k in range(1, min(len(w), len(x)))))
                self.overlap = (w, other)
                break
        # minimize by partition refinement over the nodes that have read no word (the start
        # first): equivalent when the same classes lead to equivalent nodes or to a word's end
        live = np.flatnonzero(~hit)
        index = np.full(n, -1, np.int64)
        index[live] = np.arange(len(live))
        target = np.where(hit[goto[live]], -1, index[goto[live]])
        block, nblocks = np.zeros(len(live), np.int64), 1
        while True:
            sig = np.concatenate([block[:, None], np.where(target >= 0, block[target], -1)], axis=1)
            _, new = np.unique(sig, axis=0, return_inverse=True)
            new = new.reshape(-1)
            if new.max() + 1 == nblocks:
                break
            block, nblocks = new, int(new.max()) + 1
        rename = np.empty(nblocks, np.int64)
        order_of = np.argsort(np.unique(block, return_index=True)[1])  # blocks by first node: the start's first
        rename[order_of] = np.arange(nblocks)
        rep = np.zeros(nblocks, np.int64)
        rep[block] = np.arange(len(live))
        table = np.where(target[rep] >= 0, rename[block[target[rep]]], -1)
        self.delta = np.empty((nblocks, 256), np.int64)
        self.delta[rename] = table[:, byte_class]
        self.num_states = nblocks


@functools.lru_cache(maxsize=8)
def word_scanner(words: Tuple[bytes, ...]) -> WordScanner:
    return WordScanner(words)


def _regex_classes(pattern: str, cps: Optional[Sequence[int]] = None) -> List[Tuple[int, int]]:
    """The code points (of the increasing ``cps``; default: all) matched by a one-character
    pattern in the tokenizers library's regex engine, as ranges (which may span code points
    not in ``cps``, surrogates for all)."""
    from tokenizers import Regex, pre_tokenizers
    every = cps is None
    if every:
        cps = [c for c in range(MAX_CP + 1) if not 0xD800 <= c <= 0xDFFF]
    gaps = pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str("".join(map(chr, cps)))
    out: List[Tuple[int, int]] = []
    pos = 0
    for _, (s, e) in gaps + [("", (len(cps), len(cps)))]:
        if s > pos:  # cps[pos:s] matched
            out.extend([(cps[pos], cps[s - 1])] if every else [(c, c) for c in cps[pos:s]])
        pos = e
    return out


def _engine_version() -> str:
    import tokenizers
    return tokenizers.__version__


# ---------------------------------------------------------------- the tokenizer's own split regex
#
# A Split pre-tokenizer's regex is compiled into ChunkRules: one Alternative per top-level
# alternative, over a partition of the code points into classes that refines every
# one-character piece of the pattern (each read from the tokenizers library's regex engine).
# Each alternative's DFA follows a backtracking engine's choice of match (leftmost-first, as RE2
# simulates it): a state is the priority-ordered list of NFA threads, and a match drops the
# threads after it, so the last match seen is the one the engine returns.

_ENCODABLE = CodepointSet([(0, 0xD7FF), (0xE000, MAX_CP)])
_MAX_REPEAT = 64  # {m,n} with larger bounds is not expanded
_CHAR, _SPLIT, _MATCH, _LOOK = range(4)


class _Unsupported(Exception):
    """A construct of a split regex that relmql does not model (the message says which)."""


class _SplitParser:
    """Parses the supported subset of Oniguruma's (Ruby) syntax into a small tree:
    ``("atom", k)`` (``k`` indexes ``atoms``: one-character patterns as the engine reads them),
    ``("cat", items)``, ``("alt", branches)``, ``("rep", node, lo, hi, greedy)`` (``hi`` None:
    unbounded) and, last in a top-level alternative only, ``("look", k)`` for ``(?!C)``."""

    def __init__(self, pattern: str):
        self.p = pattern
        self.i = 0
        self.atoms: List[str] = []
        self.literal: Dict[int, str] = {}  # atom -> its character, for literals

    def fail(self, what: str):
        raise _Unsupported(f"{what} (at offset {self.i})")

    def peek(self, s: str) -> bool:
        return self.p.startswith(s, self.i)

    def closing(self, j: int) -> int:
        """Just past the '}' of the escape ``\\p{..}`` or ``\\x{..}`` at ``j``."""
        end = self.p.find("}", j)
        if end < 0:
            self.fail("an unclosed escape")
        return end + 1

    def branches(self) -> List[Tuple[tuple, Optional[int]]]:
        """The top-level alternatives, each with the atom of its trailing look-ahead (or None)."""
        ci = False
        if self.peek("(?i)"):  # only at the start: elsewhere Oniguruma applies it up to the end of the group
            ci, self.i = True, 4
        out = []
        while True:
            items = self.seq(ci, top=True)
            look = items.pop()[1] if items and items[-1][0] == "look" else None
            out.append((("cat", items), look))
            if self.i == len(self.p):
                return out
            if self.p[self.i] == ")":
                self.fail("an unmatched ')'")
            self.i += 1  # '|'

    def alt(self, ci: bool) -> tuple:
        branches = [("cat", self.seq(ci, top=False))]
        while self.peek("|"):
            self.i += 1
            branches.append(("cat", self.seq(ci, top=False)))
        if not self.peek(")"):
            self.fail("an unclosed group")
        self.i += 1
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def seq(self, ci: bool, top: bool) -> list:
        items: list = []
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            if items and items[-1][0] == "look":
                self.fail("a look-ahead that does not end its alternative")
            item = self.item(ci)
            if item[0] == "look" and not top:
                self.fail("a look-ahead inside a group")
            items.append(item)
        return items

    def item(self, ci: bool) -> tuple:
        node = self.atom(ci)
        if self.i == len(self.p) or self.p[self.i] not in "?*+{":
            return node
        if node[0] == "look":
            self.fail("a repeated look-ahead")
        if ci:
            self.fail("a repetition under (?i)")
        greedy = True
        if self.p[self.i] == "{":
            m = re.compile(r"\{(\d*)(,?)(\d*)\}").match(self.p, self.i)
            if not m or not (m.group(1) or m.group(2) and m.group(3)):
                self.fail("a '{' that is not a repetition")
            lo = int(m.group(1) or 0)
            hi = lo if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
            self.i = m.end()
            if self.peek("?") and m.group(2):
                greedy = False
                self.i += 1
            elif self.i < len(self.p) and self.p[self.i] in "?+":  # {n}? and {m,n}+: not lazy, possessive
                self.fail("a quantifier after {m,n}")
        else:
            lo, hi = {"?": (0, 1), "*": (0, None), "+": (1, None)}[self.p[self.i]]
            self.i += 1
            if self.peek("?"):
                greedy = False
                self.i += 1
            elif self.peek("+"):
                self.fail("a possessive quantifier")
        if self.i < len(self.p) and self.p[self.i] in "?*+{":
            self.fail("a repeated quantifier")
        if (hi is not None and (hi < lo or hi == 0)) or lo > _MAX_REPEAT or (hi or 0) > _MAX_REPEAT:
            self.fail(f"the repetition {{{lo},{'' if hi is None else hi}}}")
        if (hi is None or hi > 1) and _nullable(node):
            self.fail("a repetition of something that can match nothing")
        return ("rep", node, lo, hi, greedy)

    def atom(self, ci: bool) -> tuple:
        p, c = self.p, self.p[self.i]
        if c == "(":
            for opener, flag in (("(?:", ci), ("(?i:", True), ("(?-i:", False)):
                if self.peek(opener):
                    self.i += len(opener)
                    return self.alt(flag)
            if self.peek("(?!"):
                self.i += 3
                inner = self.alt(ci)
                while inner[0] == "cat" and len(inner[1]) == 1:
                    inner = inner[1][0]
                if inner[0] != "atom":
                    self.fail("a look-ahead of more than one character")
                return ("look", inner[1])
            if self.peek("(?"):
                self.fail(f"the group {p[self.i:self.i + 4]!r}")
            self.i += 1  # a capturing group: the same match
            return self.alt(ci)
        start = self.i
        literal = None
        if c == "[":
            j = self.i + 1 + self.peek("[^")
            j += p.startswith("]", j)
            depth = 1
            while j < len(p):
                if p[j] == "\\":
                    j = self.closing(j) if p[j + 1:j + 2] in ("p", "P", "x") and p[j + 2:j + 3] == "{" else j + 2
                    continue
                depth += {"[": 1, "]": -1}.get(p[j], 0)
                j += 1
                if depth == 0:
                    break
            if depth:
                self.fail("an unclosed character class")
            self.i = j
        elif c == "\\":
            e = p[self.i + 1:self.i + 2]
            if e in ("p", "P", "x") and p[self.i + 2:self.i + 3] == "{":
                self.i = self.closing(self.i)
            elif e == "x":
                self.i += 4
            elif e == "u":
                self.i += 6
            elif e and e in "sSdDwWhHtnrfvae":
                self.i += 2
            elif e and e.isascii() and not e.isalnum():
                self.i += 2
                literal = e
            else:
                self.fail(f"the escape \\{e}")
        elif c in "^$":
            self.fail("an anchor")
        elif c in "?*+{":
            self.fail("a quantifier with nothing to repeat")
        else:
            self.i += 1
            literal = c if c != "." else None
        source = p[start:self.i]
        if ci:
            if literal is None:
                self.fail("a class or an escape under (?i)")
            if max(len(literal.casefold()), len(literal.lower()), len(literal.upper())) > 1:
                self.fail(f"{literal!r} under (?i), whose case folding has several characters")
            source = f"(?i:{source})"
        if source not in self.atoms:
            self.atoms.append(source)
        k = self.atoms.index(source)
        if literal is not None:
            self.literal[k] = literal
        return ("atom", k)


def _nullable(node: tuple) -> bool:
    kind = node[0]
    if kind == "atom":
        return False
    if kind == "cat":
        return all(_nullable(x) for x in node[1])
    if kind == "alt":
        return any(_nullable(x) for x in node[1])
    return node[2] == 0 or _nullable(node[1])  # rep


class _PriorityNfa:
    """An NFA whose epsilon moves are ordered by priority (a backtracking engine's order)."""

    def __init__(self):
        self.kind: List[int] = []
        self.arg: List[int] = []
        self.next: List[List[int]] = []

    def add(self, kind: int, nxt: List[int], arg: int = -1) -> int:
        self.kind.append(kind)
        self.arg.append(arg)
        self.next.append(nxt)
        return len(self.kind) - 1

    def build(self, node: tuple, nxt: int) -> int:
        """The start of ``node``, continuing to ``nxt``."""
        kind = node[0]
        if kind == "atom":
            return self.add(_CHAR, [nxt], node[1])
        if kind == "cat":
            for item in reversed(node[1]):
                nxt = self.build(item, nxt)
            return nxt
        if kind == "alt":
            return self.add(_SPLIT, [self.build(b, nxt) for b in node[1]])
        _, body, lo, hi, greedy = node
        tail = nxt
        if hi is None:
            tail = self.add(_SPLIT, [])
            again = self.build(body, tail)
            self.next[tail] = [again, nxt] if greedy else [nxt, again]
        else:
            for _ in range(hi - lo):  # X{0,2} = (X(X)?)?
                again = self.build(body, tail)
                tail = self.add(_SPLIT, [again, nxt] if greedy else [nxt, again])
        for _ in range(lo):
            tail = self.build(body, tail)
        return tail

    def closure(self, starts: Sequence[int]) -> Tuple[Tuple[int, ...], bool]:
        """The threads reached from ``starts`` in priority order (character and look-ahead
        states), and whether a match was reached (which drops the threads after it)."""
        out: List[int] = []
        seen = set()
        matched = False
        stack = list(reversed(starts))
        while stack and not matched:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            k = self.kind[s]
            if k == _SPLIT:
                stack.extend(reversed(self.next[s]))
            elif k == _MATCH:
                matched = True
            else:
                out.append(s)
        return tuple(out), matched

    def case_folded_runs(self, literal: Dict[int, str]) -> List[str]:
        """Strings of 2 or 3 case-insensitive literal characters that may match one after another."""
        def after(s):  # the character states right after state s
            out, stack, seen = [], list(self.next[s]), set()
            while stack:
                t = stack.pop()
                if t not in seen:
                    seen.add(t)
                    if self.kind[t] == _SPLIT:
                        stack.extend(self.next[t])
                    elif self.kind[t] == _CHAR:
                        out.append(t)
            return out
        runs = set()
        for s in range(len(self.kind)):
            if self.kind[s] == _CHAR and self.arg[s] in literal:
                for t in after(s):
                    if self.arg[t] in literal:
                        two = literal[self.arg[s]] + literal[self.arg[t]]
                        runs.add(two)
                        runs.update(two + literal[self.arg[u]] for u in after(t) if self.arg[u] in literal)
        return sorted(runs)


def _leftmost_first(nfa: _PriorityNfa, start: int, char_classes: Dict[int, FrozenSet[int]],
                    look: Optional[FrozenSet[int]], nclasses: int) -> Alternative:
    """The DFA of one alternative over class ids: a state is (ordered threads, matched); its
    accepting states are those with a match, or, with a look-ahead, those with the look-ahead
    thread (confirmed by the next character, which then drops the threads after it)."""
    first = nfa.closure([start])
    ids = {first: 0}
    todo = [first]
    delta: List[Dict[int, int]] = [{}]
    while todo:
        cur = todo.pop()
        threads, _ = cur
        for k in range(nclasses):
            moved = []
            for t in threads:
                if nfa.kind[t] == _LOOK:
                    if k not in look:
                        break  # the match before k is confirmed: the threads after it are dropped
                    continue
                if k in char_classes[nfa.arg[t]]:
                    moved.append(nfa.next[t][0])
            nxt = nfa.closure(moved)
            if not nxt[0] and not nxt[1]:
                continue
            if nxt not in ids:
                ids[nxt] = len(ids)
                delta.append({})
                todo.append(nxt)
            delta[ids[cur]][k] = ids[nxt]
    if look is None:
        accepting = frozenset(i for (_, matched), i in ids.items() if matched)
    else:
        accepting = frozenset(i for (threads, _), i in ids.items() if any(nfa.kind[t] == _LOOK for t in threads))
    return Alternative(tuple(delta), accepting, look)


def _atom_codepoints(atoms: Sequence[str], literal: Dict[int, str]) -> List[CodepointSet]:
    """The code points each one-character pattern matches in the tokenizer's regex engine
    (cached). A plain literal matches itself; the few characters of the case-insensitive literals
    are found with one scan of every code point for them all."""
    found: Dict[str, List[int]] = {}

    def case_insensitive(source: str) -> List[Tuple[int, int]]:
        if "all" not in found:
            union = _regex_classes("|".join(a for a in atoms if a.startswith("(?i:")))
            found["all"] = [c for lo, hi in union for c in range(lo, hi + 1)]
        return _regex_classes(source, found["all"])

    out = []
    for k, source in enumerate(atoms):
        if k in literal and not source.startswith("(?i:"):
            out.append(CodepointSet.of(ord(literal[k])))
            continue
        digest = hashlib.sha1(source.encode()).hexdigest()[:20]
        build = (lambda s=source: case_insensitive(s)) if k in literal else (lambda s=source: _regex_classes(s))
        ranges = cached_json(f"pretok-class-{_engine_version()}-{digest}", build,
                             versions=f"pretok-class-*-{digest}.json")
        out.append(CodepointSet(map(tuple, ranges)).intersection(_ENCODABLE))
    return out


@functools.lru_cache(maxsize=None)
def _folding_to_several() -> Tuple[str, ...]:
    """The characters whose case folding or case mapping has several characters (ß, ﬁ, ŉ)."""
    return tuple(chr(c) for c in range(MAX_CP + 1) if not 0xD800 <= c <= 0xDFFF
                 and max(len(chr(c).casefold()), len(chr(c).lower()), len(chr(c).upper())) > 1)


def _multi_char_folds(runs: Sequence[str]) -> List[Tuple[str, str]]:
    """(run, character) pairs where the engine matches one character to a run under (?i) (ß: ss)."""
    if not runs:
        return []
    from tokenizers import Regex, pre_tokenizers
    folds = _folding_to_several()
    text = "\x00".join(folds)
    out = []
    for run in runs:
        source = "(?i:" + "".join(c if c.isascii() and c.isalnum() else "\\x{%x}" % ord(c) for c in run) + ")"
        for piece, _ in pre_tokenizers.Split(Regex(source), behavior="isolated").pre_tokenize_str(text):
            if piece in folds:
                out.append((run, piece))
    return out


@functools.lru_cache(maxsize=None)
def split_rules(pattern: str) -> ChunkRules:
    """The chunking rules of a Split pre-tokenizer (behavior Isolated) with this regex.

    Raises ModelError for what relmql does not model: constructs outside the subset (top-level
    alternatives, groups ``(?:)`` ``(?i:)`` ``()``, nested alternatives, one-character atoms —
    literals, ``[...]`` classes, ``\\p{..}``, ``\\s``, ``\\S``, ``\\d``, ``.`` and the like —,
    the quantifiers ``? * + {m,n}`` greedy or lazy, and one ``(?!C)`` ending a top-level
    alternative), an alternative that can match nothing, and text no alternative matches
    (the engine would leave it between matches, as a chunk of its own)."""
    try:
        parser = _SplitParser(pattern)
        branches = parser.branches()
        # consecutive alternatives without a look-ahead are one leftmost-first DFA (the first
        # that matches wins either way); one with a look-ahead is an alternative of its own
        groups: List[Tuple[List[tuple], Optional[int]]] = []
        for node, look in branches:
            if _nullable(node):
                raise _Unsupported("an alternative that matches the empty string")
            if look is None and groups and groups[-1][1] is None:
                groups[-1][0].append(node)
            else:
                groups.append(([node], look))
        nfa = _PriorityNfa()
        starts = []
        for nodes, look in groups:
            end = nfa.add(_MATCH, [])
            if look is not None:
                end = nfa.add(_LOOK, [end], look)
            starts.append(nfa.build(("alt", nodes), end))
        case_insensitive = {k: c for k, c in parser.literal.items() if parser.atoms[k].startswith("(?i:")}
        folds = _multi_char_folds(nfa.case_folded_runs(case_insensitive))
        if folds:
            raise _Unsupported("(?i) matches {!r} to the one character {!r}".format(*folds[0]))
        sets = _atom_codepoints(parser.atoms, parser.literal)
        classes = [_ENCODABLE]
        for cs in sets:
            classes = [part for c in classes for part in (c.intersection(cs), c.difference(cs)) if part]
        member = [frozenset(k for k, c in enumerate(classes) if c.intersection(cs)) for cs in sets]
        char_classes = dict(enumerate(member))
        alts = tuple(_leftmost_first(nfa, st, char_classes, None if look is None else member[look], len(classes))
                     for st, (_, look) in zip(starts, groups))
        for k in range(len(classes)):
            if not any(a.not_before is None and a.delta[0].get(k, -1) in a.accepting for a in alts):
                raise _Unsupported(f"no alternative matches the character {chr(next(classes[k].codepoints()))!r} "
                                   "alone (text between matches is not modelled)")
    except _Unsupported as e:
        raise ModelError(f"canonical tokenization does not support the split regex {pattern!r}: {e}") from None
    name = "gpt2" if pattern == GPT2_PATTERN else "split-" + hashlib.sha1(pattern.encode()).hexdigest()[:12]
    return ChunkRules(name, tuple(classes), alts)


@functools.lru_cache(maxsize=None)
def gpt2_rules() -> ChunkRules:
    """GPT-2's split regex, with its classes as the tokenizers library defines them."""
    return split_rules(GPT2_PATTERN)


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


def added_words(vocab: Vocabulary) -> Tuple[Tuple[bytes, ...], Tuple[int, ...]]:
    """The texts (UTF-8) and ids of the added and special tokens the tokenizer cuts out of the
    text before it pre-tokenizes, but for the runs of one character ``added_runs`` models for a
    SentencePiece-style tokenizer."""
    runs = {chr(c) * k for c, most in added_runs(vocab)[0] for k in range(1, most + 1)} \
        if vocab.kind == SENTENCEPIECE else set()
    pairs = sorted((a["content"].encode("utf-8"), a["id"]) for a in vocab.spec.get("added_tokens", [])
                   if a["content"] and a["content"] not in runs)
    return tuple(w for w, _ in pairs), tuple(i for _, i in pairs)


@functools.lru_cache(maxsize=8)
def rules_for(vocab: Vocabulary) -> ChunkRules:
    """The chunking rules of ``vocab``'s tokenizer, or ModelError when relmql cannot model them:
    its pre-tokenizer, and the texts of its added and special tokens as ``words`` (cut out of the
    text first, so never inside a chunk)."""
    rules = _sentencepiece_rules(vocab) if vocab.kind == SENTENCEPIECE else _byte_level_rules(vocab)
    return with_words(rules, added_words(vocab)[0])


def _byte_level_rules(vocab: Vocabulary) -> ChunkRules:
    """Byte-level BPE: the split regex of its pre-tokenizer (``ByteLevel``'s own is GPT-2's)."""
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
                splits.append((step, GPT2_PATTERN))  # ByteLevel's own regex is GPT-2's
        elif kind == "Split" and "Regex" in step.get("pattern", {}) \
                and step.get("behavior") == "Isolated" and not step.get("invert"):
            splits.append((step, step["pattern"]["Regex"]))
        else:
            raise ModelError(f"canonical tokenization does not support the pre-tokenizer {json.dumps(step)[:120]}")
    if not splits:
        return whole_text_rules()
    if len(splits) > 1:
        raise ModelError("canonical tokenization does not support several splitting pre-tokenizers "
                         f"({', '.join(json.dumps(step)[:80] for step, _ in splits)})")
    step, pattern = splits[0]
    try:
        return split_rules(pattern)
    except ModelError as e:
        raise ModelError(f"{e.message} (the pre-tokenizer {json.dumps(step)[:160]})") from None


def _sentencepiece_rules(vocab: Vocabulary) -> ChunkRules:
    """SentencePiece-style BPE (Gemma, Llama-2, Mistral): the normalizer or a ``Metaspace``
    pre-tokenizer turns spaces into ▁ (and may put one in front, ``Vocabulary.prepend``); the
    whole text is one BPE chunk but for the added tokens, which are cut out first."""
    norm = vocab.spec.get("normalizer")
    steps = norm.get("normalizers", []) if norm and norm.get("type") == "Sequence" else ([norm] if norm else [])
    for step in steps:
        if step not in _SP_NORMALIZERS:
            raise ModelError(f"canonical tokenization does not support the normalizer {json.dumps(step)[:120]}")
    pre = vocab.spec.get("pre_tokenizer")
    # Gemma's Split on " " runs after the normalizer has turned every space into ▁: it never splits
    noop_split = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
    # Llama-2 and Mistral as transformers converts them: Metaspace turns spaces into ▁ and puts
    # one in front of the text unless it starts with one (Vocabulary.prepend_unless_there)
    metaspace = (pre or {}).get("type") == "Metaspace" and pre.get("replacement") == "\u2581" \
        and not pre.get("split", True) and not steps
    if pre and not (pre == noop_split and _SP_NORMALIZERS[0] in steps) and not metaspace:
        raise ModelError(f"canonical tokenization does not support the pre-tokenizer {json.dumps(pre)[:120]}")
    return run_rules(added_runs(vocab)[0])


# ---------------------------------------------------------------- the chunker core (pure Python)

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
        # TokenAutomaton._tracker_coded): an LRU of at most ``walk_budget`` bytes
        self.walks: "OrderedDict[Tuple[str, int], Tuple[np.ndarray, ...]]" = OrderedDict()
        self.walk_budget, self.walk_bytes = 128 << 20, 0
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
        used are dropped first past ``walk_budget`` bytes."""
        got = self.walks.get(key)
        if got is None:
            got = compute()
            self.walks[key] = got
            self.walk_bytes += sum(a.nbytes for a in got)
            self._shrink_walks(1)
        else:
            self.walks.move_to_end(key)
        return got

    def set_walk_budget(self, nbytes: int) -> None:
        """Keep at most about ``nbytes`` of walks (the automaton's share of a query's
        ``max_memory``: ``TokenAutomaton.set_cache_budget``)."""
        self.walk_budget = nbytes
        self._shrink_walks(0)

    def _shrink_walks(self, keep: int) -> None:
        """Drop the least recently used walks past ``walk_budget``, keeping at least ``keep``."""
        while self.walk_bytes > self.walk_budget and len(self.walks) > keep:
            self.walk_bytes -= sum(a.nbytes for a in self.walks.popitem(last=False)[1])


@functools.lru_cache(maxsize=8)
def tracker_for(rules: ChunkRules) -> Tracker:
    return Tracker(rules)
