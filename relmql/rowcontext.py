"""What a result row can ask beyond its own columns: the prompt it followed and the probability
other models give it (``logprob_under()``), scored once per row and model."""

from __future__ import annotations

from typing import Callable, Dict, Optional, Tuple

from .errors import Error
from .records import ModelRef

Models = Callable[[ModelRef], object]


class RowContext:
    """The rows of one query on one model: ``prompt`` as the model read it (raw text, or the
    conversation its chat template rendered), and ``score(name, row)``, the log-probability the
    model ``name`` gives the row's reply after the same PROMPT and PREFIX (each model loaded from
    ``models`` once, each row scored once)."""

    def __init__(self, plan, models: Optional[Models], prompt: Optional[str] = None,
                 scores: Optional[Dict[Tuple[str, str, str], Optional[float]]] = None):
        self.plan, self.models, self.prompt = plan, models, prompt
        self._loaded: Dict[str, object] = {}
        self._scores: Dict[Tuple[str, str, str], Optional[float]] = scores if scores is not None else {}

    def model(self, name: str, span=None):
        """The model ``name``, after the plan's PROMPT rendered for it (loaded once)."""
        got = self._loaded.get(name)
        if got is None:
            plan = self.plan
            ref = ModelRef(name, plan.model.device, plan.model.dtype)
            try:
                got = self.models(ref) if self.models is not None else None
            except Error as e:
                e.message = f"logprob_under({name!r}): {e.message}"
                if e.span is None and span is not None:
                    e.span, e.source = span, plan.source
                raise
            if got is None:
                raise Error(f"logprob_under({name!r}) needs models to score with", span, plan.source)
            if plan.prompt is not None:
                got = prompted(plan, got)
            self._loaded[name] = got
        return got

    def score(self, name: str, row, span=None) -> Optional[float]:
        """``logprob_under(name)`` of ``row``."""
        key = (name, row.prefix, row.completion)
        if key not in self._scores:
            from .models.scoring import reply_logprob
            self._scores[key] = reply_logprob(self.model(name, span), row.prefix, row.completion,
                                              self.plan.decoding.eos)
        return self._scores[key]


def prompted(plan, model):
    """``model`` after the plan's PROMPT, rendered for it (its errors under PROMPT's text)."""
    from .models.chat import render
    from .models.prompted import PromptedModel
    try:
        return PromptedModel(model, render(plan.prompt, model.vocabulary, plan.model.name))
    except Error as e:
        if e.span is None and plan.prompt_span is not None:
            e.span, e.source = plan.prompt_span, plan.source
        raise


__all__ = ["RowContext", "prompted"]
