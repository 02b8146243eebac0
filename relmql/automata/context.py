"""Where the tokenizer stands after a prompt's last tokens, so that a reply is tokenized as the
tokenizer encodes the prompt's text followed by it."""

from __future__ import annotations

import functools
from typing import Tuple

import numpy as np

from ..errors import CompileError
from ..models.vocab import Vocabulary
from ..records import DEFAULT_MAX_STATES
from ..syntax.regexes import escape


def context_state(vocab: Vocabulary, context: Tuple[int, ...], tracker, pairs) -> Tuple[int, int]:
    """The tracker state and the last token's pair class after the tokens ``context`` (the text
    after a prompt's last special token), ``tracker`` and ``pairs`` being the ones of the
    automaton that reads on from there."""
    tau, lam, used = _walk(vocab, tuple(int(t) for t in context))
    if used is not tracker or _pairs_of(vocab) is not pairs:  # another copy: its states are numbered apart
        _walk.cache_clear()
        tau, lam, used = _walk(vocab, tuple(int(t) for t in context))
    return tau, lam


def _pairs_of(vocab: Vocabulary):
    from .fitting import pair_table as _pair_table
    return _pair_table(vocab)


@functools.lru_cache(maxsize=32)
def _walk(vocab: Vocabulary, context: Tuple[int, ...]):
    from .language import LanguageSpec, compile_language
    from .tokens import TokenAutomaton
    text = vocab.decode(context)
    spelled = vocab.token_bytes(context)  # the text, with what the tokenizer puts in front of it
    if any(vocab.tokens[t] is None for t in context) or spelled not in (text.encode(), vocab.prepend + text.encode()):
        raise CompileError("the prompt's last tokens do not spell text that the tokenizer reads back as them",
                           hint="use tokenization all, prefix_tokenization all")
    most = max(DEFAULT_MAX_STATES, 4 * len(text) + 64)
    language = compile_language(LanguageSpec(escape(text), max_states=most))
    automaton = TokenAutomaton(language, vocab, "canonical", "canonical")
    state = automaton.start
    for tok in context:
        arcs = automaton.arcs(state)
        hit = np.flatnonzero(arcs.tokens == tok)
        if not len(hit):
            raise CompileError(f"the prompt's text after its last special token ({text[-40:]!r}) is not tokenized "
                               f"as the tokenizer would: token {vocab.describe(tok)} cannot follow there",
                               hint="use tokenization all, prefix_tokenization all")
        state = int(arcs.targets[hit[0]])
    _, tau, lam = automaton.unpack(state)
    return tau, lam, automaton.tracker


__all__ = ["context_state"]
