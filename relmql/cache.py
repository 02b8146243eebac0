"""The user's cache directory for converted models and derived tokenizer tables."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable


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
