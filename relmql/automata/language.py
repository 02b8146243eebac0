"""The byte-level language of a query: MATCHING split by PREFIX, with edits and exclusions."""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import pynini

from ..errors import CompileError, Error
from ..records import DEFAULT_MAX_STATES, EDIT_SCOPES, PRINTABLE_ASCII, Cancelled
from . import regex as rx
from .bytedfa import SPLIT_COL, ByteDFA, count_strings, prepend_split, to_dfa
from .primitives import intersect, optimize
from .regex_fst import check_source, regex_fst
from .transducers import exclude, longest_split, split_language, tag_levels, with_edits


@dataclass(frozen=True)
class LanguageSpec:
    """What the byte automaton is built from.

    ``matching`` is the whole string (prefix included); ``prefix`` describes the given part, and
    each string is split after the longest prefix of it that ``prefix`` matches. ``edits`` allows
    that many character insertions, deletions and substitutions over ``edit_alphabet``, in the
    prefix, the completion or both (``edit_scope``). Strings that fully match one of ``exclude``
    are removed.
    """

    matching: str
    prefix: Optional[str] = None
    edits: int = 0
    edit_scope: str = "all"
    edit_alphabet: str = PRINTABLE_ASCII
    exclude: Tuple[str, ...] = ()
    max_states: int = DEFAULT_MAX_STATES


@dataclass
class Language:
    """A compiled language: its ``ByteDFA`` and the spec it came from."""

    spec: LanguageSpec
    dfa: ByteDFA

    @property
    def has_prefix(self) -> bool:
        return bool(self.spec.prefix)

    @functools.cached_property
    def num_strings(self) -> Optional[int]:
        """How many strings the language has (None: infinitely many)."""
        return count_strings(self.dfa)


def _parsed(pattern: str, role: str, max_states: int) -> rx.Pattern:
    try:
        return _parse(pattern, max_states)
    except Cancelled:
        raise
    except Error as e:
        raise _role(e, role)


@functools.lru_cache(maxsize=64)
def _parse(pattern: str, max_states: int) -> rx.Pattern:
    """The syntax tree of ``pattern`` (its nodes are frozen), parsed once for the check before a
    model loads and the compile after it."""
    check_source(pattern, max_states)
    return rx.parse(pattern)


def check_patterns(matching: str, prefix: Optional[str], exclude: Sequence[str], max_states: int) -> None:
    """Parse MATCHING, PREFIX and the exclusions (quick, before a model loads): a syntax error,
    its ``role`` set, as compiling them would raise it."""
    _parsed(matching, "MATCHING", max_states)
    if prefix:
        _parsed(prefix, "PREFIX", max_states)
    for k, pattern in enumerate(exclude):
        _parsed(pattern, f"exclusion {k + 1}", max_states)


def _pattern_fst(pattern: str, role: str, max_states: int) -> pynini.Fst:
    parsed = _parsed(pattern, role, max_states)
    try:
        fst = regex_fst(parsed, max_states)
    except Cancelled:
        raise  # the user's doing, not the pattern's
    except Error as e:
        raise _role(e, role)
    if fst.num_states() == 0 or fst.copy().connect().num_states() == 0:
        raise _role(CompileError(f"{role} matches no string", (0, len(pattern)), pattern), role)
    return fst


def _role(err: Error, role: str) -> Error:
    err.role = role
    return err


