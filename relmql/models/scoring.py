"""The probability a model gives a reply it did not produce (``logprob_under()``)."""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

from .base import LanguageModel
from .vocab import Vocabulary


def encode_after(vocab: Vocabulary, context: Sequence[int], text: str) -> Optional[Tuple[int, ...]]:
    """The tokens of ``text`` as the tokenizer encodes the text of ``context`` followed by it;
    None where that encoding changes the context's own tokens (its last chunk joins the text's
    first characters: no tokenization of ``text`` follows those tokens canonically)."""
    if not context:
        return tuple(vocab.encode(text))
    context = tuple(int(t) for t in context)
    full = tuple(vocab.encode(vocab.decode(context) + text))
    return full[len(context):] if full[:len(context)] == context else None


def reply_tokens(vocab: Vocabulary, context: Sequence[int], prefix: str, completion: str
                 ) -> Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """The tokens of ``prefix`` and ``completion`` as a query splits a reply: the prefix as it
    follows ``context``, the completion as a text of its own after it (the completion follows the
    context where the prefix is empty); None where the reply has no tokenization after the context.
    For a tokenizer that puts nothing in front of a text (a tokenizer that does, such as
    Llama 2's, is read through the automaton: ``relmql.rowcontext``)."""
    if prefix:
        pre = encode_after(vocab, context, prefix)
        comp = tuple(vocab.encode(completion)) if completion else ()
    else:
        pre, comp = (), encode_after(vocab, context, completion)
    return None if pre is None or comp is None else (pre, comp)


def reply_logprob(model: LanguageModel, pre: Sequence[int], comp: Sequence[int], eos: bool) -> float:
    """The natural log of the probability ``model`` gives the tokens ``comp`` after ``pre`` (read
    after the model's prompt, if it has one), with the end token after them when ``eos``."""
    tokens = list(pre) + list(comp)
    if not tokens:
        state, lps = model.start(), []
    else:
        state = model.extend([None], [tokens])[0]
        lps = list(state.token_logprobs)[-len(tokens):]
    total = math.fsum(float(x) for x in lps[len(pre):])
    if eos:
        total += float(state.logprobs[model.eos_id])
    return total


__all__ = ["encode_after", "reply_tokens", "reply_logprob"]
