"""The user's cache directory for converted models and derived tokenizer tables."""

from __future__ import annotations

import json
import os
import time
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, Optional

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


STALE_DAYS = 30  # an earlier version of a table, unused this long, is removed


def _cached(file: str, read: Callable[[Path], Any], write: Callable[[Path, Any], None],
            build: Callable[[], Any], versions: Optional[str] = None) -> Any:
    """``build()``'s result, kept in ``<cache>/<file>`` across runs: read back where it can be,
    else built (again, where the file is damaged) and written where the cache can be written.
    ``versions``: a pattern for the files of every version of the same table (another relmql's);
    when this one is written, those not read for ``STALE_DAYS`` are removed."""
    try:
        path = cache_dir() / file
    except OSError:  # no cache directory to be had (a read-only home): built each time
        return build()
    try:
        value = read(path)
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        pass
    else:
        if versions is not None:
            _touch(path)  # read: not stale
        return value
    value = build()
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(tmp, value)
        os.replace(tmp, path)
    except OSError:
        return value
    if versions is not None:
        _prune(path, versions)
    return value


def _touch(path: Path) -> None:
    """Mark a file as read today (at most once a day: a modification time, not an access time,
    which many file systems do not keep)."""
    try:
        if time.time() - path.stat().st_mtime > 86_400:
            os.utime(path)
    except OSError:
        pass


def _prune(path: Path, pattern: str) -> None:
    """Remove the other files matching ``pattern`` beside ``path`` that no relmql has read for
    ``STALE_DAYS`` (a version still in use elsewhere keeps its file)."""
    cutoff = time.time() - STALE_DAYS * 86_400
    for old in path.parent.glob(pattern):
        try:
            if old != path and old.stat().st_mtime < cutoff:
                old.unlink()
        except OSError:
            pass


def cached_json(name: str, build: Callable[[], Any], versions: Optional[str] = None) -> Any:
    """``build()``'s result, kept in ``<cache>/<name>.json`` across runs (``versions``: see
    ``_cached``)."""
    return _cached(f"{name}.json", lambda p: json.loads(p.read_text()),
                   lambda p, v: p.write_text(json.dumps(v)), build, versions)


def _read_arrays(path: Path) -> Dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def cached_arrays(name: str, build: Callable[[], Dict[str, np.ndarray]],
                  versions: Optional[str] = None) -> Dict[str, np.ndarray]:
    """``build()``'s named numpy arrays, kept (compressed) in ``<cache>/<name>.npz`` across runs
    (``versions``: see ``_cached``)."""
    return _cached(f"{name}.npz", _read_arrays, lambda p, v: np.savez_compressed(p, **v), build, versions)
