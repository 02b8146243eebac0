"""The byte-level language of a query: MATCHING split by PREFIX, with edits and exclusions."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Tuple

import pynini

from ..errors import CompileError, Error
from . import fsa
from . import regex as rx
from .fsa import PRINTABLE_ASCII, ByteDFA

DEFAULT_MAX_STATES = 100_000


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
        return fsa.count_strings(self.dfa)


def _parse(pattern: str, role: str) -> rx.Pattern:
    try:
        return rx.parse(pattern)
    except Error as e:
        e.role = role
        raise


def _pattern_fst(pattern: str, role: str, max_states: int) -> pynini.Fst:
    parsed = _parse(pattern, role)
    try:
        fst = fsa.regex_fst(parsed, max_states)
    except Error as e:
        e.role = role
        raise
    if fst.num_states() == 0 or fst.copy().connect().num_states() == 0:
        raise _role(CompileError(f"{role} matches no string", (0, len(pattern)), pattern), role)
    return fst


def _role(err: Error, role: str) -> Error:
    err.role = role
    return err


@functools.lru_cache(maxsize=64)
def compile_language(spec: LanguageSpec) -> Language:
    """Build the deterministic byte automaton of ``spec`` (cached)."""
    if spec.edit_scope not in fsa.EDIT_SCOPES:
        raise CompileError(f"unknown edit scope {spec.edit_scope!r}; use one of {', '.join(fsa.EDIT_SCOPES)}")
    if spec.edits < 0:
        raise CompileError("the number of edits must be zero or more")
    limit = spec.max_states
    matching = _pattern_fst(spec.matching, "MATCHING", limit)
    prefix = _pattern_fst(spec.prefix, "PREFIX", limit) if spec.prefix else None
    if prefix is None and not spec.edits and not spec.exclude:
        return Language(spec, fsa.prepend_split(fsa.to_dfa(matching)))  # the common, quick case
    lang = fsa.split_language(matching, prefix, limit)
    if lang.num_states() == 0:
        raise _role(CompileError("no string of MATCHING starts with a string of PREFIX",
                                 (0, len(spec.prefix or "")), spec.prefix),
                    "PREFIX")
    ambiguous = prefix is not None  # a prefix language may contain prefixes of its own strings
    if spec.edits:
        scope = spec.edit_scope if prefix is not None else "completion"
        levels = fsa.with_edits(lang, spec.edits, spec.edit_alphabet, scope, limit)
        lang = fsa.optimize(pynini.union(*levels), limit)
        ambiguous = ambiguous or scope != "completion"
    if ambiguous:
        lang = fsa.longest_split(lang, limit)
    for k, pattern in enumerate(spec.exclude):
        lang = fsa.exclude(lang, _pattern_fst(pattern, f"exclusion {k + 1}", limit), limit)
    if spec.edits:
        levels = [fsa.optimize(fsa.intersect(level, lang), limit) for level in levels]
        lang = fsa.tag_levels(levels, limit)
    dfa = fsa.to_dfa(lang)
    if dfa.is_empty():
        raise CompileError("the query matches no string once the exclusions are applied"
                           if spec.exclude else "the query matches no string")
    return Language(spec, dfa)
