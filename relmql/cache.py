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


def _cached(file: str, read: Callable[[Path], Any], write: Callable[[Path, Any], None],
            build: Callable[[], Any]) -> Any:
    """``build()``'s result, kept in ``<cache>/<file>`` across runs: read back where it can be,
    else built (again, where the file is damaged) and written where the cache can be written."""
    try:
        path = cache_dir() / file
    except OSError:  # no cache directory to be had (a read-only home): built each time
        return build()
    try:
        return read(path)
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        pass
    value = build()
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp, value)
        os.replace(tmp, path)
    except OSError:
        pass
    return value


def cached_json(name: str, build: Callable[[], Any]) -> Any:
    """``build()``'s result, kept in ``<cache>/<name>.json`` across runs."""
    return _cached(f"{name}.json", lambda p: json.loads(p.read_text()),
                   lambda p, v: p.write_text(json.dumps(v)), build)


def _read_arrays(path: Path) -> Dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def cached_arrays(name: str, build: Callable[[], Dict[str, np.ndarray]]) -> Dict[str, np.ndarray]:
    """``build()``'s named numpy arrays, kept (compressed) in ``<cache>/<name>.npz`` across runs."""
    return _cached(f"{name}.npz", _read_arrays, lambda p, v: np.savez_compressed(p, **v), build)
