"""The language-model protocol every backend implements."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import ModelError
from .vocab import Vocabulary


@dataclass(eq=False)
class ModelState:
    """What a model has read.

    ``tokens``: everything read, the start-of-text token first. ``logprobs``: float32
    log-probabilities of the next token, one per token id (on the model's device; callers may
    drop it once used). ``token_logprobs``: the log-probability of each token this state's
    ``extend`` call read, given what came before it (NaN for the first one when it was read
    after an existing state, whose ``logprobs`` hold it). ``cache``: the backend's record of
    the keys and values, so that extending the state reads only the new tokens.
    """

    tokens: Tuple[int, ...]
    logprobs: Optional[torch.Tensor]
    token_logprobs: Optional[np.ndarray] = None
    cache: Any = field(default=None, repr=False)

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass
class ModelStats:
    """Work done by a model: forward passes, tokens read, seconds inside forward passes,
    and tokens read again because their cached keys and values had been evicted."""

    calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    recomputed: int = 0


class LanguageModel(abc.ABC):
    """A causal language model over a ``Vocabulary``.

    ``extend(states, tokens)`` reads, for each sequence, the given tokens after what its state
    has read (a state of None starts a text: the start-of-text token is read first) and returns
    the new states, batched into as few forward passes as the backend can. States are immutable:
    extending a state leaves it usable for other continuations.
    """

    name: str
    vocabulary: Vocabulary
    device: torch.device
    stats: ModelStats
    approximate: Optional[str] = None  # why its probabilities are approximate; None when exact
    max_length: Optional[int] = None  # the most tokens it reads at once (its context), start token included

    def context_error(self, needed: int, what: str = "",
                      hint: str = "lower max_prefix_tokens or max_tokens, shorten PREFIX, or use a model with a "
                                  "longer context") -> ModelError:
        """The error of a text of ``needed`` tokens (the start token included, ``what`` it is for)
        past what the model reads."""
        return ModelError(f"{self.name} reads at most {self.max_length:,} tokens (its context length), the start "
                          f"token included; this query needs {needed:,}{what}", hint=hint)

    @property
    def eos_id(self) -> int:
        return self.vocabulary.eos_id

    @property
    def bos_id(self) -> int:
        return self.vocabulary.bos_id

    @property
    def start_tokens(self) -> Tuple[int, ...]:
        """What every text is read after: the start-of-text token (a prompted model's prompt)."""
        return (self.bos_id,)

    @property
    def context(self) -> Tuple[int, ...]:
        """The tokens right before a text whose characters its first tokens may join in the
        tokenizer's chunks (a prompt's text after its last special token); none at a text's start."""
        return ()

    def begin(self, ids: Sequence[int]) -> ModelState:
        """The state after reading ``ids`` from the very start (no start token added)."""
        ids = [int(t) for t in ids]
        if ids and ids[0] == self.bos_id:
            return self.extend([None], [ids[1:]])[0]
        raise ModelError(f"{self.name} cannot read a text that does not begin with its start token")

    @abc.abstractmethod
    def extend(self, states: Sequence[Optional[ModelState]], tokens: Sequence[Sequence[int]]) -> List[ModelState]:
        """New states after reading ``tokens[i]`` on top of ``states[i]``."""

    def set_cache_budget(self, nbytes: int) -> None:
        """Keep at most about ``nbytes`` of cached state (keys and values) from now on; a backend
        without such a cache ignores it."""

    def start(self) -> ModelState:
        """The state at the start of a text (after the start-of-text token)."""
        return self.extend([None], [[]])[0]

    def score(self, token_ids: Sequence[int], state: Optional[ModelState] = None) -> np.ndarray:
        """The log-probability of each token of ``token_ids`` given everything before it."""
        state = state or self.start()
        out = np.empty(len(token_ids), np.float64)
        for i, tok in enumerate(token_ids):
            out[i] = float(state.logprobs[tok])
            if i + 1 < len(token_ids):
                state = self.extend([state], [[tok]])[0]
        return out
