"""The user's cache directory for converted models and derived tokenizer tables."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict

import numpy as np


def cache_dir() -> Path:
    """``$RELMQL_CACHE``, else ``$XDG_CACHE_HOME/relmql``, else ``~/.cache/relmql``."""
    root = os.environ.get("RELMQL_CACHE")
    if root:
        path = Path(root)
    else:
        path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "relmql"
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_json(name: str, build: Callable[[], Any]) -> Any:
    """``build()``'s result, kept in ``<cache>/<name>.json`` across runs."""
    path = cache_dir() / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    value = build()
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(value))
        os.replace(tmp, path)
    except OSError:
        pass
    return value


def cached_arrays(name: str, build: Callable[[], Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """``build()``'s named numpy arrays, kept in ``<cache>/<name>.npz`` across runs."""
    path = cache_dir() / f"{name}.npz"
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):  # damaged: built again
        pass
    value = build()
    tmp = path.with_name(f"{name}.{os.getpid()}.tmp.npz")
    try:
        np.savez_compressed(tmp, **value)
        os.replace(tmp, path)
    except OSError:
        pass
    return value
