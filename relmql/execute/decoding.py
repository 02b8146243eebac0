"""The decoding rules applied to a batch of next-token distributions."""

from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import torch

from ..records import Decoding


BLOCK = 64  # columns per block in top()
SUB_BLOCK = 8  # ... and per block when top() searches the chosen blocks again


def top(x: torch.Tensor, k: int, block: int = BLOCK, spread: int = 8):
    """``torch.topk(x, k, dim=-1)`` (values exact; among equal values the indices may differ) in
    about two fifths of the time on a CPU for a large vocabulary (41 of 256 rows of 49,152: 4 ms
    against 10 ms): the k largest values lie in the k blocks of ``block`` columns with the
    largest maxima (a block left out has a maximum no larger than the k-th largest value), so
    only those blocks are searched, with the columns past the last whole block, and the same
    again within them in blocks of ``SUB_BLOCK`` (torch.topk's time grows with the row's length:
    41 of 2,560 values cost 3 ms for 256 rows, of 320 block maxima and then of 328 values
    0.8 ms). Plain ``torch.topk`` where there are fewer than ``spread`` blocks per value asked
    for."""
    rows, vocab = x.shape
    nb = vocab // block
    if k * spread > nb:
        return torch.topk(x, k, dim=-1)
    full = nb * block
    if x.stride(1) != 1:
        x = x.contiguous()
    blocked = x.as_strided((rows, nb, block), (x.stride(0), block, 1))
    blocks = torch.topk(blocked.amax(-1), k, dim=-1, sorted=False).indices
    base = torch.arange(rows, device=x.device).unsqueeze(1)
    if x.stride(0) == vocab == full:  # whole blocks copied as rows (faster than gathering columns)
        vals = x.view(rows * nb, block).index_select(0, (blocks + base * nb).view(-1)).view(rows, k * block)
    else:
        vals = blocked[base, blocks].view(rows, k * block)
    if full < vocab:
        vals = torch.cat([vals, x[:, full:]], 1)
    v, p = top(vals, k, SUB_BLOCK, 4) if block > SUB_BLOCK else torch.topk(vals, k, dim=-1)
    col = torch.gather(blocks, 1, p.div(block, rounding_mode="floor").clamp(max=k - 1)) * block + p % block
    if full < vocab:
        col = torch.where(p >= k * block, full + p - k * block, col)
    return v, col


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
        self.rules, self.logprobs = rules, logprobs
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
        ids = idx[:, :width].cpu().numpy()
        counts = count.cpu().numpy()
        if (counts < width).any():  # top-p: rows keep fewer; the rest sort past every token
            ids = np.where(np.arange(width) < counts[:, None], ids, vocab)
        ids.sort(axis=1)
        self.kept = [None if t else ids[b, :c] for b, (t, c) in enumerate(zip(tied.cpu().tolist(), counts.tolist()))]

    def at(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Rule log-probabilities of ``tokens[i]`` in distribution ``rows[i]``."""
        return self.of(rows, self.logprobs[rows, tokens])

    def of(self, rows: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
        """``at`` for tokens whose model log-probabilities (in distribution ``rows[i]``) have
        been read already."""
        v = logprobs if self.rules.temperature == 1 else logprobs / self.rules.temperature
        out = v - self.lse[rows]
        return out.masked_fill(v < self.threshold[rows], -math.inf)

    def pick(self, rows: np.ndarray, tokens: np.ndarray):
        """Model and rule log-probabilities of ``tokens[i]`` in distribution ``rows[i]``, as float64
        numpy arrays (``at`` and the model's own values in one read; on a CPU read from numpy,
        whose float32 arithmetic rounds as torch's does, without a torch call per batch)."""
        lp = self.logprobs
        if lp.device.type != "cpu" or self.rules.temperature != 1 or lp.dtype not in (torch.float32, torch.float64):
            r, t = torch.from_numpy(rows).to(lp.device), torch.from_numpy(tokens.astype(np.int64)).to(lp.device)
            picked = lp[r, t]
            return picked.double().cpu().numpy(), self.of(r, picked).double().cpu().numpy()
        lse, threshold = self.lse.numpy(), self.threshold.numpy()
        picked = lp.numpy()[rows, tokens]
        rule = np.where(picked < threshold[rows], -np.inf, picked - lse[rows])
        return picked.astype(np.float64), rule.astype(np.float64)

    def full(self) -> torch.Tensor:
        """The whole rule-adjusted ``[batch, vocab]`` log-probabilities."""
        out = self.x - self.lse.unsqueeze(1)
        return out.masked_fill(self.x < self.threshold.unsqueeze(1), -math.inf)


def completion_logprobs(logprobs: torch.Tensor, rules: Decoding) -> torch.Tensor:
    """Log-probabilities of completion tokens under ``rules`` (-inf for tokens they drop)."""
    if rules.plain:
        return logprobs
    return RuleScores(logprobs, rules).full()
