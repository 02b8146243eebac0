"""Independent oracles for the executor: direct transformers scoring and the decoding rules
written out plainly in numpy."""

from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import numpy as np
import torch

# How far a log-probability relmql computes may be from a direct transformers forward pass in the
# same dtype (scored here in float64 from that pass's logits): float rounding differs with the
# shapes of the matrices multiplied (a batch, a cache, the length of the text), and that
# difference is the dtype's, not relmql's. Per token read: float32's log_softmax over SmolLM2's
# 49,152 tokens rounds by up to 3e-5. For the token read right after the start-of-text token,
# more: SmolLM2's activations there reach 2e4, and in float32 two direct forward passes that
# differ only in the length of the text give its first token log-probabilities 1.6e-4 apart (4e-4
# at worst over the vocabulary). Only float32 is held to this (the reduced dtypes' error is
# measured in benchmarks/precision_bench.py).
PER_TOKEN = {torch.float32: 5e-5}
FIRST_TOKEN = {torch.float32: 5e-4}


def tolerance(model, tokens: int, from_start: bool = True) -> float:
    """The float tolerance of a sum of ``tokens`` log-probabilities of ``model`` (``from_start``:
    the first of them is read right after the start-of-text token)."""
    dtype = next(model.model.parameters()).dtype
    return tokens * PER_TOKEN[dtype] + (FIRST_TOKEN[dtype] if from_start and tokens else 0.0)


def step_logprobs(model, tokens: Sequence[int]) -> np.ndarray:
    """[len(tokens) + 1, vocab] float64 log-probabilities: row i is the distribution of the
    token after ``tokens[:i]`` (one plain forward pass from the start-of-text token)."""
    ids = torch.tensor([[model.bos_id, *tokens]])
    with torch.no_grad():
        logits = model.model(ids).logits[0].double()
    return torch.log_softmax(logits, -1).numpy()


def rules_logprobs(lp: np.ndarray, temperature=1.0, topk=None, topp=None) -> np.ndarray:
    """The decoding rules on one distribution, as a sampler applies them."""
    x = lp / temperature
    x = x - np.logaddexp.reduce(x)
    if topk is not None and topk < len(x):
        kth = np.sort(x)[-topk]
        x = np.where(x >= kth, x, -np.inf)
        x = x - np.logaddexp.reduce(x[np.isfinite(x)])
    if topp is not None and topp < 1:
        order = np.argsort(-x, kind="stable")
        p = np.exp(x[order])
        before = np.cumsum(p) - p
        drop = order[before >= topp]
        drop = drop[drop != order[0]]
        x = x.copy()
        x[drop] = -np.inf
        x = x - np.logaddexp.reduce(x[np.isfinite(x)])
    return x


def score(model, tokens: Sequence[int], n_prefix: int, eos: bool = False, **rules) -> Tuple[float, float]:
    """(logprob, total_logprob) of a token sequence: completion tokens under the rules, prefix
    tokens at the model's probability, the end-of-text token too when ``eos``."""
    lp = step_logprobs(model, tokens)
    pre = sum(lp[i, t] for i, t in enumerate(tokens[:n_prefix]))
    cond = 0.0
    for i in range(n_prefix, len(tokens)):
        cond += rules_logprobs(lp[i], **rules)[tokens[i]]
    if eos:
        cond += rules_logprobs(lp[len(tokens)], **rules)[model.eos_id]
    return cond, pre + cond


def ranking(model, paths: List[Tuple[Tuple[int, ...], int]], order: str = "prob", eos: bool = False, **rules):
    """Every (logprob, total_logprob, tokens, n_prefix) of ``paths`` that the rules allow, best first."""
    scored = []
    for toks, n in paths:
        cond, total = score(model, toks, n, eos, **rules)
        if cond > -math.inf:
            scored.append((cond, total, toks, n))
    key = (lambda r: -r[0]) if order == "prob" else (lambda r: -r[1])
    return sorted(scored, key=key)
