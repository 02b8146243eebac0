"""A test run's verdicts written for machines and people: JSON (the input of a baseline), JUnit XML
(as CI systems read it), and Markdown (a pull-request comment); and a comparison with a baseline."""

from __future__ import annotations

import datetime
import json
import math
import os
import xml.etree.ElementTree as ET
from collections import OrderedDict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import Error
from ..verdict import Verdict

REPORT_KINDS = {".json": "json", ".xml": "junit", ".md": "markdown", ".html": "html", ".htm": "html"}


def check_writable(path: str, what: str) -> None:
    """An ``Error`` now, before anything runs, where ``path`` cannot be written."""
    p = Path(path).expanduser()
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise Error(f"{what} {path!r} is a folder, not a file")
    if not folder.is_dir():
        raise Error(f"cannot write {what} {path!r}: no folder {str(folder)!r}")
    if not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise Error(f"cannot write {what} {path!r}: permission denied")


def to_json(verdicts: Sequence[Verdict], seconds: float, changes: Sequence[str] = ()) -> str:
    """The run as JSON: when, how long, the totals, each verdict, the changes from a baseline."""
    from .. import __version__
    return json.dumps({"relmql": __version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
                       "seconds": round(seconds, 3), "totals": totals(verdicts),
                       "verdicts": [v.as_dict() for v in verdicts], "changes": list(changes)}, indent=1)


def totals(verdicts: Sequence[Verdict]) -> Dict[str, int]:
    """How many verdicts of each status."""
    out = OrderedDict((s, 0) for s in ("pass", "fail", "inconclusive", "error"))
    for v in verdicts:
        out[v.status] += 1
    return dict(out)


def to_junit(verdicts: Sequence[Verdict], seconds: float) -> str:
    """JUnit XML: a test suite per file (and model), a test case per expectation; a fail or an
    inconclusive verdict is a ``failure`` with the measured value, an error an ``error``."""
    suites = ET.Element("testsuites", name="relmql test", tests=str(len(verdicts)),
                        failures=str(sum(v.status in ("fail", "inconclusive") for v in verdicts)),
                        errors=str(sum(v.status == "error" for v in verdicts)), time=f"{seconds:.3f}")
    groups: Dict[str, List[Verdict]] = OrderedDict()
    for v in verdicts:
        groups.setdefault(_suite_name(v), []).append(v)
    for name, members in groups.items():
        suite = ET.SubElement(suites, "testsuite", name=name, tests=str(len(members)),
                              failures=str(sum(v.status in ("fail", "inconclusive") for v in members)),
                              errors=str(sum(v.status == "error" for v in members)), skipped="0",
                              time=f"{sum(v.seconds for v in members):.3f}",
                              timestamp=datetime.datetime.now().isoformat(timespec="seconds"))
        if members[0].file:
            suite.set("file", members[0].file)
        for v in members:
            case = ET.SubElement(suite, "testcase", name=v.name, classname=name, time=f"{v.seconds:.3f}")
            if v.status in ("fail", "inconclusive"):
                failure = ET.SubElement(case, "failure", type=v.status, message=_message(v))
                failure.text = v.line_text()
            elif v.status == "error":
                error = ET.SubElement(case, "error", type="error", message=v.message or "error")
                error.text = v.message or ""
            out = ET.SubElement(case, "system-out")  # what the verdict rests on, for a reader of the report
            out.text = (f"{v.file}:{v.line}: " if v.file else "") + v.line_text() + "\n" + json.dumps(v.judged_on)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _suite_name(v: Verdict) -> str:
    return (v.file or "statements") + (f" [{v.model}]" if v.model else "")


def _message(v: Verdict) -> str:
    what = v.value or "no rows"
    return f"{v.status}: {what}; expected {v.condition}" + (f" ({v.message})" if v.message else "")


