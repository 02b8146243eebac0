"""The decoding rules applied to a batch of next-token distributions."""

from __future__ import annotations

import math

import torch

from .options import Decoding


def completion_logprobs(logprobs: torch.Tensor, rules: Decoding) -> torch.Tensor:
    """Log-probabilities of completion tokens under ``rules`` (-inf for tokens they drop).

    ``logprobs`` is ``[batch, vocab]`` (log-softmax of the logits). As transformers' samplers
    do: divide by the temperature, keep the ``topk`` most probable (ties with the k-th kept),
    then the smallest most-probable set whose probability reaches ``topp``, and renormalize.
    """
    if rules.plain:
        return logprobs
    x = logprobs
    if rules.temperature != 1:
        x = torch.log_softmax(x / rules.temperature, dim=-1)
    if rules.topk is not None and rules.topk < x.shape[-1]:
        kth = torch.topk(x, rules.topk, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, -math.inf)
    if rules.topp is not None and rules.topp < 1:
        srt, idx = torch.sort(x, dim=-1, descending=True)
        probs = torch.softmax(srt, dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # mass of the more probable tokens
        drop = before >= rules.topp
        drop[..., 0] = False
        x = x.scatter(-1, idx, srt.masked_fill(drop, -math.inf))
    return torch.log_softmax(x, dim=-1)
