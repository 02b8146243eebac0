"""The data-file readers of ``FOR EACH ROW IN``: JSONL, JSON, CSV and TSV rows as parameters
(docs/architecture.md, "Planning")."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping

from .options import PlanError

DATA_FILES = (".jsonl", ".csv", ".json", ".ndjson", ".tsv")  # the suffixes of the files read


def iter_rows(path: str, source: str = "", span=None) -> Iterator[Dict[str, Any]]:
    """The rows of a JSONL, JSON (a list of objects), CSV or TSV file as dicts, each with its 1-based
    ``row_number``. The file is UTF-8 text (a byte-order mark at its start is dropped)."""
    try:
        f = Path(path).expanduser().open(encoding="utf-8-sig", newline="")
    except OSError as e:
        raise PlanError(f"cannot open {path!r}: {e.strerror}", span, source or None) from None
    with f:
        try:
            yield from _file_rows(f, path, source, span)
        except UnicodeDecodeError as e:
            raise PlanError(f"cannot read {path!r}: not UTF-8 text ({e.reason})", span, source or None,
                            hint="save it as UTF-8 (iconv -f latin1 -t utf-8 does for Latin-1)") from None


def _file_rows(f, path: str, source: str, span) -> Iterator[Dict[str, Any]]:
    """``iter_rows`` of the open file ``f``."""
    lower = path.lower()
    if lower.endswith((".csv", ".tsv")):
        return _table_rows(f, path, source, span, tsv=lower.endswith(".tsv"))
    if lower.endswith(".json"):
        return _json_rows(f, path, source, span)
    return _jsonl_rows(f, path, source, span)


def _table_rows(f, path: str, source: str, span, tsv: bool) -> Iterator[Dict[str, Any]]:
    """The rows of a CSV file, or of a TSV file (``tsv``: no quoting, a cell is its text, quotes and all)."""
    reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else csv.DictReader(f)
    header = reader.fieldnames or []
    twice = next((h for i, h in enumerate(header) if h in header[:i]), None)
    if twice is not None:  # a dict keeps only the last
        raise PlanError(f"{path}: the header names {twice!r} twice", span, source or None,
                        hint="rename one of the columns in the file")
    for i, row in enumerate(reader, 1):
        cells = len(header) + len(row.get(None, ())) - sum(v is None for v in row.values())
        if cells != len(header):  # DictReader drops the cells past the header and fills missing ones with None
            raise PlanError(f"{path}, line {reader.line_num}: {cells} cell{'s' if cells != 1 else ''} where the "
                            f"header names {len(header)}", span, source or None,
                            hint=("a TSV cell cannot hold a tab: write the file as .csv, quoting that cell"
                                  if tsv else "quote a cell that holds the separator") if cells > len(header)
                            else "an empty cell is written as nothing between two separators")
        yield _fields(row, i, f"{path}, row {i}", span, source)


def _json_rows(f, path: str, source: str, span) -> Iterator[Dict[str, Any]]:
    """The rows of a .json file: a list of objects."""
    try:
        data = json.load(f)
    except json.JSONDecodeError as e:
        raise PlanError(f"{path}: not JSON: {e}", span, source or None) from None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise PlanError(f"{path}: a .json data file is a list of objects", span, source or None)
    for i, row in enumerate(data, 1):
        yield _fields(row, i, f"{path}, row {i}", span, source)


def _jsonl_rows(f, path: str, source: str, span) -> Iterator[Dict[str, Any]]:
    """The rows of a JSONL file: an object a line, blank lines skipped."""
    n = 0
    for line_no, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise PlanError(f"{path}, line {line_no}: not JSON: {e.msg}", span, source or None) from None
        if not isinstance(row, dict):
            raise PlanError(f"{path}, line {line_no}: each line must be a JSON object", span, source or None)
        n += 1
        yield _fields(row, n, f"{path}, line {line_no}", span, source)


def _field(name: str) -> str:
    return re.sub(r"\W", "_", str(name).strip())


def _fields(row: Mapping[Any, Any], number: int, where: str, span, source: str) -> Dict[str, Any]:
    """A data row's fields as parameters (names made :name-able) and its ``row_number``; two
    fields that would be one parameter are an error, not a silent choice."""
    out: Dict[str, Any] = {}
    named: Dict[str, Any] = {}
    for k, v in row.items():
        name = _field(k)
        if name in named or name == "row_number":
            first = "row_number (the row's number)" if name == "row_number" else repr(named[name])
            raise PlanError(f"{where}: the fields {first} and {k!r} would both be :{name}", span, source or None,
                            hint="rename one of them in the file")
        named[name], out[name] = k, v
    out["row_number"] = number
    return out