@functools.lru_cache(maxsize=64)
def compile_language(spec: LanguageSpec) -> Language:
    """Build the deterministic byte automaton of ``spec`` (cached)."""
    if spec.edit_scope not in EDIT_SCOPES:
        raise CompileError(f"unknown edit scope {spec.edit_scope!r}; use one of {', '.join(EDIT_SCOPES)}")
    if spec.edits < 0:
        raise CompileError("the number of edits must be zero or more")
    limit = spec.max_states
    matching = _pattern_fst(spec.matching, "MATCHING", limit)
    prefix = _pattern_fst(spec.prefix, "PREFIX", limit) if spec.prefix else None
    if prefix is None and not spec.edits and not spec.exclude:
        return Language(spec, prepend_split(to_dfa(matching)))  # the common, quick case
    try:
        lang = split_language(matching, prefix, limit)
        if lang.num_states() == 0:
            raise _role(CompileError("no string of MATCHING starts with a string of PREFIX",
                                     (0, len(spec.prefix or "")), spec.prefix),
                        "PREFIX")
        ambiguous = prefix is not None  # a prefix language may contain prefixes of its own strings
        if spec.edits:
            scope = spec.edit_scope if prefix is not None else "completion"
            levels = with_edits(lang, spec.edits, spec.edit_alphabet, scope, limit)
            lang = optimize(pynini.union(*levels), limit)
            ambiguous = ambiguous or scope != "completion"
        if ambiguous:
            lang = longest_split(lang, limit)
        for k, pattern in enumerate(spec.exclude):
            lang = exclude(lang, _pattern_fst(pattern, f"exclusion {k + 1}", limit), limit)
        if spec.edits:
            levels = [optimize(intersect(level, lang), limit) for level in levels]
            lang = tag_levels(levels, limit)
    except CompileError as e:
        # a bound on MATCHING as PREFIX, edits or WHERE refine it, or on the text the edits are of
        over = e.message.startswith("the automaton has more than")
        edits = "edits make too large an automaton" in e.message
        if e.span is None and (over or edits):
            e.span, e.source = (0, len(spec.matching)), spec.matching
            if over:
                e.hint = "raise the limit (max_states), or shorten or simplify MATCHING (and PREFIX)"
            # a query places the edits error under its edits option (QueryPlan.source_error)
            raise _role(e, "USING edits" if edits else "MATCHING") from None
        raise
    dfa = to_dfa(lang)
    if dfa.is_empty():
        if spec.exclude:
            raise _role(CompileError("the query matches no string once the exclusions are applied",
                                     hint="WHERE's NOT MATCHING, NOT IN or <> filters remove every string "
                                          "MATCHING allows"), "WHERE")
        raise CompileError("the query matches no string")
    return Language(spec, dfa)


@functools.lru_cache(maxsize=64)
def unedited(matching: str, max_states: int = DEFAULT_MAX_STATES) -> Tuple[ByteDFA, int]:
    """The byte DFA of ``matching`` on its own (no prefix split, no edits) and its start state."""
    dfa = compile_language(LanguageSpec(matching, max_states=max_states)).dfa
    return dfa, int(dfa.delta[0, SPLIT_COL])  # a language without prefix starts with SPLIT


def viable_length(dfa: ByteDFA, start: int, data: bytes) -> int:
    """How many leading bytes of ``data`` some string of the (trimmed) ``dfa`` begins with."""
    state = start
    for i, b in enumerate(data):
        state = int(dfa.delta[state, b])
        if state == dfa.dead:
            return i
    return len(data)


def levenshtein(a: str, b: str) -> int:
    """The edit distance of two strings (insertions, deletions, substitutions of characters)."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        diag, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            diag, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diag + (x != y))
    return row[-1]


def nearest(dfa: ByteDFA, start: int, data: bytes, max_edits: int) -> Optional[bytes]:
    """A string of ``dfa`` within ``max_edits`` insertions, deletions and substitutions of
    ``data`` with the fewest edits (None if there is none): a 0-1 breadth-first search over
    (position in ``data``, DFA state) that remembers the bytes it spelled."""
    dead = dfa.dead
    live: Dict[int, np.ndarray] = {}

    def nexts(q: int) -> np.ndarray:
        got = live.get(q)
        if got is None:
            got = live[q] = np.flatnonzero(dfa.delta[q, :256] != dead)
        return got

    n = len(data)
    best: Dict[Tuple[int, int], int] = {(0, start): 0}
    back: Dict[Tuple[int, int], Tuple[Optional[Tuple[int, int]], Optional[int]]] = {(0, start): (None, None)}
    todo = deque([(0, 0, start)])
    while todo:
        d, i, q = todo.popleft()
        if d > best.get((i, q), max_edits + 1):
            continue
        if i == n and dfa.final[q] >= 0:
            out, key = [], (i, q)
            while key is not None:
                key, b = back[key]
                if b is not None:
                    out.append(b)
            return bytes(reversed(out))
        steps = []
        if i < n and dfa.delta[q, data[i]] != dead:
            steps.append((0, i + 1, int(dfa.delta[q, data[i]]), data[i]))
        if d < max_edits:
            if i < n:
                steps.append((1, i + 1, q, None))  # a byte of data that the language lacks
            for b in nexts(q).tolist():
                if i < n and b != data[i]:
                    steps.append((1, i + 1, int(dfa.delta[q, b]), b))  # substituted
                steps.append((1, i, int(dfa.delta[q, b]), b))  # a byte data lacks
        for cost, j, r, b in steps:
            if d + cost < best.get((j, r), max_edits + 1):
                best[(j, r)] = d + cost
                back[(j, r)] = ((i, q), b)
                (todo.appendleft if cost == 0 else todo.append)((d + cost, j, r))
    return None
