"""Formatting of result rows."""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
import shutil
import sys
from typing import IO, Iterable, Iterator, List, Optional, Sequence

from ..errors import Error, display_width

FORMATS = ("table", "csv", "json", "jsonl")
_NUMERIC_WIDTH = 13  # a float to 6 significant digits: -1.23457e-225


# characters that would move the cursor, ring, recolour or reorder the terminal: written escaped
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(m: "re.Match") -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def format_value(v, width: Optional[int] = None) -> str:
    """A value as a table cell: floats to 6 significant digits, NULL, control characters escaped
    (``\\n``, ``\\x1b``; a backslash doubled); cut to
    ``width`` with '…', except numbers, which are never cut (they run past their column)."""
    if v is None:
        text = "NULL"
    elif isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, float) and getattr(v, "exact", True) is False:  # an estimate, with its interval
        text = v.text()
    elif isinstance(v, float):
        text = f"{v:.6g}"
    elif isinstance(v, (list, tuple)):
        text = "[" + ", ".join(format_value(x) for x in v) + "]"
    elif isinstance(v, dict):  # a data file's JSON object, as JSON
        text = json.dumps(v, ensure_ascii=False)
    else:
        text = _CONTROL.sub(_escape, str(v).replace("\\", "\\\\"))
    if width is not None and display_width(text) > width and not _numeric(v):  # wide characters take two columns
        while text and display_width(text) > width - 1:
            text = text[:-1]
        text += "…"
    return text


def estimate_note(rows: Iterable[tuple]) -> Optional[str]:
    """What a table of these rows should say about estimated values, if it holds any: the draws
    behind them (a group's are the draws whose prefix is of its class: with GROUP BY gender,
    each gender's own), the confidence and the kind of interval."""
    estimates = [v for r in rows for v in r if getattr(v, "exact", True) is False]
    if not estimates:
        return None
    v = estimates[0]
    low, high = min(e.draws for e in estimates), max(e.draws for e in estimates)
    draws = f"{low:,} draws" if low == high else f"{low:,} to {high:,} draws a group"
    return (f"probability() estimated from {draws}; in brackets: {v.confidence:.0%} "
            f"intervals ({'Wilson' if v.method == 'wilson' else 'normal approximation'})")


def _plain(v):
    """An estimate as its value, for machine formats (ci_low()/ci_high() give the interval)."""
    return float(v) if isinstance(v, float) else v


