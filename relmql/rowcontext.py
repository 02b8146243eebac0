"""What a result row can ask beyond its own columns: the prompt it followed and the probability
other models give it (``logprob_under()``), scored once per row and model."""

from __future__ import annotations

import os
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
            if self.models is None:
                raise Error(f"logprob_under({name!r}) needs models to score with", span, plan.source)
            try:
                got = self.models(ref)
                if plan.prompt is not None:
                    got = prompted(plan, got, name)
            except Error as e:
                e.message = f"logprob_under({name!r}): {e.message}"
                if e.span is None and span is not None:
                    e.span, e.source = span, plan.source
                raise
            self._loaded[name] = got
        return got

    def score(self, name: str, row, span=None) -> Optional[float]:
        """``logprob_under(name)`` of ``row``."""
        name = portable_name(name)
        key = (name, row.prefix, row.completion)
        if key not in self._scores:
            from .models.scoring import reply_logprob
            model = self.model(name, span)
            tokens = _reply_tokens(model, row.prefix, row.completion)
            self._scores[key] = None if tokens is None else reply_logprob(model, *tokens, self.plan.decoding.eos)
        return self._scores[key]


def _reply_tokens(model, prefix: str, completion: str):
    """The canonical tokens of a reply's prefix and completion under ``model``'s tokenizer after its
    prompt, as the query's automaton would have them (``models.scoring.reply_tokens``; a tokenizer
    that puts a space in front of a text, through the automaton of the reply itself)."""
    from .models.scoring import reply_tokens
    vocab = model.vocabulary
    if not vocab.prepend:
        return reply_tokens(vocab, model.context, prefix, completion)
    from .automata import compile
    from .syntax.regexes import escape
    automaton = compile(escape(prefix + completion), vocab, escape(prefix) if prefix else None, context=model.context)
    for tokens, npre in automaton.paths():
        if vocab.decode(tokens[:npre]) == prefix or not prefix:
            return tuple(tokens[:npre]), tuple(tokens[npre:])
    return None


def portable_name(name: str) -> str:
    """A model's name as every process reads it: a relative local directory by its absolute path."""
    return os.path.abspath(name) if os.path.isdir(name) and not os.path.isabs(name) else name


def prompted(plan, model, name: Optional[str] = None):
    """``model`` (the plan's, or the one called ``name``) after the plan's PROMPT, rendered for it
    (its errors under PROMPT's text)."""
    from .models.chat import render
    from .models.prompted import PromptedModel
    try:
        return PromptedModel(model, render(plan.prompt, model.vocabulary, name or plan.model.name))
    except Error as e:
        if e.span is None and plan.prompt_span is not None:
            e.span, e.source = plan.prompt_span, plan.source
        raise


__all__ = ["RowContext", "prompted", "portable_name"]
