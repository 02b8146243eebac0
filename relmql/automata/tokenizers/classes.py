"""Character classes for the pre-tokenizer model: the code points each one-character piece of a
split regex matches, read from the tokenizers library's own regex engine, and the scanner that
keeps a tokenizer's added words out of chunk text. Design: docs/tokenizers.md."""

from __future__ import annotations

import functools
import hashlib
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...cache import cached_json
from ..charset import MAX_CP, CodepointSet

ENCODABLE = CodepointSet([(0, 0xD7FF), (0xE000, MAX_CP)])  # the code points UTF-8 can spell


class WordScanner:
    """The texts that contain none of ``words`` (byte strings, none of them empty), as a minimal
    DFA over bytes: ``delta[state, byte]`` is the next state, -1 once a word has been read in
    full; the start is 0. ``overlap`` names two words whose occurrences can overlap (a word
    inside another, or a word's end the beginning of a word, itself included), or is None.
    Built as an Aho-Corasick automaton, then minimized (docs/tokenizers.md)."""

    def __init__(self, words: Tuple[bytes, ...]):
        used = sorted({b for w in words for b in w})
        byte_class = np.zeros(256, np.int64)
        byte_class[used] = np.arange(1, len(used) + 1)
        children, ends, paths = _trie(words, byte_class)
        goto, fail, hit = _aho_corasick(children, ends, len(used) + 1)
        self.overlap: Optional[Tuple[bytes, bytes]] = _overlap(words, paths, fail, hit)
        self.delta, self.num_states = _minimized(goto, hit, byte_class)


def _trie(words: Tuple[bytes, ...], byte_class: np.ndarray) -> Tuple[List[Dict[int, int]], List[int], List[List[int]]]:
    """The trie of ``words`` over byte classes: each node's children, each word's last node,
    and each word's path of nodes."""
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
    return children, ends, paths


def _aho_corasick(children: List[Dict[int, int]], ends: List[int],
                  nclass: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Aho-Corasick automaton of the trie: ``goto[node, class]``, ``fail[node]`` and
    ``hit[node]`` (a word ends at the node or at a suffix of it)."""
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
    return goto, fail, hit


def _overlap(words: Tuple[bytes, ...], paths: List[List[int]], fail: np.ndarray,
             hit: np.ndarray) -> Optional[Tuple[bytes, bytes]]:
    """Two words whose occurrences can overlap, or None."""
    for w, path in zip(words, paths):
        if fail[path[-1]] or hit[path[:-1]].any():
            other = next(x for x in words if (x != w and x in w)
                         or any(w.endswith(x[:k]) for k in range(1, min(len(w), len(x)))))
            return (w, other)
    return None


def _minimized(goto: np.ndarray, hit: np.ndarray, byte_class: np.ndarray) -> Tuple[np.ndarray, int]:
    """The scanner's table over bytes and its number of states, minimized by partition
    refinement over the nodes that have read no word (the start first): equivalent when the
    same classes lead to equivalent nodes or to a word's end."""
    n = len(goto)
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
    delta = np.empty((nblocks, 256), np.int64)
    delta[rename] = table[:, byte_class]
    return delta, nblocks


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
        out.append(CodepointSet(map(tuple, ranges)).intersection(ENCODABLE))
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
