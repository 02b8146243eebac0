"""Result rows."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Tuple

from ..models.scoring import encode_after
from ..records import COLUMNS


@dataclass(frozen=True)
class Row:
    """One result: a token sequence of the language and its probabilities.

    ``logprob``: natural log of the completion tokens' probability given the prefix, under the
    decoding rules (with the end-of-text token when ``eos`` is on). ``total_logprob``: the
    whole sequence from the start of text (prefix tokens at the model's own probability).
    ``canonical``: ``tokens`` is what the tokenizer produces for ``text``. ``edits``: the edit
    distance to the unedited language. ``weight``: a sample's importance weight (1 otherwise).
    """

    text: str
    prefix: str
    completion: str
    tokens: Tuple[int, ...]
    logprob: float
    total_logprob: float
    canonical: bool
    edits: int
    rank: int
    weight: float = 1.0
    prefix_tokens: int = field(default=0, compare=False)
    miss: bool = field(default=False, compare=False)  # a draw that did not give a string of the language
    summed: bool = field(default=False, compare=False)  # of an estimate's part summed exactly, not a draw

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)

    @property
    def total_prob(self) -> float:
        return math.exp(self.total_logprob)

    def get(self, column: str):
        return getattr(self, column)

    def as_dict(self) -> dict:
        return {c: self.get(c) for c in COLUMNS}


def make_row(vocab, tokens, n_prefix: int, logprob: float, total_logprob: float, edits: int, rank: int,
             weight: float = 1.0, miss: bool = False, context: Tuple[int, ...] = ()) -> Row:
    """The row of ``tokens`` (the first ``n_prefix`` the prefix's), read after the tokens
    ``context`` (a prompt's text after its last special token): canonical where the tokenizer
    encodes the context's text followed by the row's as the context's tokens and the row's."""
    tokens = tuple(int(t) for t in tokens)
    prefix = vocab.decode(tokens[:n_prefix])
    text = vocab.decode(tokens)
    completion = text[len(prefix):] if text.startswith(prefix) else vocab.decode(tokens[n_prefix:])
    canonical = encode_after(vocab, context, text) == tokens
    return Row(text, prefix, completion, tokens, float(logprob), float(total_logprob), canonical, int(edits),
               rank, float(weight), n_prefix, miss)
