"""The scalar functions of the language (``FUNCTIONS``): each one's implementation, argument types and
meaning (docs/architecture.md, "Planning")."""

from __future__ import annotations

import decimal
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict

from .. import stats
from ..syntax.regexes import compiled, escape
from .options import shown



def _words(s: str, exclude=None) -> str:
    seen = []
    drop = {w.lower() for w in (exclude or [])}
    for w in re.findall(r"\w+", s):
        if w not in seen and w.lower() not in drop:
            seen.append(w)
    if not seen:
        return "(?!)"  # matches nothing; planner reports the empty language
    return "(?:" + "|".join(escape(w) for w in seen) + ")"


def _any_of(items) -> str:
    items = list(items) if isinstance(items, (list, tuple)) else [items]
    return "(?:" + "|".join(escape(str(i)) for i in items) + ")" if items else "(?!)"


def _lines(path: str) -> list:
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of the first line
    except FileNotFoundError:
        raise ValueError(f"no file {path!r} (relative paths start at {Path.cwd()})") from None
    except OSError as e:
        raise ValueError(f"cannot read {path!r}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"cannot read {path!r}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _last_word(s: str) -> str:
    parts = s.split()
    return parts[-1] if parts else ""


def _drop_last_word(s: str) -> str:
    s = s.rstrip()
    cut = max(s.rfind(" "), s.rfind("\n"), s.rfind("\t"))
    return s[:cut].rstrip() if cut >= 0 else ""


def _regexp_extract(s: str, pattern: str, group=0):
    regex = compiled(pattern)
    if not 0 <= group <= regex.groups:  # as group(n) is, whether or not this row matches
        raise ValueError(f"no group {group}: the regex has {regex.groups} group{'s' if regex.groups != 1 else ''} "
                         f"(0 is the whole match)")
    m = regex.search(s)
    return None if m is None else m.group(group)


def _regexp_replace(s: str, pattern: str, replacement: str) -> str:
    regex = compiled(pattern)  # a bad regex: re.error, reported as one
    try:
        return regex.sub(replacement, s)
    except re.error as e:  # the regex is fine: the replacement refers to what it does not have
        raise ValueError(f"bad replacement {shown(replacement)}: {e}") from None


def _round(x, n=0):
    """``x`` to ``n`` decimals, halves away from zero as SQL rounds (2.5 to 3, -2.5 to -3,
    0.125 to 0.13: the number as written, not its nearest binary fraction)."""
    if not math.isfinite(x):
        return float(x)
    d, n = decimal.Decimal(repr(float(x))), int(n)
    if n >= -d.as_tuple().exponent:  # no more decimals than that already (1e300, or 400 of them)
        return float(x)
    context = decimal.Context(prec=max(28, d.adjusted() + n + 2), rounding=decimal.ROUND_HALF_UP)
    return float(d.quantize(decimal.Decimal(1).scaleb(-n), context=context))


def _exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:  # past the largest float, as float arithmetic gives
        return math.inf


def _ln(x: float) -> float:
    if x < 0:
        raise ValueError(f"the logarithm of a negative number ({x!r}) is undefined")
    return math.log(x) if x > 0 else -math.inf  # ln(0): the log-probability of an impossible string


@dataclass(frozen=True)
class Function:
    """A scalar function: ``impl`` on argument values; ``types`` names each argument's type, ``kind``
    the kind of its values (``relmql.records.KINDS``)."""

    name: str  # the name a query calls it by
    impl: Callable  # the Python function on the arguments' values
    types: tuple  # each argument's type: text, list, sized, int, number or any
    optional: int  # how many of the last arguments may be left out
    doc: str  # what it gives, in a line
    kind: str = "text"  # the kind of its values


def _f(name, impl, types, doc, optional=0, kind="text"):
    return Function(name, impl, types, optional, doc, kind)


FUNCTIONS: Dict[str, Function] = {f.name: f for f in (
    _f("escape", escape, ("text",), "a regex that matches exactly the text"),
    _f("words", _words, ("text", "list"), "a regex matching any one word (\\w+) of the text, "
       "optionally leaving out the words of a list", optional=1),
    _f("any_of", _any_of, ("list",), "a regex matching any one item of a list, each escaped"),
    _f("lines", _lines, ("text",), "the non-empty lines of a text file (a list)"),
    _f("last_word", _last_word, ("text",), "the last whitespace-separated word"),
    _f("drop_last_word", _drop_last_word, ("text",), "the text without its last word"),
    _f("regexp_extract", _regexp_extract, ("text", "text", "int"),
       "the first match of a regex in the text (or one of its groups); NULL if none", optional=1),
    _f("regexp_replace", _regexp_replace, ("text", "text", "text"),
       "the text with every match of a regex replaced"),
    _f("replace", lambda s, a, b: s.replace(a, b), ("text", "text", "text"), "the text with a substring replaced"),
    _f("lower", str.lower, ("text",), "lower case"),
    _f("upper", str.upper, ("text",), "upper case"),
    _f("trim", str.strip, ("text",), "without leading and trailing whitespace"),
    _f("length", len, ("sized",), "characters of a text, items of a list or tokens", kind="number"),
    _f("round", _round, ("number", "int"), "a number rounded to n decimals", optional=1, kind="number"),
    _f("exp", _exp, ("number",), "e to the power x", kind="number"),
    _f("ln", _ln, ("number",), "the natural logarithm (of 0: -inf)", kind="number"),
    _f("abs", abs, ("number",), "the absolute value", kind="number"),
    _f("ci_low", lambda x: stats.ci_bound(x, "low"), ("number",),
       "the lower end of probability()'s interval (the value itself when exact)", kind="number"),
    _f("ci_high", lambda x: stats.ci_bound(x, "high"), ("number",),
       "the upper end of probability()'s interval (the value itself when exact)", kind="number"),
    _f("wilson_low", lambda k, n, c=stats.DEFAULT_CONFIDENCE: stats.wilson(k, n, c)[0],
       ("number", "number", "number"), "the lower end of the Wilson interval of k successes in n trials "
       f"(confidence {stats.DEFAULT_CONFIDENCE:g} unless given)", optional=1, kind="number"),
    _f("wilson_high", lambda k, n, c=stats.DEFAULT_CONFIDENCE: stats.wilson(k, n, c)[1],
       ("number", "number", "number"), "the upper end of the Wilson interval of k successes in n trials",
       optional=1, kind="number"),
)}
