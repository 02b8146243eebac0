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


def reply_logprob(model: LanguageModel, prefix: str, completion: str, eos: bool) -> Optional[float]:
    """The natural log of the probability ``model`` gives ``completion`` after ``prefix`` (each in its
    canonical tokenization, the prefix after the model's prompt, if it has one, the completion
    after the prefix as a query splits them), with the end token after it when ``eos``; None where
    the reply has no canonical tokenization after the prompt."""
    vocab = model.vocabulary
    if prefix:
        pre = encode_after(vocab, model.context, prefix)
        comp = tuple(vocab.encode(completion)) if completion else ()
    else:
        pre, comp = (), encode_after(vocab, model.context, completion)
    if pre is None or comp is None:
        return None
    tokens = list(pre + comp)
    if not tokens:
        state, lps = model.start(), []
    else:
        state = model.extend([None], [tokens])[0]
        lps = list(state.token_logprobs)[-len(tokens):]
    total = math.fsum(float(x) for x in lps[len(pre):])
    if eos:
        total += float(state.logprobs[model.eos_id])
    return total


__all__ = ["encode_after", "reply_logprob"]
