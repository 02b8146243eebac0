"""The decoding rules applied to a batch of next-token distributions."""

from __future__ import annotations

import math
import threading
from typing import Dict, List, Optional

import numpy as np
import torch

from ..memory import batch_cap
from ..records import Decoding


BLOCK = 64  # columns per block in top()
SUB_BLOCK = 8  # ... and per block when top() searches the chosen blocks again
SCRATCH_MAX = 1 << 23  # values (32 MB of float32) a thread's _scratch buffer keeps at most
_SCRATCH = threading.local()  # per thread: the buffer _top_cpu copies the chosen blocks into


def top(x: torch.Tensor, k: int, block: int = BLOCK, spread: int = 8):
    """``torch.topk(x, k, dim=-1)`` (values exact and sorted; among equal values the indices may
    differ) in a fraction of its time for a large vocabulary: the k largest values lie in the k
    blocks of ``block`` columns with the largest maxima (a block left out has a maximum no
    larger than the k-th largest value), so only those blocks are searched, with the columns
    past the last whole block. On a CPU (``_top_cpu``) a bound at most the k-th largest value
    finds the blocks, and only the values at or above it are sorted; elsewhere ``torch.topk`` runs
    over the block maxima and then, the same way again, within the chosen blocks in blocks of
    ``SUB_BLOCK``. Plain ``torch.topk`` where there are fewer than ``spread`` blocks per value
    asked for."""
    rows, vocab = x.shape
    nb = vocab // block
    if k * spread > nb:
        return torch.topk(x, k, dim=-1)
    if x.stride(1) != 1:
        x = x.contiguous()
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        got = _top_cpu(x, k, block)
        if got is not None:
            return got
    blocked = x.as_strided((rows, nb, block), (x.stride(0), block, 1))
    blocks = torch.topk(blocked.amax(-1), k, dim=-1, sorted=False).indices
    vals = _block_values(x, blocked, blocks)
    v, p = top(vals, k, SUB_BLOCK, 4) if block > SUB_BLOCK else torch.topk(vals, k, dim=-1)
    return v, _block_columns(blocks, p, block, vocab)


