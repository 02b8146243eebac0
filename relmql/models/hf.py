"""A ``LanguageModel`` backed by a transformers causal LM."""

from __future__ import annotations

import os
from typing import List, Optional, Sequence

import numpy as np
import torch

from ..errors import ModelError
from .base import LanguageModel, ModelState
from .vocab import Vocabulary, from_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: Optional[str]) -> torch.device:
    """``None``/"auto" → cuda when available, else cpu; anything else as given."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelError(f"unknown device {device!r} (use cpu, cuda or cuda:N)") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError("device 'cuda' was asked for, but torch sees no CUDA GPU here")
    return dev


def resolve_dtype(dtype: Optional[str], device: torch.device) -> torch.dtype:
    """``None``/"auto" → bfloat16 on a CPU with native bf16 support or on CUDA, else float32."""
    if dtype in (None, "auto"):
        if device.type == "cuda":
            return torch.bfloat16
        cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else ""
        return torch.bfloat16 if cap in ("AVX512", "AVX512_BF16", "AMX", "SVE256") else torch.float32
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r} (use {', '.join(DTYPES)} or auto)")
    return DTYPES[dtype]


class TransformersModel(LanguageModel):
    """Any transformers causal LM with a fast tokenizer.

    States keep the per-sequence key/value cache; ``extend`` pads a batch of sequences of
    different lengths (past on the left, new tokens on the right) into one forward pass.
    """

    def __init__(self, model, tokenizer, name: str, bos_id: Optional[int] = None, eos_id: Optional[int] = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        vocab_size = model.get_output_embeddings().weight.shape[0]
        self.vocabulary: Vocabulary = from_tokenizer(tokenizer, vocab_size, eos_id=eos_id, bos_id=bos_id)
        if self.vocabulary.bos_id is None:
            raise ModelError(f"model {name!r} has neither a start-of-text nor an end-of-text token")

    @classmethod
    def from_pretrained(cls, path: str, device: Optional[str] = None, dtype: Optional[str] = None,
                        name: Optional[str] = None, **kwargs) -> "TransformersModel":
        """Load a model from a local directory or (where the user has network or a cache) the hub."""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, dev)
        if not os.path.isdir(path) and not _hub_reachable():
            kwargs.setdefault("local_files_only", True)  # no network: only the local cache
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dt, **kwargs)
        except (OSError, ValueError) as e:
            where = "a local directory" if os.path.isdir(path) else "a local directory or a model in the Hugging Face cache"
            raise ModelError(f"could not load model {path!r}: it is not {where} that transformers can read "
                             f"({str(e).splitlines()[0][:160]}); downloading from the hub needs network access") from None
        return cls(model.to(dev), tokenizer, name or path)

    @torch.inference_mode()
    def extend(self, states: Sequence[Optional[ModelState]], tokens: Sequence[Sequence[int]]) -> List[ModelState]:
        if len(states) != len(tokens):
            raise ValueError("states and tokens differ in length")
        seqs = []
        for st, new in zip(states, tokens):
            new = [int(t) for t in new]
            if st is None:
                seqs.append(((), None, [self.bos_id] + new))
            elif st.cache is None:  # evicted: read everything again
                seqs.append(((), None, list(st.tokens) + new))
            else:
                if not new:
                    raise ValueError("extend needs at least one new token for an existing state")
                seqs.append((st.tokens, st.cache, new))
        return self._forward(seqs)

    def _forward(self, seqs) -> List[ModelState]:
        dev = self.device
        past_len = [len(p) if c is not None else 0 for p, c, _ in seqs]
        new_len = [len(n) for _, _, n in seqs]
        B, P, N = len(seqs), max(past_len), max(new_len)
        ids = torch.zeros((B, N), dtype=torch.long)
        mask = torch.zeros((B, P + N), dtype=torch.long)
        pos = torch.zeros((B, N), dtype=torch.long)
        for b, (_, _, new) in enumerate(seqs):
            ids[b, :len(new)] = torch.tensor(new)
            mask[b, P - past_len[b]:P + len(new)] = 1
            pos[b, :len(new)] = torch.arange(past_len[b], past_len[b] + len(new))
        cache = None
        if P:
            cache = self._batch_cache([c for _, c, _ in seqs], past_len, P)
        out = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev),
                         past_key_values=cache, use_cache=True)
        last = torch.tensor([n - 1 for n in new_len], device=dev)
        logits = out.logits[torch.arange(B, device=dev), last].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        layers = _cache_tensors(out.past_key_values)
        states = []
        for b, (prev, _, new) in enumerate(seqs):
            lo, hi = P - past_len[b], P + len(new)
            per = tuple((k[b:b + 1, :, lo:hi].clone(), v[b:b + 1, :, lo:hi].clone()) for k, v in layers)
            states.append(ModelState(tuple(prev) + tuple(new), logprobs[b], per))
        return states

    def _batch_cache(self, caches, past_len, P):
        from transformers import DynamicCache
        layers = []
        some = next(c for c in caches if c is not None)
        for layer in range(len(some)):
            ks, vs = [], []
            ref = some[layer][0]
            for c, n in zip(caches, past_len):
                k, v = c[layer] if c is not None else (None, None)
                if k is None:
                    k = v = ref.new_zeros(ref.shape[:2] + (0,) + ref.shape[3:])
                pad = P - n
                if pad:
                    z = k.new_zeros(k.shape[:2] + (pad,) + k.shape[3:])
                    k, v = torch.cat([z, k], 2), torch.cat([z, v], 2)
                ks.append(k)
                vs.append(v)
            layers.append((torch.cat(ks, 0), torch.cat(vs, 0)))
        return DynamicCache(ddp_cache_data=layers, config=self.model.config)

    @torch.inference_mode()
    def score(self, token_ids: Sequence[int], state: Optional[ModelState] = None) -> np.ndarray:
        """Log-probability of each token given what precedes it, in one forward pass."""
        if state is not None:
            return super().score(token_ids, state)
        ids = torch.tensor([[self.bos_id] + [int(t) for t in token_ids]], device=self.device)
        logits = self.model(input_ids=ids).logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1)
        return lp[torch.arange(len(token_ids)), ids[0, 1:]].double().cpu().numpy()


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face hub answers at all (so a missing model fails fast offline)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    import socket
    from urllib.parse import urlparse
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _cache_tensors(cache):
    """[(keys, values)] per layer from a transformers cache object."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in cache]  # pragma: no cover - legacy tuple caches
