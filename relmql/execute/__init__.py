"""Traversals of a token automaton on a model.

``search`` is the reference best-first search: exact, one node per model call. It is the
baseline the batched, cached executor is checked against.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import torch

from ..automata.tokens import TokenAutomaton
from ..models.base import LanguageModel, ModelState


@dataclass(frozen=True)
class Match:
    """One token sequence of the language with its probabilities."""
    text: str
    tokens: Tuple[int, ...]
    prefix_tokens: int
    logprob: float        # completion tokens given the prefix
    total_logprob: float  # the whole sequence from the start of text
    edits: int

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)


def step_logprobs(logprobs: torch.Tensor, topk: Optional[int]) -> torch.Tensor:
    """The next-token log-probabilities under top-k: renormalized over the k most probable tokens,
    -inf elsewhere."""
    if topk is None or topk >= logprobs.shape[-1]:
        return logprobs
    vals, idx = torch.topk(logprobs, topk)
    out = torch.full_like(logprobs, -math.inf)
    out[idx] = vals - torch.logsumexp(vals, 0)
    return out


def search(automaton: TokenAutomaton, model: LanguageModel, limit: Optional[int] = 10,
           topk: Optional[int] = None, max_tokens: int = 64) -> Iterator[Match]:
    """Token sequences in non-increasing order of P(completion | prefix).

    Prefix tokens cost nothing (they are given) and are never pruned by ``topk``; completion
    tokens cost -log p under ``topk``. Exact: a sequence is yielded only when no cheaper one is
    left in the frontier.
    """
    tie = itertools.count()
    # entry: (cost, tie, automaton state, parent model state, token, tokens, n_prefix, total)
    heap = [(0.0, next(tie), automaton.start, None, None, (), 0, 0.0)]
    found = 0
    while heap and (limit is None or found < limit):
        cost, _, state, parent, token, tokens, n_prefix, total = heapq.heappop(heap)
        edits = automaton.final_edits(state)
        if edits >= 0:
            found += 1
            yield Match(model.vocabulary.decode(tokens), tokens, n_prefix, -cost, total, edits)
        if len(tokens) >= max_tokens:
            continue
        arcs = automaton.arcs(state)
        if not len(arcs):
            continue
        mstate: ModelState = model.extend([parent], [[] if token is None else [token]])[0]
        raw = mstate.logprobs
        completion = step_logprobs(raw, topk)
        for tok, tgt, is_prefix in zip(arcs.tokens.tolist(), arcs.targets.tolist(), arcs.prefix.tolist()):
            lp_raw = float(raw[tok])
            lp = 0.0 if is_prefix else float(completion[tok])
            if lp == -math.inf:
                continue
            heapq.heappush(heap, (cost - lp, next(tie), tgt, mstate, tok, tokens + (tok,),
                                  n_prefix + is_prefix, total + lp_raw))