def to_markdown(verdicts: Sequence[Verdict], seconds: float, changes: Sequence[str] = ()) -> str:
    """A Markdown summary fit for a pull-request comment: the totals, a table of the verdicts (a
    column per model where there are several), the changes from a baseline."""
    t = totals(verdicts)
    lines = [f"**relmql test**: {t['pass']} passed, {t['fail']} failed, {t['inconclusive']} inconclusive, "
             f"{t['error']} errors in {seconds:.1f} s", ""]
    models, rows = by_model(verdicts)
    if len(models) > 1:
        lines += ["| expectation | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
        for (file, name), by in rows.items():
            cells = [f"{by[m].status} ({by[m].value or by[m].message or '-'}; {by[m].seconds:.1f} s)" if m in by
                     else "" for m in models]
            lines.append(f"| {_md(name)} | " + " | ".join(_md(c) for c in cells) + " |")
    else:
        lines += ["| verdict | expectation | measured | condition | rests on | time |", "|---|---|---|---|---|---:|"]
        for v in verdicts:
            lines.append(f"| {v.status} | {_md(v.name)} | {_md(v.value or v.message or '')} | `{_md(v.condition)}` | "
                         f"{v.kind} | {v.seconds:.1f} s |")
    if changes:
        lines += ["", "Changes from the baseline:", ""] + [f"- {_md(c)}" for c in changes]
    return "\n".join(lines) + "\n"


def by_model(verdicts: Sequence[Verdict]) -> Tuple[List[str], Dict[tuple, Dict[str, Verdict]]]:
    """The models in the order met ("" for the session's), and each expectation (file, name) with
    its verdict on each model: the grid of a run on several models."""
    models = list(OrderedDict.fromkeys(v.model or "" for v in verdicts))
    rows: Dict[tuple, Dict[str, Verdict]] = OrderedDict()
    for v in verdicts:
        rows.setdefault((v.file, v.name), {})[v.model or ""] = v
    return models, rows


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def compare(verdicts: Sequence[Verdict], baseline_path: str) -> List[str]:
    """The expectations whose measured value moved beyond its intervals since the baseline run
    (a JSON report), whatever their verdicts; and those whose verdict changed."""
    try:
        old = json.loads(Path(baseline_path).expanduser().read_text(encoding="utf-8"))
        before = {(b["file"], b["name"], b.get("model")): b for b in old["verdicts"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Error(f"cannot read the baseline {baseline_path!r}: {e}",
                    hint="a baseline is the --json report of an earlier run") from None
    out = []
    for v in verdicts:
        b = before.get((v.file, v.name, v.model))
        if b is None:
            continue
        who = v.name + (f" [{v.model}]" if v.model else "")
        if b["status"] != v.status:
            out.append(f"{who}: {b['status']} → {v.status}")
        moved = _moved(b.get("measured"), b.get("interval"), v.measured, v.interval)
        if moved:
            out.append(f"{who}: {moved}")
    return out


def _moved(old: Optional[float], old_iv, new: Optional[float], new_iv) -> Optional[str]:
    if old is None or new is None:
        return None
    lo_a, hi_a = old_iv or (old, old)
    lo_b, hi_b = new_iv or (new, new)
    if old_iv is None and new_iv is None:
        if math.isclose(old, new, rel_tol=1e-6, abs_tol=1e-12):
            return None
    elif hi_a >= lo_b and hi_b >= lo_a:  # the intervals overlap: no change shown
        return None
    return f"{old:.4g} → {new:.4g} (beyond {'their intervals' if old_iv or new_iv else 'rounding'})"


def write_report(path: str, verdicts: Sequence[Verdict], seconds: float, changes: Sequence[str] = ()) -> None:
    """Write the report that ``path``'s suffix names (.json, .xml JUnit, .html a page, else Markdown)."""
    from .html import to_html
    kind = REPORT_KINDS.get(Path(path).suffix.lower(), "markdown")
    text = {"json": lambda: to_json(verdicts, seconds, changes), "junit": lambda: to_junit(verdicts, seconds),
            "markdown": lambda: to_markdown(verdicts, seconds, changes),
            "html": lambda: to_html(verdicts, seconds, changes)}[kind]()
    Path(path).expanduser().write_text(text, encoding="utf-8")


__all__ = ["by_model", "check_writable", "to_json", "to_junit", "to_markdown", "compare", "write_report", "totals"]
