"""The compiler: a regex (and its prefix) → a byte automaton → a token automaton over a vocabulary.

Entry point: ``compile(matching, vocabulary, prefix, options)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Optional, Tuple

from ..models.vocab import Vocabulary
from .fsa import EDIT_SCOPES, PRINTABLE_ASCII, ByteDFA
from .language import DEFAULT_MAX_STATES, Language, LanguageSpec, compile_language
from .tokens import TOKENIZATIONS, Arcs, TokenAutomaton


@dataclass(frozen=True)
class CompileOptions:
    """How a query's strings become token sequences.

    tokenization / prefix_tokenization: "canonical" (only what the tokenizer produces) or "all"
    (every token sequence spelling the text), for the completion and the prefix.
    edits: up to this many character edits (insert, delete, substitute) over ``edit_alphabet``,
    in ``edit_scope`` ("all", "prefix" or "completion").
    exclude: regexes whose strings are removed.
    max_states: the largest byte automaton allowed.
    """

    tokenization: str = "canonical"
    prefix_tokenization: str = "canonical"
    edits: int = 0
    edit_scope: str = "all"
    edit_alphabet: str = PRINTABLE_ASCII
    exclude: Tuple[str, ...] = field(default=())
    max_states: int = DEFAULT_MAX_STATES


def compile(matching: str, vocabulary: Vocabulary, prefix: Optional[str] = None,
            options: CompileOptions = CompileOptions()) -> TokenAutomaton:
    """Compile ``matching`` (the whole string) with ``prefix`` (the given part) into a lazy token
    automaton over ``vocabulary``. Raises ``relmql.errors.Error`` subclasses on bad input."""
    return _compile(matching, vocabulary, prefix or None, options)


@functools.lru_cache(maxsize=32)
def _compile(matching: str, vocabulary: Vocabulary, prefix: Optional[str], options: CompileOptions) -> TokenAutomaton:
    spec = LanguageSpec(matching, prefix, options.edits, options.edit_scope, options.edit_alphabet,
                        tuple(options.exclude), options.max_states)
    return TokenAutomaton(compile_language(spec), vocabulary, options.tokenization, options.prefix_tokenization)


__all__ = ["compile", "CompileOptions", "TokenAutomaton", "Arcs", "Language", "LanguageSpec", "ByteDFA",
           "compile_language", "TOKENIZATIONS", "EDIT_SCOPES", "PRINTABLE_ASCII"]
