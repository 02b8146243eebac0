"""The model states a sampler keeps: its prefixes' and the completions it has read (design:
docs/executor.md, "Inside the sampler")."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from ..memory import Lru
from ..models.base import LanguageModel, ModelState


class StateCache:
    """Each prefix path's model state and probability (``prefixes``, oldest first: a prefix read
    again is not made recent) and the state after each completion already read (``seen``, keyed
    ``(prefix, completion tokens)``, least recently used first): at most ``size`` each."""

    def __init__(self, model: LanguageModel, size: int, batch_size: int, context: int):
        self.model = model
        self.batch_size = batch_size  # prefixes read per model call
        self.context = context  # tokens the model reads at most
        self.prefixes = Lru(size, keep=0)  # prefix path -> (its model state, its log-probability)
        self.seen = Lru(size, keep=0)  # (prefix path, completion tokens) -> model state

    def prefix_states(self, paths: List[Tuple[int, ...]]) -> List[Tuple[ModelState, float]]:
        """Each prefix path's model state and log-probability: read (``batch_size`` a model call)
        where not cached."""
        prefixes = self.prefixes
        todo = sorted({p for p in paths if p not in prefixes})
        longest = 1 + max(map(len, todo), default=0)  # with the start token
        if longest > self.context:  # said here, where it is known to be the prefix that does not fit
            raise self.model.context_error(longest, " for a prefix",
                                           hint="shorten PREFIX, or use a model with a longer context")
        got: Dict[Tuple[int, ...], Tuple[ModelState, float]] = {}
        for k in range(0, len(todo), self.batch_size):
            part = todo[k:k + self.batch_size]
            for path, st in zip(part, self.model.extend([None] * len(part), [list(p) for p in part])):
                got[path] = (st, float(np.nansum(st.token_logprobs)))
        out = [got.get(p) or prefixes.peek(p) for p in paths]
        for path, value in got.items():
            prefixes.put(path, value)
        return out

    def advance(self, keys: List[tuple], parents: List[ModelState]) -> List[ModelState]:
        """The states after each completion ``keys[i]`` (``(prefix, tokens)``), whose last token
        follows ``parents[i]``: from the cache when already seen, the others from one model call
        (a key met twice is read once)."""
        seen, out = self.seen, [None] * len(keys)
        todo: Dict[tuple, List[int]] = {}
        for i, key in enumerate(keys):
            got = seen.get(key)
            if got is not None:
                out[i] = got
            else:
                todo.setdefault(key, []).append(i)
        if todo:
            new = list(todo)
            states = self.model.extend([parents[todo[k][0]] for k in new], [[k[1][-1]] for k in new])
            for key, st in zip(new, states):
                for i in todo[key]:
                    out[i] = st
                seen.put(key, st)
        return out