def _block_values(x: torch.Tensor, blocked: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """Each row's chosen blocks (``blocks``: their numbers, ``[rows, k]``) side by side, then the
    row's columns past the last whole block."""
    rows, nb, block = blocked.shape
    full = nb * block
    base = torch.arange(rows, device=x.device).unsqueeze(1)
    if x.stride(0) == x.shape[1] == full:  # whole blocks copied as rows (faster than gathering columns)
        vals = x.view(rows * nb, block).index_select(0, (blocks + base * nb).view(-1))
    else:
        vals = blocked[base, blocks]
    vals = vals.reshape(rows, blocks.shape[1] * block)
    return torch.cat([vals, x[:, full:]], 1) if full < x.shape[1] else vals


def _block_columns(blocks: torch.Tensor, p: torch.Tensor, block: int, vocab: int) -> torch.Tensor:
    """The columns of the row at positions ``p`` of ``_block_values``' rows."""
    k, full = blocks.shape[1], vocab // block * block
    col = torch.gather(blocks, 1, p.div(block, rounding_mode="floor").clamp(max=k - 1)) * block + p % block
    return torch.where(p >= k * block, full + p - k * block, col) if full < vocab else col


def _top_cpu(x: torch.Tensor, k: int, block: int, group: int = 4):
    """``top`` on a CPU without ``torch.topk``, whose cost per row is high for short rows (1 ms
    for 41 of 768 block maxima in 256 rows): ``m``, the k-th largest maximum of groups of
    ``group`` blocks (``np.partition`` of a quarter of the block maxima), is at most the row's
    k-th largest value (k groups hold a value at least ``m``), so the k largest values are among
    the values at least ``m`` in the blocks whose maxima are at least ``m`` (about k of them:
    ties need no care) and the columns past the last whole block; those few values are sorted.
    None where a row has fewer than k values at least ``m`` (NaN), which the caller handles."""
    rows, vocab = x.shape
    nb = vocab // block
    full, ng = nb * block, nb // group
    blocked = x.as_strided((rows, nb, block), (x.stride(0), block, 1))
    peaks = blocked.amax(-1).numpy()
    tops = np.maximum.reduce([peaks[:, i:ng * group:group] for i in range(group)])  # (faster than .max(-1))
    m = np.partition(tops, ng - k, axis=1)[:, ng - k]
    flat = np.flatnonzero(peaks >= m[:, None])  # row * nb + block, in row order
    if x.stride(0) == vocab == full:  # whole blocks copied as rows (faster than gathering columns)
        vals = _scratch(x.dtype, len(flat) * block).view(len(flat), block)
        torch.index_select(x.view(rows * nb, block), 0, torch.from_numpy(flat), out=vals)
        vals = vals.numpy()
    else:
        vals = blocked[torch.from_numpy(flat // nb), torch.from_numpy(flat % nb)].numpy()
    row_of = flat // nb
    hit = np.flatnonzero(vals >= m[row_of, None])
    at_block = hit // block
    r, col, v = row_of[at_block], flat[at_block] % nb * block + hit % block, vals.reshape(-1)[hit]
    if full < vocab:
        tail = x[:, full:].numpy()
        tr, tc = np.nonzero(tail >= m[:, None])
        order = np.argsort(np.concatenate([r, tr]), kind="stable")
        r, col, v = (np.concatenate(p)[order] for p in ((r, tr), (col, tc + full), (v, tail[tr, tc])))
    counts = np.bincount(r, minlength=rows)
    if counts.min() < k:
        return None
    at = np.arange(len(r)) - (np.cumsum(counts) - counts)[r]  # place within its row
    cand = np.full((rows, int(counts.max())), -np.inf, vals.dtype)
    cand[r, at] = v
    where = np.zeros(cand.shape, np.int64)
    where[r, at] = col
    order = np.argsort(-cand, axis=1, kind="stable")[:, :k]
    return torch.from_numpy(np.take_along_axis(cand, order, 1)), torch.from_numpy(np.take_along_axis(where, order, 1))


def _scratch(dtype: torch.dtype, n: int) -> torch.Tensor:
    """``n`` values of this thread's reused buffer (grown when short): the blocks copied on each
    call are megabytes, and a fresh array that size is fresh pages from the kernel each time (700
    page faults a call for 256 rows of 49,152, about 7% of a search driving a nearly free model).
    The values are read before the thread's next call; a buffer past ``SCRATCH_MAX`` values (rows
    whose block maxima tie in the hundreds) is not kept."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.dtype != dtype or buf.numel() < n:
        buf = torch.empty(max(n, 1 << 20), dtype=dtype)
        if n <= SCRATCH_MAX:
            _SCRATCH.buf = buf
    return buf[:n]


def batch_limit(rules: Decoding, vocab: int, max_memory: int) -> int:
    """The most nodes or samples one model call may take under ``rules`` (``memory.batch_cap``:
    what the call holds, the scores and, unless top-k keeps few tokens, the children)."""
    return batch_cap(max_memory, vocab, not rules.keeps_few(vocab))


class RuleScores:
    """Log-probabilities of completion tokens under ``rules`` for a batch of distributions,
    evaluated only where asked (``at``), without building the whole rule-adjusted vocabulary.

    As transformers' samplers do: divide the logits by the temperature, keep the ``topk`` most
    probable tokens (ties with the k-th kept), then the smallest most-probable set whose
    probability reaches ``topp``, and renormalize over what is kept. Per distribution this needs
    only a threshold and a normalizer; ``kept[b]`` lists the tokens row ``b`` keeps (sorted), when
    top-k or top-p make that a short list (ties at the threshold included; None where more than
    four times as many tokens tie).
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
        nucleus = rules.topp is not None and rules.topp < 1
        count = self._nucleus(k) if nucleus else torch.full((rows,), k, dtype=torch.long, device=x.device)
        width = int(count.max()) if nucleus else k
        vals, idx = top(x, min(width + 1, vocab))
        if nucleus:  # rows keep different numbers of tokens
            self.threshold = vals.gather(1, (count - 1).unsqueeze(1)).squeeze(1)
            keep = torch.arange(width, device=x.device).unsqueeze(0) < count.unsqueeze(1)
            self.lse = torch.logsumexp(vals[:, :width].masked_fill(~keep, -math.inf), dim=-1)
            nxt = vals.gather(1, count.clamp(max=vals.shape[1] - 1).unsqueeze(1)).squeeze(1)
        else:
            self.threshold = vals[:, k - 1]
            self.lse = torch.logsumexp(vals[:, :k], dim=-1)
            nxt = vals[:, min(k, vals.shape[1] - 1)]
        # transformers keeps tokens tied with the last one kept (rare in float32, common in
        # bfloat16): such a row keeps every token at or above its threshold, found among its
        # 4 width + 1 largest (the whole row where even those all reach the threshold)
        tied = (nxt == self.threshold) & (count < vocab)
        wide = self._ties(tied, width) if bool(tied.any()) else {}
        ids = idx[:, :width].cpu().numpy()
        counts = count.cpu().numpy()
        if (counts < width).any():  # top-p: rows keep fewer; the rest sort past every token
            ids = np.where(np.arange(width) < counts[:, None], ids, vocab)
        ids.sort(axis=1)
        tied = tied.cpu().numpy()
        if nucleus or tied.any():
            self.kept = [wide.get(b) if t else ids[b, :c] for b, (t, c) in enumerate(zip(tied.tolist(),
                                                                                       counts.tolist()))]
        else:
            self.kept = list(ids)

    def _nucleus(self, k: int) -> torch.Tensor:
        """Tokens each row keeps under top-p (at least one, at most ``k``): a window of the most
        probable tokens grows until it holds ``topp``."""
        x, rules = self.x, self.rules
        if rules.topk is not None:
            base = torch.logsumexp(top(x, k)[0], dim=-1, keepdim=True)
        else:
            base = torch.logsumexp(x, dim=-1, keepdim=True)
        window = min(k, 64)
        while True:
            probs = torch.exp(top(x, window)[0] - base)
            before = torch.cumsum(probs, dim=-1) - probs
            if bool((before[:, -1] >= rules.topp).all()) or window >= k:
                break
            window = min(k, window * 4)
        return (before < rules.topp).sum(dim=-1).clamp(min=1)

    def _ties(self, tied: torch.Tensor, width: int) -> Dict[int, np.ndarray]:
        """Rows whose last kept token ties with the next keep every token at or above their
        threshold: their normalizers (in ``lse``) and, for each found among its ``4 width + 1``
        largest, the tokens it keeps (sorted; a row tied beyond those is left out: it keeps too
        many to list)."""
        x = self.x
        rows, vocab = x.shape
        wide: Dict[int, np.ndarray] = {}
        r = tied.nonzero().flatten()
        thr = self.threshold[r].unsqueeze(1)
        m = min(vocab, 4 * width + 1)
        if 2 * len(r) >= rows:  # most rows: no copy of them
            tv, ti = top(x, m)
            tv, ti = tv[r], ti[r]
        else:
            tv, ti = top(x[r], m)
        above = tv >= thr
        lse = torch.logsumexp(tv.masked_fill(~above, -math.inf), dim=-1)
        whole = above[:, -1] & (tv.shape[1] < vocab)
        if bool(whole.any()):
            xw = x[r[whole]]
            lse[whole] = torch.logsumexp(xw.masked_fill(xw < thr[whole], -math.inf), -1)
        self.lse[r] = lse
        for b, cols, keep, out in zip(r.tolist(), ti.cpu().numpy(), above.cpu().numpy(), whole.tolist()):
            if not out:
                wide[b] = np.sort(cols[keep])
        return wide

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
