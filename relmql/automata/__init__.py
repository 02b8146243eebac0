"""The compiler: a regex (and its prefix) → a byte automaton → a token automaton over a vocabulary.

Entry point: ``compile(matching, vocabulary, prefix, options)``. ``CompileOptions`` lives in
``relmql.records`` (below the planner, which makes it) and is named here too.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

from ..errors import CompileError
from ..models.vocab import Vocabulary
from ..records import CompileOptions
from .bytedfa import ByteDFA
from .language import Language, LanguageSpec, check_patterns, compile_language
from .primitives import memory_bound
from .tokens import Arcs, TokenAutomaton


def compile(matching: str, vocabulary: Vocabulary, prefix: Optional[str] = None,
            options: CompileOptions = CompileOptions(), context: Tuple[int, ...] = ()) -> TokenAutomaton:
    """Compile ``matching`` (the whole string) with ``prefix`` (the given part) into a lazy token
    automaton over ``vocabulary``; ``context``: the tokens the text follows (a prompt's text after
    its last special token), which its canonical tokenization takes into account. Raises
    ``relmql.errors.Error`` subclasses on bad input."""
    _check_texts(matching, prefix)
    return _compile(matching, vocabulary, prefix or None, options, tuple(int(t) for t in context))


def _check_texts(matching, prefix) -> None:
    """MATCHING given, and it and PREFIX strings (the options checked themselves when made)."""
    for name, value in (("MATCHING", matching), ("PREFIX", prefix)):
        if value is not None and not isinstance(value, str):
            raise CompileError(f"{name} must be a string, not {type(value).__name__}")
    if matching is None:
        raise CompileError("MATCHING is missing")


def byte_language(matching: str, prefix: Optional[str] = None, options: CompileOptions = CompileOptions()) -> Language:
    """The byte automaton ``compile`` builds first (cached): it needs no vocabulary, so that its
    errors, a pattern over the size limit among them, can come before a model loads."""
    _check_texts(matching, prefix)
    return compile_language(_spec(matching, prefix or None, options))


def _spec(matching: str, prefix: Optional[str], options: CompileOptions) -> LanguageSpec:
    return LanguageSpec(matching, prefix, options.edits, options.edit_scope, options.edit_alphabet,
                        tuple(options.exclude), options.max_states)


@functools.lru_cache(maxsize=8)
def _compile(matching: str, vocabulary: Vocabulary, prefix: Optional[str], options: CompileOptions,
             context: Tuple[int, ...] = ()) -> TokenAutomaton:
    language = compile_language(_spec(matching, prefix, options))
    automaton = TokenAutomaton(language, vocabulary, options.tokenization, options.prefix_tokenization, context)
    if prefix is not None and prefix.endswith(" ") and len(matching) > len(prefix) and _spaced_words(vocabulary):
        automaton.warnings.append(
            "PREFIX ends with a space, which this model's tokens carry before a word (' July', not 'July'): "
            "what follows it starts with a token the model seldom reads there, so its probability is far "
            "lower than it would be after a prompt without the space; end PREFIX before the space (it then "
            "begins the completion)")
    if context and not len(automaton.arcs(automaton.start)) and not automaton.is_final(automaton.start):
        tail = vocabulary.decode(context)
        automaton.warnings.append(
            f"no string can follow the prompt as the tokenizer reads it: the prompt ends {tail[-20:]!r}, and the "
            f"first characters of every string would join its last token (the tokenizer reads the two as one "
            f"text); begin MATCHING with what separates them (a space, say), or use tokenization all")
    return automaton


def _spaced_words(vocabulary: Vocabulary) -> bool:
    """Whether the vocabulary's words carry the space before them (byte-level BPE's ' the',
    SentencePiece's '▁the'), as most do."""
    return any(t is not None and len(t) > 3 and t[0] == 0x20 and t[1:].isalpha() for t in vocabulary.tokens[:2000])


__all__ = ["compile", "byte_language", "CompileOptions", "TokenAutomaton", "Arcs", "Language", "LanguageSpec",
           "ByteDFA", "check_patterns", "compile_language", "memory_bound"]
