"""A query's EXPECT → a ``Verdict``: pass, fail, inconclusive or error, certified where a value is
estimated (the whole interval must decide, and more draws are made, at a corrected level, until
it does or the budget is spent)."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import Error
from ..plan.expect import TEST_COLUMNS, ExpectPlan
from ..plan.expr import Env, evaluate, truth
from ..stats import Estimate, cramers_v_interval

STATUSES = ("pass", "fail", "inconclusive", "error")
TABLE_ROWS = 200  # result rows a verdict keeps for its report (a table, a plot of grouped results)
ROUNDS_MAX = 5  # rounds of draws an estimated verdict takes at most (each twice the draws of the one before)


@dataclass
class Verdict:
    """What an expectation came to. ``kind``: what the verdict rests on: ``exact`` (values summed or
    searched exactly), ``bound`` (the search's certain bound of a probability: the strings found
    from below, what it had not ruled out from above), ``estimate`` (an interval at
    ``confidence``, over ``draws`` draws in ``rounds`` rounds; narrowed by the bound where that is
    tighter) or ``test`` (a χ² test's statistics of its draws). ``value``: the values the
    condition read on the row that decided, as text; ``interval``: an estimate's. ``judged_on``: the
    models, dtype, decoding rules, seed and relmql version."""

    status: str
    name: str
    condition: str
    kind: str = "exact"
    value: Optional[str] = None
    measured: Optional[float] = None
    interval: Optional[Tuple[float, float]] = None
    confidence: Optional[float] = None
    draws: int = 0
    rounds: int = 1
    rows: int = 0
    seconds: float = 0.0
    message: Optional[str] = None
    file: Optional[str] = None
    line: Optional[int] = None
    model: Optional[str] = None
    judged_on: Dict[str, Any] = field(default_factory=dict)
    columns: Tuple[str, ...] = ()  # the result the verdict judged: its columns and up to TABLE_ROWS rows
    table: Tuple[tuple, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    def line_text(self) -> str:
        """One line: the verdict, the name, what was measured and on what it rests, the time."""
        head = f"{self.status.upper()} {self.name}"
        if self.status == "error":
            return f"{head}: {self.message}"
        what = f"{self.value}" if self.value else "no rows"
        rest = f"[{self.kind}" + (f", {self.confidence:.0%} interval over {self.draws:,} draws"
                                   + (f" in {self.rounds} rounds" if self.rounds > 1 else "") if self.kind == "estimate"
                                   else "") + "]"
        why = f"; {self.message}" if self.message else ""
        return f"{head}: {what} (EXPECT {self.condition}) {rest}{why} {self.seconds:.1f} s"

    def as_dict(self) -> Dict[str, Any]:
        out = dataclasses.asdict(self)
        out["interval"] = list(self.interval) if self.interval else None
        out["columns"], out["table"] = list(self.columns), [[_plain(x) for x in row] for row in self.table]
        return out


def _plain(value):
    """A result's value as JSON holds it: an estimate as its value and interval."""
    if isinstance(value, Estimate):
        return float(value) if value.exact else {"value": float(value), "low": value.low, "high": value.high}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(x) for x in value]
    return str(value)


class _Values(Env):
    """A result row's values by column name (and the TEST's statistics), estimates read at
    ``end``: their point value, or the low or high end of their interval."""

    def __init__(self, columns: Sequence[str], row: Sequence[Any], tested: Dict[str, Any], end: str):
        self.values = {**dict(zip(columns, row)), **tested}
        self.end = end
        self.read: List[str] = []

    def column(self, node):
        v = self.values[node.name]
        if node.name not in self.read:
            self.read.append(node.name)
        if isinstance(v, Estimate) and not v.exact and self.end != "point":
            return v.low if self.end == "low" else v.high
        return v


def test_values(test, level: float, drawn: bool = False) -> Dict[str, Any]:
    """What a TEST gives EXPECT to read: its p-value, statistic and degrees of freedom (the test's
    own decision at the threshold EXPECT names), and Cramér's V, with its interval at ``level``
    where the table holds counts ``drawn`` at random, SAMPLE n's (``stats.cramers_v_interval``)."""
    if test is None:
        return {}
    v = cramers_v_interval(test, level) if drawn and not test.scaled else test.cramers_v
    return {"p_value": test.p_value, "chi2": test.statistic, "dof": test.dof, "cramers_v": v}


def _decide(expect: ExpectPlan, columns, row, test) -> Tuple[Optional[bool], List[str]]:
    """True or False where the condition holds or fails over every value of the row's intervals
    (at their ends: the conditions are monotone in each estimate), None where they disagree; and
    the columns it read."""
    outcomes = []
    read: List[str] = []
    for end in ("point", "low", "high"):
        env = _Values(columns, row, test, end)
        outcomes.append(truth(evaluate(expect.condition, env), expect.condition))
        read = env.read
    return (outcomes[0] if len(set(outcomes)) == 1 else None), read


