"""Models by name: the one table of built-in models, the paper's hub names, ``load_model``, and
``ModelCache``, the models a session (or a Ray worker) has loaded.

Nothing here imports torch: a loader's module is imported when its model is first loaded, so that
listing the names (``relmql --help``) stays light.
"""

from __future__ import annotations

import importlib
import os
import threading
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Tuple

from ..errors import ModelError, closest

if TYPE_CHECKING:
    from .base import LanguageModel

DEFAULT_MODEL = "smollm2-135m"

# The built-in models: name → loader, "module:function" in this package, called as function(device=, dtype=).
BUILTIN: Dict[str, str] = {
    "smollm2-135m": "builtin:load_smollm2",
    "gemma3-270m": "builtin:load_gemma3",
    "tiny-gpt2": "builtin:load_tiny_gpt2",
}
BUILTIN_MODELS = tuple(BUILTIN)

# The paper's models by their short names: loaded from the Hugging Face cache (or downloaded).
HUB_ALIASES = {name: f"openai-community/{name}" for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")}


def load_model(name: str = DEFAULT_MODEL, device: Optional[str] = None, dtype: Optional[str] = None) -> LanguageModel:
    """A model by name: a built-in one, a local directory, or a Hugging Face hub id.

    ``device``: cpu, cuda, cuda:N or auto (default); ``dtype``: float32 (default: exact),
    bfloat16, float16 or auto (the fastest the hardware runs natively; approximate).
    """
    check_model_name(name)
    if name in BUILTIN:
        module, function = BUILTIN[name].split(":")
        return getattr(importlib.import_module(f".{module}", __package__), function)(device=device, dtype=dtype)
    from .loading import from_pretrained
    return from_pretrained(HUB_ALIASES.get(name, name), device=device, dtype=dtype)


def check_model_name(name: str) -> None:
    """A ``ModelError`` for a name that ``load_model`` cannot take, without loading anything:
    one neither built in, nor a hub alias, a local directory or a hub id (``owner/name``); a path
    (``/``, ``./``, ``../``) that is no directory."""
    if name.startswith(("/", "./", "../")) and not os.path.isdir(name):
        raise ModelError(f"no model directory {name!r}" + (": it is a file" if os.path.exists(name) else ""),
                         hint="give the folder that holds the model's config.json and tokenizer files, "
                              "a built-in model's name or a Hugging Face model id")
    if name in BUILTIN or name in HUB_ALIASES or os.path.isdir(name) or "/" in name:
        return
    near = closest(name, BUILTIN_MODELS + tuple(HUB_ALIASES))
    raise ModelError(f"unknown model {name!r}" + (f"; did you mean {near!r}?" if near else ""),
                     hint=f"built-in models: {', '.join(BUILTIN_MODELS)}; or give a local directory "
                          "or a Hugging Face model id (gpt2 and gpt2-xl stand for openai-community/...)")


class ModelCache:
    """The models loaded so far, one per (name, device, dtype), each loaded on first use.

    Called with a ``ModelRef`` (anything with ``name``, ``device`` and ``dtype``) it gives that
    model, which makes it the ``models`` the engine runs plans with. ``put`` adds a model loaded
    elsewhere (tests share one copy between sessions). Threads that ask for a model not yet
    loaded wait for one load; they do not each load a copy.
    """

    def __init__(self):
        self._models: Dict[Tuple[str, Optional[str], Optional[str]], LanguageModel] = {}
        self.after_load: Optional[Callable[[LanguageModel], None]] = None  # called with each model loaded
        self._loading = threading.Lock()

    def __call__(self, ref) -> LanguageModel:
        key = (ref.name, ref.device, ref.dtype)
        model = self._models.get(key)
        if model is not None:
            return model
        with self._loading:
            if key not in self._models:
                model = load_model(ref.name, device=ref.device, dtype=ref.dtype)
                if self.after_load is not None:
                    self.after_load(model)
                self._models[key] = model
        return self._models[key]

    def put(self, name: str, device: Optional[str], dtype: Optional[str], model: LanguageModel) -> None:
        """Hold ``model`` as the one loaded for ``name`` on ``device`` in ``dtype``."""
        self._models[(name, device, dtype)] = model

    def names(self) -> List[str]:
        """The names of the models held, in the order they were loaded (a name once per device and dtype)."""
        return [name for name, _, _ in self._models]

    def copy(self) -> ModelCache:
        """A new cache holding the same models (clearing one leaves the other as it is)."""
        new = ModelCache()
        new._models = dict(self._models)
        return new

    def clear(self) -> None:
        """Forget every model held."""
        self._models.clear()
