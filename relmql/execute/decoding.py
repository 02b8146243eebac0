"""The decoding rules applied to a batch of next-token distributions."""

from __future__ import annotations

import math

import torch

from .options import Decoding


class RuleScores:
    """Log-probabilities of completion tokens under ``rules`` for a batch of distributions,
    evaluated only where asked (``at``), without building the whole rule-adjusted vocabulary.

    As transformers' samplers do: divide the logits by the temperature, keep the ``topk`` most
    probable tokens (ties with the k-th kept), then the smallest most-probable set whose
    probability reaches ``topp``, and renormalize over what is kept. Per distribution this needs
    only a threshold and a normalizer.
    """

    def __init__(self, logprobs: torch.Tensor, rules: Decoding):
        self.rules = rules
        x = logprobs if rules.temperature == 1 else logprobs / rules.temperature
        self.x = x
        rows = x.shape[0]
        self.threshold = torch.full((rows,), -math.inf, dtype=x.dtype, device=x.device)
        if rules.topk is None and rules.topp is None:
            self.lse = torch.logsumexp(x, dim=-1) if rules.temperature != 1 else torch.zeros_like(self.threshold)
            return
        k = min(rules.topk or x.shape[-1], x.shape[-1])
        if rules.topp is not None and rules.topp < 1:
            # grow a top-k window until it holds probability topp (or reaches k)
            lse_all = torch.logsumexp(x, dim=-1, keepdim=True)
            window = min(k, 64)
            while True:
                vals = torch.topk(x, window, dim=-1).values
                if rules.topk is not None:
                    base = torch.logsumexp(torch.topk(x, k, dim=-1).values, dim=-1, keepdim=True)
                else:
                    base = lse_all
                probs = torch.exp(vals - base)
                before = torch.cumsum(probs, dim=-1) - probs
                enough = (before[:, -1] >= rules.topp) | (window >= k)
                if bool(enough.all()):
                    break
                window = min(k, window * 4)
            keep = before < rules.topp
            keep[:, 0] = True
            count = keep.sum(dim=-1)
            self.threshold = vals.gather(1, (count - 1).unsqueeze(1)).squeeze(1)
        else:
            vals = torch.topk(x, k, dim=-1).values
            self.threshold = vals[:, -1]
        masked = x.masked_fill(x < self.threshold.unsqueeze(1), -math.inf)
        self.lse = torch.logsumexp(masked, dim=-1)

    def at(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Rule log-probabilities of ``tokens[i]`` in distribution ``rows[i]``."""
        v = self.x[rows, tokens]
        out = v - self.lse[rows]
        return out.masked_fill(v < self.threshold[rows], -math.inf)

    def full(self) -> torch.Tensor:
        """The whole rule-adjusted ``[batch, vocab]`` log-probabilities."""
        out = self.x - self.lse.unsqueeze(1)
        return out.masked_fill(self.x < self.threshold.unsqueeze(1), -math.inf)


def completion_logprobs(logprobs: torch.Tensor, rules: Decoding) -> torch.Tensor:
    """Log-probabilities of completion tokens under ``rules`` (-inf for tokens they drop)."""
    if rules.plain:
        return logprobs
    return RuleScores(logprobs, rules).full()