def _shown(columns, row, read: List[str], test) -> Tuple[str, Optional[float], Optional[Tuple[float, float]], str]:
    """The values the condition read, as text; the first number among them, its interval, and the kind."""
    values = {**dict(zip(columns, row)), **test}
    parts, measured, interval, kind = [], None, None, "exact"
    for name in read:
        v = values.get(name)
        if isinstance(v, Estimate) and not v.exact:
            kind = "bound" if v.method == "bound" and kind != "estimate" else "estimate"
            interval = (v.low, v.high)
            parts.append(f"{name} = {float(v):.4g} [{v.low:.4g}, {v.high:.4g}]")
        elif isinstance(v, float):
            parts.append(f"{name} = {v:.4g}")
        else:
            parts.append(f"{name} = {v!r}")
        if name in TEST_COLUMNS and kind == "exact":
            kind = "test"
        if measured is None and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            measured = float(v)
    return ", ".join(parts), measured, interval, kind


def judge_rows(expect: ExpectPlan, columns: Sequence[str], rows: Sequence[tuple], test=None,
               level: Optional[float] = None, drawn: bool = False) -> Verdict:
    """The verdict on rows already read: ``fail`` where a row fails over its whole interval, ``pass``
    where every row holds over its whole interval, else ``inconclusive``; no rows is a fail (nothing
    to judge is no evidence that the model passes). ``level``: the TEST's intervals' (default: the
    level EXPECT states), where its counts were ``drawn``."""
    test = test_values(test, expect.confidence if level is None else level, drawn)
    if not rows:
        return Verdict("fail", expect.name, expect.text, message="the query gave no rows to judge")
    undecided = None
    verdict = None
    for row in rows:
        decided, read = _decide(expect, columns, row, test)
        if decided is False:
            value, measured, interval, kind = _shown(columns, row, read, test)
            return Verdict("fail", expect.name, expect.text, kind, value, measured, interval, rows=len(rows))
        if decided is None and undecided is None:
            undecided = (row, read)
        if verdict is None:
            verdict = (row, read)
    row, read = undecided or verdict
    value, measured, interval, kind = _shown(columns, row, read, test)
    status = "inconclusive" if undecided is not None else "pass"
    return Verdict(status, expect.name, expect.text, kind, value, measured, interval, rows=len(rows))


def judge(expect: ExpectPlan, first, rerun: Optional[Callable[[int], Any]] = None, confidence: Optional[float] = None,
          draws: int = 0, budget: int = 0, drawn: bool = False) -> Verdict:
    """The verdict of a query whose result is ``first``; where an estimate leaves it undecided,
    ``rerun(k)`` gives round k's result (twice the draws of round k - 1, fresh draws), until it
    decides, ``budget`` draws are spent or ``ROUNDS_MAX`` rounds are run. The first round is read at
    level 1 - α/2 and round k at 1 - α/2^(k+1) (α = 1 - ``confidence``): their errors sum to less
    than α, whatever the round that decides. ``drawn``: a TEST's counts are SAMPLE n's draws."""
    started = time.perf_counter()
    confidence = expect.confidence if confidence is None else confidence
    result, k, spent = first, 0, draws
    while True:
        try:
            rows = list(result)  # every row, wherever a cursor stands
            test = result.test if result.test_plan is not None else None
        except Error as e:
            return Verdict("error", expect.name, expect.text, message=e.render().splitlines()[0],
                           seconds=time.perf_counter() - started)
        verdict = judge_rows(expect, result.columns, rows, test, round_level(confidence, k) if rerun else confidence,
                             drawn)
        verdict.columns, verdict.table = tuple(result.columns), tuple(tuple(r) for r in rows[:TABLE_ROWS])
        verdict.rounds, verdict.draws = k + 1, spent
        if verdict.kind == "estimate":
            verdict.confidence = confidence
        more = draws * 2 ** (k + 1)
        if verdict.status != "inconclusive" or rerun is None or not draws or k + 1 >= ROUNDS_MAX \
                or spent + more > budget:
            if verdict.status == "inconclusive":
                verdict.message = (f"the interval still holds values on both sides after {spent:,} draws"
                                   + (f" (max_draws {budget:,})" if rerun is not None and draws else ""))
            verdict.seconds = time.perf_counter() - started
            return verdict
        k += 1
        spent += more
        result = rerun(k)


def round_level(confidence: float, k: int) -> float:
    """The confidence level of round ``k`` of an estimated verdict at ``confidence``."""
    return 1 - (1 - confidence) / 2 ** (k + 1)


__all__ = ["Verdict", "judge", "judge_rows", "round_level", "STATUSES"]
