"""Pictures of results: grouped bars, cumulative rows over time, and the CDF of a numeric column.

Entry point: ``plot(columns, rows, path)`` (``Result.plot(path)``, ``relmql --plot FILE``, the
shell's ``.plot FILE``). Headless: a ``matplotlib.figure.Figure`` saved by its own canvas, no
pyplot, matplotlib imported only when a picture is drawn.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

from ..errors import Error, closest
from .format import format_value

__all__ = ["PLOT_KINDS", "EXTENSIONS", "MAX_BARS", "plot", "figure", "to_svg", "check_path"]

PLOT_KINDS = ("bar", "cumulative", "cdf")
EXTENSIONS = (".png", ".svg", ".pdf")
MAX_BARS = 200  # rows, for a bar chart
RAW_COLUMNS = {"text", "completion", "prefix", "tokens"}  # one value per row: not categories to group by
_RC = {"svg.fonttype": "none"}  # text in an SVG stays text (searchable, editable)


def plot(columns: Sequence[str], rows: Sequence[tuple], path: str, kind: Optional[str] = None, *, log: bool = False,
         title: Optional[str] = None, times: Optional[Sequence[float]] = None,
         kinds: Optional[Sequence[str]] = None) -> str:
    """Draw result rows into ``path`` (.png, .svg or .pdf, by its extension); returns the kind drawn.

    ``kind``: "bar", "cumulative", "cdf" or None (chosen from the columns); ``log``: a log scale on
    the value axis; ``times``: when each row arrived (seconds since the query started);
    ``kinds``: the columns' kinds (``relmql.records.KINDS``, as the plan's outputs declare them);
    without them a column whose values are all numbers is numeric."""
    fmt = check_path(path)
    import matplotlib
    with matplotlib.rc_context(_RC):
        fig, drawn = figure(columns, rows, kind, log=log, title=title, times=times, kinds=kinds)
        try:
            fig.savefig(path, format=fmt, dpi=150)
        except OSError as e:
            raise Error(f"cannot write {path}: {e.strerror or e}",
                        hint="the folder must exist" if isinstance(e, FileNotFoundError) else None) from None
    return drawn


def to_svg(columns: Sequence[str], rows: Sequence[tuple], kind: Optional[str] = None, *,
           title: Optional[str] = None) -> Tuple[str, str]:
    """The picture ``plot`` would draw, as SVG text (for a page that holds it inline), and its kind."""
    import io
    import matplotlib
    with matplotlib.rc_context(_RC):
        fig, drawn = figure(columns, rows, kind, title=title)
        out = io.StringIO()
        fig.savefig(out, format="svg")
    return out.getvalue(), drawn


def check_path(path: str) -> str:
    """The image format of ``path`` from its extension (png, svg or pdf); an ``Error`` for any other,
    or for a folder that does not exist."""
    ext = Path(path).suffix.lower()
    if ext not in EXTENSIONS:
        raise Error(f"cannot plot to {path}: the file name must end in {', '.join(EXTENSIONS)}",
                    hint=f"e.g. {Path(path).stem or 'plot'}.png")
    if not Path(path).parent.is_dir():  # before a query runs, not after
        raise Error(f"cannot write {path}: no folder {Path(path).parent}", hint="the folder must exist")
    return ext[1:]


def figure(columns: Sequence[str], rows: Sequence[tuple], kind: Optional[str] = None, *, log: bool = False,
           title: Optional[str] = None, times: Optional[Sequence[float]] = None,
           kinds: Optional[Sequence[str]] = None):
    """The ``matplotlib.figure.Figure`` that ``plot`` saves, and its kind."""
    from matplotlib.figure import Figure
    columns, rows = tuple(columns), list(rows)
    if kind is not None and kind not in PLOT_KINDS:
        near = closest(kind, PLOT_KINDS)
        raise Error(f"unknown plot kind {kind!r}; kinds: {', '.join(PLOT_KINDS)}",
                    hint=f"did you mean {near}?" if near else None)
    if not rows:
        raise Error("no rows to plot", hint="the query returned nothing")
    roles = _roles(columns, rows, kinds)
    times = list(times or [])
    if len(times) != len(rows):
        times = []
    kind = kind or _choose(columns, rows, roles, times)
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    default = {"bar": _bar, "cumulative": _cumulative, "cdf": _cdf}[kind](fig, ax, columns, rows, roles, times, log)
    ax.set_title(title or default)
    ax.grid(True, axis="y" if kind == "bar" else "both", alpha=0.3)
    ax.set_axisbelow(True)
    return fig, kind


# -- columns

def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _roles(columns, rows, kinds) -> List[str]:
    """Each column as "rank", "number" or "category": from its kind where the plan declares kinds,
    from its values only for rows drawn without them."""
    if kinds is None:
        kinds = []
        for i in range(len(columns)):
            values = [r[i] for r in rows if r[i] is not None]
            numbers = bool(values) and all(_is_number(v) for v in values)
            kinds.append(("rank" if columns[i] == "rank" else "number") if numbers else "text")
    return ["rank" if k == "rank" else "number" if k == "number" else "category" for k in kinds]


def _choose(columns, rows, roles, times) -> str:
    numbers = [c for c, r in zip(columns, roles) if r == "number"]
    categories = [c for c, r in zip(columns, roles) if r == "category"]
    if len(numbers) == 1 and not categories:
        return "cdf"
    if numbers and categories and len(rows) <= MAX_BARS and not RAW_COLUMNS & set(categories):
        return "bar"
    if times:
        return "cumulative"
    fits = ["cdf"] * bool(numbers) + ["bar"] * bool(numbers and len(rows) <= MAX_BARS and len(numbers) < len(roles))
    raise Error(f"no plot kind fits the columns {', '.join(columns)} by itself (and these rows have no arrival "
                "times, for cumulative)",
                hint=f"name the kind: {' or '.join(fits)}" if fits else "a bar chart or a cdf needs a numeric column")


def _number(columns, roles, kind: str) -> int:
    """The first numeric column (not rank)."""
    if "number" not in roles:
        raise Error(f"a {kind} plot needs a numeric column; the columns are {', '.join(columns)}")
    return roles.index("number")


def _label(text: str) -> str:
    """A category as shown: cut to 32 characters, '$' a dollar and not the start of mathtext."""
    return (text if len(text) <= 32 else text[:31] + "…").replace("$", r"\$")


# -- the kinds; each draws on ax and returns its default title

def _bar(fig, ax, columns, rows, roles, times, log) -> str:
    if len(rows) > MAX_BARS:
        raise Error(f"a bar chart takes at most {MAX_BARS} rows, not {len(rows)}",
                    hint="GROUP BY the categories, or plot kind cumulative or cdf")
    y = _number(columns, roles, "bar")
    cats = [i for i, r in enumerate(roles) if r == "category"] or [i for i, r in enumerate(roles) if r == "rank"]
    if not cats:
        raise Error(f"a bar chart needs a column of categories; the columns are {', '.join(columns)}")
    x, hue = cats[0], (cats[1] if len(cats) > 1 else None)
    xs = list(dict.fromkeys(format_value(r[x]) for r in rows))
    hues = list(dict.fromkeys(format_value(r[hue]) for r in rows)) if hue is not None else [None]
    if len(hues) > len(xs):  # the column with more values goes along the axis, the other in the legend
        x, hue, xs, hues = hue, x, hues, xs
    cells = {}
    for r in rows:
        key = (format_value(r[x]), format_value(r[hue]) if hue is not None else None)
        if key in cells:
            where = f"{columns[x]} = {key[0]}" + (f", {columns[hue]} = {key[1]}" if hue is not None else "")
            raise Error(f"a bar chart takes one row per bar; several rows have {where}",
                        hint=f"GROUP BY {columns[x]}" + (f", {columns[hue]}" if hue is not None else ""))
        cells[key] = r[y]
    if log and not any(v is not None and v > 0 for v in cells.values()):
        raise Error(f"a log scale needs positive values of {columns[y]}; there are none",
                    hint="leave out the log scale")
    fig.set_size_inches(min(18.0, max(6.4, 1.5 + len(xs) * (0.15 * len(hues) + 0.25))), 4.8)
    width, interval = 0.8 / len(hues), None
    for j, h in enumerate(hues):
        values = [cells.get((c, h)) for c in xs]
        offsets = [i + (j - (len(hues) - 1) / 2) * width for i in range(len(xs))]
        bars = ax.bar(offsets, [_height(v, log) for v in values], width, label=None if h is None else _label(h),
                      yerr=_errors(values), error_kw={"capsize": 3, "elinewidth": 1, "ecolor": "0.2"})
        if bars.errorbar is not None:
            interval = bars.errorbar, next(v for v in values if _interval(v)).confidence
    ticks = [_label(c) for c in xs]
    ax.set_xticks(range(len(xs)), ticks)
    if sum(map(len, ticks)) > 60 or max(map(len, ticks)) > 12:
        ax.tick_params(axis="x", labelrotation=40)
        for t in ax.get_xticklabels():
            t.set(ha="right", rotation_mode="anchor")
    ax.set_xlabel(columns[x])
    ax.set_ylabel(columns[y])
    if log:
        ax.set_yscale("log")
    elif all(isinstance(v, int) for v in cells.values() if v is not None):
        ax.yaxis.get_major_locator().set_params(integer=True)  # counts: no 2.5 ticks
    handles, labels = ax.get_legend_handles_labels() if hue is not None else ([], [])
    if interval:
        handles.append(interval[0])
        labels.append(f"{interval[1] * 100:g}% intervals")
    if handles:
        ax.legend(handles, labels, title=columns[hue] if hue is not None else None, fontsize="small",
                  loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the bars, never over them
    return f"{columns[y]} by {columns[x]}" + (f" and {columns[hue]}" if hue is not None else "")


def _interval(v) -> bool:
    """Whether ``v`` is an estimate with an interval (a ``relmql.stats.Estimate`` that is not exact)."""
    return v is not None and hasattr(v, "low") and not getattr(v, "exact", True)


def _errors(values) -> Optional[List[List[float]]]:
    """Error bar lengths below and above each value, from the intervals of estimates; None without any."""
    if not any(_interval(v) for v in values):
        return None
    return [[max(0.0, v - v.low) if _interval(v) else 0.0 for v in values],
            [max(0.0, v.high - v) if _interval(v) else 0.0 for v in values]]


def _height(v, log: bool) -> float:
    if v is None:
        return math.nan if log else 0.0
    return math.nan if log and v <= 0 else float(v)  # log: no bar rather than one from -infinity


def _cumulative(fig, ax, columns, rows, roles, times, log) -> str:
    if not times:
        raise Error("a cumulative plot needs the time each row arrived; these rows have none",
                    hint="plot the result of a query as it is read (Result.plot), or choose bar or cdf")
    xs = [0.0] + [float(t) for t in times]
    ax.step(xs, range(len(rows) + 1), where="post", label="rows")
    if "text" in columns:
        i, seen, distinct = columns.index("text"), set(), [0]
        for r in rows:
            seen.add(r[i])
            distinct.append(len(seen))
        ax.step(xs, distinct, where="post", label="distinct text", linestyle="--")  # seen where equal
        ax.legend(fontsize="small")
    ax.set_xlabel("seconds since the query started")
    ax.set_ylabel("rows (cumulative)")
    ax.set_xlim(left=0)
    if log:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
        ax.yaxis.get_major_locator().set_params(integer=True)
    return f"rows over time ({len(rows)} rows in {xs[-1]:.3g} s)"


def _cdf(fig, ax, columns, rows, roles, times, log) -> str:
    i = _number(columns, roles, "cdf")
    values = sorted(float(r[i]) for r in rows if r[i] is not None and not math.isnan(r[i]))
    if log:
        values = [v for v in values if v > 0]
    if not values:
        raise Error(f"no values of {columns[i]} to plot" + (" (a log scale needs positive ones)" if log else ""))
    n = len(values)
    xs, ys = [values[0]] + values, [0.0] + [k / n for k in range(1, n + 1)]
    ax.step(xs, ys, where="post", label=f"{columns[i]} (n = {n})")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(columns[i])
    ax.set_ylabel("fraction of rows ≤ x")
    if log:
        ax.set_xscale("log")
    ax.legend(loc="lower right", fontsize="small")
    return f"CDF of {columns[i]}"
