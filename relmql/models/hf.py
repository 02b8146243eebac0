"""The transformers backend: ``TransformersModel``, a ``LanguageModel`` backed by a transformers causal
LM, which owns its cached keys and values (``kvstore.KVStore``) and its forward passes
(``passes.ForwardPasses``); ``loading`` builds one and runs the load-time probes (docs/models.md,
*Inside the model backend*)."""

from __future__ import annotations

import threading
from typing import List, Optional, Sequence

import numpy as np
import torch

from ..errors import ModelError
from ..memory import return_large_blocks
from .attention import use_grouped_attention
from .base import LanguageModel, ModelState, ModelStats
from .device import approximate
from .kvstore import KVStore
from .passes import ForwardPasses, Seq
from .vocab import Vocabulary, from_tokenizer

DEFAULT_KV_BUDGET = 2 ** 30  # bytes of cached keys and values kept per model (a query sets its own share)


class TransformersModel(LanguageModel):
    """Any transformers causal LM with a fast tokenizer (build one with ``loading.wrap`` or
    ``loading.from_pretrained``, which check how it reads).

    ``extend`` reads a batch of sequences in one forward pass: their new tokens as one sequence
    under a tree attention mask, or (where the model cannot take one) padded (past on the left,
    new tokens on the right). Keys and values live in a tree of ``KVBlock``s; when they take
    more than ``kv_budget`` bytes, the least recently used blocks are dropped, and a call that
    needs dropped blocks reads each of them again once, in place (without tree attention, a
    sequence that needs one is read again from the start).
    """

    def __init__(self, model, tokenizer, name: str, bos_id: Optional[int] = None, eos_id: Optional[int] = None,
                 kv_budget: int = DEFAULT_KV_BUDGET):
        return_large_blocks()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.approximate = approximate(str(self.dtype).replace("torch.", ""), str(self.device))
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.max_length = getattr(config, "max_position_embeddings", None)
        vocab_size = model.get_output_embeddings().weight.shape[0]
        self.vocabulary: Vocabulary = from_tokenizer(tokenizer, vocab_size, eos_id=eos_id, bos_id=bos_id)
        if self.vocabulary.bos_id is None:
            raise ModelError(f"model {name!r} has neither a start-of-text nor an end-of-text token")
        self.stats = ModelStats()
        self.passes = passes = ForwardPasses(self)
        self.store = KVStore(kv_budget, held=lambda: passes.nbytes)  # the cached keys and values
        self.grouped_attention = use_grouped_attention(self.model)  # CPU attention over shared key/value heads
        self._lock = threading.RLock()
        self.attention = "padded copies of each sequence's keys and values"  # how it reads (the probes say)

    def set_cache_budget(self, nbytes: int) -> None:
        self.store.budget = nbytes
        self._evict()

    @property
    def kv_bytes(self) -> int:
        """Bytes of keys and values held now (the pool, the staging buffer and the graphed passes'
        buffers)."""
        return self.store.nbytes

    def _evict(self) -> None:
        """Keep the passes' buffers and the cached keys and values within the budget."""
        self.passes.trim(self.store.budget)
        self.store.evict()

    # -- reading tokens
    @torch.inference_mode()
    def extend(self, states: Sequence[Optional[ModelState]], tokens: Sequence[Sequence[int]]) -> List[ModelState]:
        with self._lock:  # one call at a time: the staging buffer and the block records are shared
            return self._extend(states, tokens)

    @torch.inference_mode()
    def begin(self, ids: Sequence[int]) -> ModelState:
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("begin needs at least one token")
        if self.max_length is not None and len(ids) > self.max_length:
            raise self.context_error(len(ids), " for the prompt", hint="shorten PROMPT")
        with self._lock:
            return self._forward([Seq((), None, ids, 1)])[0]

    def _extend(self, states, tokens) -> List[ModelState]:
        if len(states) != len(tokens):
            raise ValueError("states and tokens differ in length")
        seqs, lost = [], {}
        for st, new in zip(states, tokens):
            new = [int(t) for t in new]
            if st is None:
                seqs.append(Seq((), None, [self.bos_id] + new, 1))
                continue
            if not new:
                raise ValueError("extend needs at least one new token for an existing state")
            chain = st.cache.chain() if st.cache is not None else None
            gone = [b for b in chain if b.slots is None] if chain is not None else None
            if chain is None or (gone and not self.passes.tree_attention):
                # evicted: read everything again (the first new token's probability is known)
                self.stats.recomputed += len(st.tokens)
                seqs.append(Seq((), None, list(st.tokens) + new, len(st.tokens)))
                continue
            for b in gone:  # evicted blocks are read again once for the whole call, in place (store.restore)
                lost.setdefault(id(b), (b, st.tokens[b.length - b.n:b.length]))
            seqs.append(Seq(st.tokens, chain, new, 0))
        longest = max((len(seq.past) + len(seq.new) for seq in seqs), default=0)
        if self.max_length is not None and longest > self.max_length:
            raise self.context_error(longest)
        if lost:
            # each evicted block once, however many of the call's sequences it begins (a long
            # PREFIX evicted under a small max_memory is read once per call, not once per node)
            self.stats.recomputed += self.store.restore(sorted(lost.values(), key=lambda bt: bt[0].length),
                                                        self.passes.restore_piece(), self._restore_pass)
        return self._forward(seqs)

    def _restore_pass(self, group) -> torch.Tensor:
        """The keys and values of a group of evicted blocks, read again in one pass (``passes.reread``)."""
        return self.passes.reread(group)

    def _forward(self, seqs: List[Seq]) -> List[ModelState]:
        out = self.passes.forward(seqs)
        self._evict()
        return out

    @torch.inference_mode()
    def score(self, token_ids: Sequence[int], state: Optional[ModelState] = None) -> np.ndarray:
        """Log-probability of each token given what precedes it, in one forward pass."""
        if state is not None:
            return super().score(token_ids, state)
        ids = torch.tensor([[self.bos_id] + [int(t) for t in token_ids]], device=self.device)
        logits = self.model(input_ids=ids).logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1)
        return lp[torch.arange(len(token_ids)), ids[0, 1:]].double().cpu().numpy()
