"""A test run as one self-contained HTML page: the totals, a table of the verdicts, and a plot of
each grouped result (inline SVG drawn by matplotlib; no script, no file beside it)."""

from __future__ import annotations

import datetime
from html import escape
from typing import Optional, Sequence

from ..verdict import Verdict
from .reports import by_model, totals

COLOURS = {"pass": "#1a7f37", "fail": "#cf222e", "inconclusive": "#9a6700", "error": "#6e7781"}

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 70em; color: #1f2328; }
h1 { font-size: 1.5em; margin-bottom: .2em; } h2 { font-size: 1.15em; margin-top: 2em; }
.meta { color: #59636e; } table { border-collapse: collapse; width: 100%; margin: 1em 0; }
th, td { border-bottom: 1px solid #d1d9e0; padding: .35em .6em; text-align: left; vertical-align: top; }
th { background: #f6f8fa; } td.num { text-align: right; white-space: nowrap; }
code { font: 13px ui-monospace, monospace; background: #f6f8fa; padding: 0 .2em; }
.status { color: #fff; border-radius: .3em; padding: .05em .5em; font-weight: 600; white-space: nowrap; }
""" + "".join(f".{s} {{ background: {c}; }}\n" for s, c in COLOURS.items()) + """
figure { margin: 1em 0 2em; } figcaption { color: #59636e; } svg { max-width: 100%; height: auto; }
"""


def to_html(verdicts: Sequence[Verdict], seconds: float, changes: Sequence[str] = ()) -> str:
    """The page: totals, the verdicts (a column per model where there are several), the changes
    from a baseline, and a plot of each result that has groups to compare."""
    t = totals(verdicts)
    when = datetime.datetime.now().isoformat(timespec="seconds")
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>relmql test</title>"
             f"<style>{STYLE}</style></head><body>",
             "<h1>relmql test</h1>",
             f"<p class=\"meta\" id=\"totals\">{t['pass']} passed, {t['fail']} failed, {t['inconclusive']} "
             f"inconclusive, {t['error']} errors in {seconds:.1f} s · {escape(when)}</p>",
             _verdict_table(verdicts)]
    if changes:
        parts.append("<h2>Changes from the baseline</h2><ul id=\"changes\">"
                     + "".join(f"<li>{escape(c)}</li>" for c in changes) + "</ul>")
    plots = [p for p in (_plot(v) for v in verdicts) if p]
    if plots:
        parts.append("<h2>Grouped results</h2>")
        parts += plots
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _verdict_table(verdicts: Sequence[Verdict]) -> str:
    models, rows = by_model(verdicts)
    if len(models) > 1:
        head = "<tr><th>expectation</th>" + "".join(f"<th>{escape(m)}</th>" for m in models) + "</tr>"
        body = "".join(f"<tr><td>{escape(name)}</td>" + "".join(
            f"<td>{_status(by[m])} {escape(by[m].value or by[m].message or '')} "
            f"<span class=\"meta\">{by[m].seconds:.1f} s</span></td>" if m in by else "<td></td>" for m in models)
            + "</tr>" for (_, name), by in rows.items())
        return f"<table id=\"verdicts\">{head}{body}</table>"
    head = ("<tr><th>verdict</th><th>expectation</th><th>measured</th><th>condition</th><th>rests on</th>"
            "<th>where</th><th>time</th></tr>")
    body = "".join(
        f"<tr><td>{_status(v)}</td><td>{escape(v.name)}</td><td>{escape(v.value or v.message or '')}</td>"
        f"<td><code>{escape(v.condition)}</code></td><td>{escape(v.kind)}</td>"
        f"<td>{escape(f'{v.file}:{v.line}' if v.file else '')}</td><td class=\"num\">{v.seconds:.1f} s</td></tr>"
        for v in verdicts)
    return f"<table id=\"verdicts\">{head}{body}</table>"


def _status(v: Verdict) -> str:
    return f"<span class=\"status {v.status}\">{v.status}</span>"


def _plot(v: Verdict) -> Optional[str]:
    """A bar chart of a result of several groups (its keys against its numbers, with their
    intervals), as a figure with inline SVG; None where the result has none to draw."""
    if len(v.table) < 2:
        return None
    from ..output.plot import to_svg
    try:
        svg, kind = to_svg(list(v.columns), list(v.table), title=v.name)
    except Exception:  # nothing numeric, nothing to group by, a label matplotlib cannot set: no plot, the page still
        return None
    if kind != "bar":
        return None
    svg = svg[svg.index("<svg"):]  # inline: without the XML prologue and doctype
    where = f" ({escape(v.model)})" if v.model else ""
    return (f"<figure class=\"plot\">{svg}<figcaption>{escape(v.name)}{where}: {v.status}, "
            f"{len(v.table)} groups</figcaption></figure>")


__all__ = ["to_html"]
