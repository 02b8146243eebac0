"""The decoding rules applied to a batch of next-token distributions."""

from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import torch

from ..records import Decoding


BLOCK = 64  # columns per block in top()


def top(x: torch.Tensor, k: int):
    """``torch.topk(x, k, dim=-1)`` (values exact; among equal values the indices may differ) in
    about half the time on a CPU for a large vocabulary: the k largest values lie in the k blocks
    of ``BLOCK`` columns with the largest maxima (a block left out has a maximum no larger than
    the k-th largest value), so only those blocks are searched."""
    rows, vocab = x.shape
    nb = vocab // BLOCK
    if k * 8 > nb:
        return torch.topk(x, k, dim=-1)
    peaks = x[:, :nb * BLOCK].reshape(rows, nb, BLOCK).amax(-1)
    if nb * BLOCK < vocab:
        peaks = torch.cat([peaks, x[:, nb * BLOCK:].amax(-1, keepdim=True)], 1)
    blocks = torch.topk(peaks, k, dim=-1).indices
    cols = (blocks.unsqueeze(-1) * BLOCK + torch.arange(BLOCK, device=x.device)).view(rows, -1)
    if nb * BLOCK == vocab:
        vals = torch.gather(x, 1, cols)
    else:  # the last block is partial: its missing columns count as -inf
        vals = torch.gather(x, 1, cols.clamp(max=vocab - 1)).masked_fill(cols >= vocab, -math.inf)
    v, i = torch.topk(vals, k, dim=-1)
    return v, torch.gather(cols, 1, i)


class RuleScores:
    """Log-probabilities of completion tokens under ``rules`` for a batch of distributions,
    evaluated only where asked (``at``), without building the whole rule-adjusted vocabulary.

    As transformers' samplers do: divide the logits by the temperature, keep the ``topk`` most
    probable tokens (ties with the k-th kept), then the smallest most-probable set whose
    probability reaches ``topp``, and renormalize over what is kept. Per distribution this needs
    only a threshold and a normalizer; ``kept[b]`` lists the tokens row ``b`` keeps (sorted), when
    top-k or top-p make that a short list.
    """

    def __init__(self, logprobs: torch.Tensor, rules: Decoding):
        self.rules = rules
        x = logprobs if rules.temperature == 1 else logprobs / rules.temperature
        self.x = x
        rows, vocab = x.shape
        self.kept: Optional[List[Optional[np.ndarray]]] = None
        self.threshold = torch.full((rows,), -math.inf, dtype=x.dtype, device=x.device)
        if not rules.truncates:
            self.lse = torch.logsumexp(x, dim=-1) if rules.temperature != 1 else torch.zeros_like(self.threshold)
            return
        k = min(rules.topk or vocab, vocab)
        count = torch.full((rows,), k, dtype=torch.long, device=x.device)
        if rules.topp is not None and rules.topp < 1:
            if rules.topk is not None:
                base = torch.logsumexp(top(x, k)[0], dim=-1, keepdim=True)
            else:
                base = torch.logsumexp(x, dim=-1, keepdim=True)
            window = min(k, 64)  # grow a window of the most probable tokens until it holds topp
            while True:
                probs = torch.exp(top(x, window)[0] - base)
                before = torch.cumsum(probs, dim=-1) - probs
                if bool((before[:, -1] >= rules.topp).all()) or window >= k:
                    break
                window = min(k, window * 4)
            count = (before < rules.topp).sum(dim=-1).clamp(min=1)
        width = int(count.max())
        vals, idx = top(x, min(width + 1, vocab))
        self.threshold = vals.gather(1, (count - 1).unsqueeze(1)).squeeze(1)
        keep = torch.arange(width, device=x.device).unsqueeze(0) < count.unsqueeze(1)
        self.lse = torch.logsumexp(vals[:, :width].masked_fill(~keep, -math.inf), dim=-1)
        # transformers keeps tokens tied with the last one kept: rare, handled over the whole row
        nxt = vals.gather(1, count.clamp(max=vals.shape[1] - 1).unsqueeze(1)).squeeze(1)
        tied = (nxt == self.threshold) & (count < vocab)
        if bool(tied.any()):
            r = tied.nonzero().flatten()
            masked = x[r].masked_fill(x[r] < self.threshold[r].unsqueeze(1), -math.inf)
            self.lse[r] = torch.logsumexp(masked, dim=-1)
        ids = idx.cpu().numpy()
        counts = count.cpu().tolist()
        tied_rows = tied.cpu().tolist()
        self.kept = [None if tied_rows[b] else np.sort(ids[b, :counts[b]]) for b in range(rows)]

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