def _numeric(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _line(widths, left, mid, right) -> str:
    return left + mid.join("─" * (w + 2) for w in widths) + right


def _cells(values, widths, numeric) -> str:
    parts = []
    for v, w, num in zip(values, widths, numeric):
        pad = " " * max(0, w - display_width(v))
        parts.append(" " + (pad + v if num else v + pad) + " ")
    return "│" + "│".join(parts) + "│"


def render_table(columns: Sequence[str], rows: Sequence[tuple], max_rows: Optional[int] = None,
                 max_width: Optional[int] = None, more: bool = False) -> str:
    """A boxed table of ``rows`` sized to fit (cells cut to fit ``max_width``); at most ``max_rows``
    shown, with a line saying how many were left out (``more``: there are more not fetched)."""
    max_width = max_width or shutil.get_terminal_size((120, 24)).columns
    shown = list(rows if max_rows is None else rows[:max_rows])
    cells = [[format_value(v) for v in r] for r in shown]
    widths = [max([display_width(c)] + [display_width(r[i]) for r in cells]) for i, c in enumerate(columns)]
    budget = max_width - (3 * len(columns) + 1)
    # a column is never cut below 8, nor below its widest number (numbers are never cut: the
    # border after them would move); a table that cannot fit then runs past the screen, as psql's
    floors = [max([8] + [display_width(c[i]) for c, r in zip(cells, shown) if _numeric(r[i])])
              for i in range(len(columns))]
    while sum(widths) > budget:
        over = [w - f for w, f in zip(widths, floors)]
        if max(over) <= 0:
            break
        i = max((k for k, o in enumerate(over) if o > 0), key=widths.__getitem__)  # the widest that can give
        widths[i] = max(floors[i], widths[i] - max(1, sum(widths) - budget))
    numeric = [bool(shown) and all(_numeric(r[i]) or r[i] is None for r in shown) for i in range(len(columns))]
    out = [_line(widths, "┌", "┬", "┐"), _cells([format_value(c, w) for c, w in zip(columns, widths)], widths,
                                                [False] * len(widths)),
           _line(widths, "├", "┼", "┤")]
    for r in shown:
        out.append(_cells([format_value(v, w) for v, w in zip(r, widths)], widths, numeric))
    out.append(_line(widths, "└", "┴", "┘"))
    left = len(rows) - len(shown)
    n = len(rows)
    if more:  # the rows after these were not computed
        out.append(f"(first {len(shown)} row{'s' if len(shown) != 1 else ''} shown; more not fetched)")
    elif left > 0:
        out.append(f"({len(shown)} of {n} rows shown)")
    else:
        out.append(f"({n} row{'s' if n != 1 else ''})")
    note = estimate_note(shown)
    if note:
        out[-1] = out[-1][:-1] + f"; {note})"
    return "\n".join(out)


class StreamingTable:
    """A boxed table printed row by row as rows arrive: numbers get fixed widths, text columns
    share the rest of the terminal's width."""

    def __init__(self, columns: Sequence[str], out: IO[str], width: Optional[int] = None,
                 kinds: Optional[Sequence[str]] = None):
        self.columns, self.out, self.count = list(columns), out, 0
        width = width or shutil.get_terminal_size((120, 24)).columns
        kinds = kinds or ["text"] * len(columns)
        fixed = {"number": _NUMERIC_WIDTH, "rank": 5, "bool": 9}
        widths = [max(display_width(c), fixed.get(k, 0)) for c, k in zip(columns, kinds)]
        flexible = [i for i, k in enumerate(kinds) if k not in fixed]
        budget = width - (3 * len(columns) + 1) - sum(widths[i] for i in range(len(widths)) if i not in flexible)
        for i in flexible:
            widths[i] = max(display_width(columns[i]), 8, budget // max(1, len(flexible)))
        self.widths = widths
        self.numeric = [k in ("number", "rank") for k in kinds]
        self._head = False
        self.note: Optional[str] = None

    def _write(self, text):
        self.out.write(text + "\n")
        self.out.flush()

    def row(self, values: tuple):
        if not self._head:
            self.header()
        self.count += 1
        self.note = self.note or estimate_note([values])
        self._write(_cells([format_value(v, w) for v, w in zip(values, self.widths)], self.widths, self.numeric))

    def header(self):
        self._head = True
        self._write(_line(self.widths, "┌", "┬", "┐"))
        self._write(_cells([format_value(c, w) for c, w in zip(self.columns, self.widths)], self.widths,
                           [False] * len(self.widths)))
        self._write(_line(self.widths, "├", "┼", "┤"))

    def close(self):
        if not self._head:
            self.header()
        self._write(_line(self.widths, "└", "┴", "┘"))
        self._write(f"({self.count} row{'s' if self.count != 1 else ''}" + (f"; {self.note})" if self.note else ")"))


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, tuple):
        return list(v)
    return v


class Sink:
    """A stream results are written to, named: a write that fails (a full disk) is an ``Error``
    that names it; a reader that went away (``| head``) is still a ``BrokenPipeError``. It counts
    the ``results`` and JSON ``arrays`` written to it, whichever script or -c wrote them."""

    def __init__(self, stream: IO[str], name: str):
        self.stream, self.name, self.failed = stream, name, False
        self.results = self.arrays = 0

    def _call(self, method, *args):
        try:
            return method(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            self.failed = True
            raise Error(f"cannot write {self.name}: {e.strerror or e}") from None

    def write(self, text: str) -> int:
        return self._call(self.stream.write, text)

    def flush(self) -> None:
        self._call(self.stream.flush)

    def isatty(self) -> bool:
        return self.stream.isatty()

    def close(self) -> None:
        """Close the stream, quietly: ``flush()`` first to hear of a failure."""
        try:
            self.stream.close()
        except OSError:
            pass


def started(rows: Iterable[tuple]) -> Iterator[tuple]:
    """``rows`` with the first one read now: an error (or Ctrl-C) before it is raised before
    anything, a header or a separator, is written."""
    rows = iter(rows)
    for first in rows:
        return itertools.chain((first,), rows)
    return iter(())


def write(columns: Sequence[str], rows: Iterable[tuple], fmt: str, out: IO[str], stream: bool = False,
          kinds: Optional[Sequence[str]] = None, width: Optional[int] = None) -> int:
    """Write ``rows`` in format ``fmt``, each row as soon as it arrives (tables: when ``stream``,
    ``width`` columns wide, otherwise sized to fit once all rows are in); returns the number of
    rows. Nothing is written when reading the first row fails; a later failure (an error, Ctrl-C)
    still writes the rows before it as a whole table or a closed JSON array, then is raised."""
    n = 0
    rows = started(rows)
    if fmt == "table":
        if stream:
            table = StreamingTable(columns, out, width=width, kinds=kinds)
            try:
                for r in rows:
                    table.row(r)
            finally:
                table.close()
            return table.count
        buffered: List[tuple] = []
        try:
            buffered.extend(rows)
        finally:
            out.write(render_table(columns, buffered, max_width=width) + "\n")
        return len(buffered)
    rows = (tuple(_plain(v) for v in r) for r in rows)
    if fmt == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(columns)
        for r in rows:
            w.writerow([_csv_cell(v) for v in r])
            out.flush()
            n += 1
        return n
    if fmt in ("json", "jsonl"):
        nulled = 0  # rows with an infinity or NaN, which JSON cannot write
        if fmt == "json":
            out.write("[")
        try:
            for r in rows:
                nulled += any(isinstance(v, float) and not math.isfinite(v) for v in r)
                obj = json.dumps({c: _jsonable(v) for c, v in zip(columns, r)}, ensure_ascii=False)
                out.write(obj + "\n" if fmt == "jsonl" else ("," if n else "") + "\n  " + obj)
                out.flush()
                n += 1
        finally:
            if fmt == "json":
                out.write("\n]\n" if n else "]\n")
            if nulled:
                print(f"note: JSON has no infinity or NaN: written as null in {nulled:,} "
                      f"row{'s' if nulled != 1 else ''}", file=sys.stderr)
        return n
    raise ValueError(f"unknown format {fmt!r}; use {', '.join(FORMATS)}")


def _csv_cell(v):
    """A CSV cell: lists as JSON, NULL empty, booleans as the table and JSON write them."""
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(list(v) if isinstance(v, tuple) else v, ensure_ascii=False)
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else v
