"""The search's model calls made in a worker thread, one in flight while the host takes in the
last one's results and picks the next batch (design: docs/executor.md, "The pipelined search")."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import List, Optional, Tuple

import torch

from ..models.base import LanguageModel, ModelState
from ..records import Decoding
from .decoding import RuleScores
from .expansion import Sent, stacked


class Flight:
    """At most one model call in flight: ``start`` hands a call to the worker thread, ``land``
    waits for it and returns it with the model's states and their scores under ``rules`` (the
    exact top-k over the vocabulary is the model's side's work: on a GPU only the kept tokens
    and their scores cross to the host), or raises what the call raised."""

    def __init__(self, model: LanguageModel, rules: Decoding):
        self.model, self.rules = model, rules
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="relmql-model")
        self.call: Optional[Tuple[Sent, Future]] = None  # the call in flight
        # on CUDA the calls run on a stream of their own: the host's reads of the last call's
        # scores, on the default stream, then do not queue behind the kernels of the call in flight
        device = getattr(model, "device", None)
        self.stream = torch.cuda.Stream(device) if getattr(device, "type", None) == "cuda" else None

    @property
    def busy(self) -> bool:
        """Whether a call is in flight."""
        return self.call is not None

    def start(self, sent: Sent) -> None:
        """Make the model call ``sent`` in the worker thread."""
        assert self.call is None, "one call in flight at a time"
        self.call = (sent, self.pool.submit(self._call, sent))

    def _call(self, sent: Sent) -> Tuple[List[ModelState], RuleScores]:
        if self.stream is None:
            return self._scored(sent)
        with torch.cuda.stream(self.stream):
            got = self._scored(sent)
        self.stream.synchronize()  # done before the host reads it on another stream
        return got

    def _scored(self, sent: Sent) -> Tuple[List[ModelState], RuleScores]:
        outs = self.model.extend(sent.parents, sent.tokens)
        return outs, RuleScores(stacked(outs), self.rules)

    def land(self) -> Tuple[Sent, List[ModelState], RuleScores]:
        """The call in flight, once made: what was sent, the states and their scores."""
        sent, future = self.call
        self.call = None
        outs, scores = future.result()
        return sent, outs, scores

    def close(self) -> None:
        """Wait for a call still in flight (its results dropped) and end the worker thread."""
        if self.call is not None:
            self.call[1].exception()
            self.call = None
        self.pool.shutdown(wait=True)


def pipelined(opts, model: LanguageModel) -> bool:
    """Whether a search makes its model calls in flight: as ``opts.pipeline`` says, else where the
    model is not on a CPU (there the host's work and the forward pass share the cores)."""
    if opts.pipeline is not None:
        return opts.pipeline
    device = getattr(model, "device", None)
    return device is not None and getattr(device, "type", str(device)) != "cpu"
