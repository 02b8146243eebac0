"""Language models: the protocol, the transformers backend and the built-in models, by name."""

from __future__ import annotations

import os
from typing import Callable, Dict, Optional

from ..errors import ModelError, closest
from .vocab import Vocabulary

DEFAULT_MODEL = "smollm2-135m"


def _builtin() -> Dict[str, Callable[..., LanguageModel]]:
    from .builtin import load_smollm2, load_tiny_gpt2
    return {"smollm2-135m": load_smollm2, "tiny-gpt2": load_tiny_gpt2}


BUILTIN_MODELS = ("smollm2-135m", "tiny-gpt2")

# The paper's models by their short names: loaded from the Hugging Face cache (or downloaded).
HUB_ALIASES = {name: f"openai-community/{name}" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}


def load_model(name: str = DEFAULT_MODEL, device: Optional[str] = None, dtype: Optional[str] = None) -> LanguageModel:
    """A model by name: a built-in one, a local directory, or a Hugging Face hub id.

    ``device``: cpu, cuda, cuda:N or auto (default); ``dtype``: float32 (default: exact),
    bfloat16, float16 or auto (the fastest the hardware runs natively; approximate).
    """
    builtin = _builtin()
    if name in builtin:
        return builtin[name](device=device, dtype=dtype)
    name = HUB_ALIASES.get(name, name)
    if os.path.isdir(name) or "/" in name:
        from .hf import TransformersModel
        return TransformersModel.from_pretrained(name, device=device, dtype=dtype)
    near = closest(name, BUILTIN_MODELS + tuple(HUB_ALIASES))
    raise ModelError(f"unknown model {name!r}" + (f"; did you mean {near!r}?" if near else ""),
                     hint=f"built-in models: {', '.join(BUILTIN_MODELS)}; or give a local directory "
                          "or a Hugging Face model id (gpt2 and gpt2-xl stand for openai-community/...)")


def __getattr__(name):
    # the protocol imports torch: load it on first use, so that `relmql --help` does not
    if name in ("LanguageModel", "ModelState"):
        from . import base
        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LanguageModel", "ModelState", "Vocabulary", "load_model", "BUILTIN_MODELS", "DEFAULT_MODEL"]
