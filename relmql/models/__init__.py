"""Language models: the protocol (``base``), models by name (``registry``: ``load_model``, the
built-in table, ``ModelCache``), the transformers backend (``hf``) and the built-in models'
loaders (``builtin``); device and dtype resolution is shared by both (``device``)."""

from __future__ import annotations

from .registry import BUILTIN_MODELS, DEFAULT_MODEL, ModelCache, check_model_name, load_model
from .vocab import Vocabulary


def __getattr__(name):
    # the protocol imports torch: load it on first use, so that `relmql --help` does not
    if name in ("LanguageModel", "ModelState"):
        from . import base
        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LanguageModel", "ModelState", "Vocabulary", "load_model", "ModelCache", "BUILTIN_MODELS", "DEFAULT_MODEL",
           "check_model_name"]
