"""A model that has read a prompt: texts start after the prompt's tokens instead of the start token."""

from __future__ import annotations

import threading
import weakref
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ModelError
from ..memory import Lru
from .base import LanguageModel, ModelState
from .chat import Rendered


KEEP_PROMPTS = 8  # prompt states kept per model: the queries of a script or a dataset that share a prompt
_STATES: "weakref.WeakKeyDictionary[LanguageModel, Lru]" = weakref.WeakKeyDictionary()  # prompt ids → state
_LOCK = threading.Lock()


def prompt_state(base: LanguageModel, ids: Tuple[int, ...]) -> ModelState:
    """``base``'s state after the prompt ``ids``, read once for the last few prompts (its keys and
    values stay in the model's cache as any other text's do, read again if they were evicted)."""
    with _LOCK:
        held = _STATES.setdefault(base, Lru(KEEP_PROMPTS))  # each prompt counts 1
        state = held.get(ids)
        if state is not None:
            return state
    state = base.begin(ids)
    with _LOCK:
        held.put(ids, state)
    return state


class PromptedModel(LanguageModel):
    """``base`` after ``rendered``'s tokens: ``extend`` from no state reads on from the prompt,
    whose keys and values are computed once (on first use) and shared by every text after it.
    ``max_length`` counts the prompt as the start token (what is left after it, plus one), and
    ``eos_id`` is the chat template's end of turn. Everything else is the base model's. The
    prompt's state is shared by the views of one model with the same prompt (``prompt_state``)."""

    def __init__(self, base: LanguageModel, rendered: Rendered):
        self.base, self.rendered = base, rendered
        self.name, self.vocabulary, self.device, self.stats = base.name, base.vocabulary, base.device, base.stats
        self.approximate = base.approximate
        n = len(rendered.ids)
        if base.max_length is not None and n + 1 > base.max_length:
            raise ModelError(f"the prompt is {n:,} tokens, and {base.name} reads at most {base.max_length:,} "
                             f"(its context length): no token of a reply fits after it",
                             hint="shorten PROMPT, or use a model with a longer context")
        self.max_length = None if base.max_length is None else base.max_length - n + 1
        self._state: Optional[ModelState] = None
        self._lock = threading.Lock()

    def __getattr__(self, name):  # the backend's own attributes (dtype, attention, kv_bytes...)
        if name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)

    @property
    def eos_id(self) -> int:
        eot = self.rendered.end_of_turn
        return self.base.eos_id if eot is None else eot

    @property
    def start_tokens(self) -> Tuple[int, ...]:
        return self.rendered.ids

    @property
    def context(self) -> Tuple[int, ...]:
        return self.rendered.tail

    def prompt_state(self) -> ModelState:
        """The state after the prompt (read once)."""
        with self._lock:
            if self._state is None:
                self._state = prompt_state(self.base, self.rendered.ids)
            return self._state

    def set_cache_budget(self, nbytes: int) -> None:
        self.base.set_cache_budget(nbytes)

    def extend(self, states: Sequence[Optional[ModelState]], tokens: Sequence[Sequence[int]]) -> List[ModelState]:
        if all(s is not None for s in states):
            return self.base.extend(states, tokens)
        start = self.prompt_state()
        out: List[Optional[ModelState]] = [None] * len(states)
        todo = []
        for k, (s, new) in enumerate(zip(states, tokens)):
            if s is None and not len(new):  # nothing read after the prompt: no token's probability
                out[k] = ModelState(start.tokens, start.logprobs, np.empty(0), start.cache)
            else:
                todo.append(k)
        if todo:
            got = self.base.extend([states[k] or start for k in todo], [tokens[k] for k in todo])
            for k, st in zip(todo, got):
                if states[k] is None and st.token_logprobs is not None and len(st.token_logprobs):
                    # from the start, every token's probability is known: the first from the prompt's state
                    lps = np.array(st.token_logprobs, np.float64)
                    lps[0] = float(start.logprobs[int(tokens[k][0])])
                    st = ModelState(st.tokens, st.logprobs, lps, st.cache)
                out[k] = st
        return out  # type: ignore[return-value]


__all__ = ["PromptedModel"]
