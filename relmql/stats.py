"""Statistics for validation studies: exact or estimated probabilities with intervals, Wilson
intervals for sampled proportions, and the χ² test of independence (scipy.stats).

    from relmql.stats import wilson, chi2_independence
    wilson(37, 100)                                   # (0.2817..., 0.4676...)
    chi2_independence(rows, "gender", "field", weight="n").p_value
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

DEFAULT_CONFIDENCE = 0.95


def _z(confidence: float) -> float:
    from scipy.stats import norm
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, not {confidence!r}")
    return float(norm.ppf(0.5 + confidence / 2))


class Estimate(float):
    """A probability with its interval: a float (the point value) that also carries ``low``,
    ``high``, ``exact`` (summed over the language, not sampled), ``draws`` (samples behind an
    estimate), ``confidence`` and ``method``. Exact values have ``low == high == value``."""

    low: float
    high: float
    exact: bool
    draws: int
    confidence: float
    method: str

    def __new__(cls, value: float, low: Optional[float] = None, high: Optional[float] = None, exact: bool = True,
                draws: int = 0, confidence: float = DEFAULT_CONFIDENCE, method: str = "exact"):
        self = super().__new__(cls, value)
        self.low = float(value if low is None else low)
        self.high = float(value if high is None else high)
        self.exact, self.draws, self.confidence, self.method = exact, int(draws), float(confidence), method
        return self

    def __repr__(self) -> str:
        if self.exact:
            return f"{float(self):.6g}"
        return self.text(4)

    def text(self, digits: int = 3) -> str:
        """The value and its interval, the ends to ``digits`` significant digits or as many more
        as tell them apart (a narrow interval would print as no width) and keep the value between
        them, the value to one more (an end equal to the value prints as the value does)."""
        v = float(self)

        def end(x: float, d: int) -> str:
            return f"{x:.{max(4, d + 1)}g}" if x == v else f"{x:.{d}g}"

        def unclear(d: int) -> bool:  # the ends print as one, or an end prints past the value
            low, high, value = float(end(self.low, d)), float(end(self.high, d)), float(end(v, d))
            return (self.low < self.high and low == high) or low > value or high < value
        while digits < 12 and unclear(digits):
            digits += 1
        return f"{v:.{max(4, digits + 1)}g} [{end(self.low, digits)}, {end(self.high, digits)}]"

    def __reduce__(self):
        return (Estimate, (float(self), self.low, self.high, self.exact, self.draws, self.confidence, self.method))


def wilson(k: float, n: float, confidence: float = DEFAULT_CONFIDENCE) -> Tuple[float, float]:
    """The Wilson score interval of a proportion: ``k`` successes in ``n`` trials."""
    if n <= 0:
        raise ValueError(f"a proportion needs at least one trial, not n = {n!r}")
    if not 0 <= k <= n:
        raise ValueError(f"successes must be between 0 and n = {n!r}, not {k!r}")
    z = _z(confidence)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (0.0 if k == 0 else max(0.0, centre - half)), (1.0 if k == n else min(1.0, centre + half))


def estimate_mean(hits: Sequence[float], draws: int, scale: float = 1.0, bounded: Optional[float] = None,
                  confidence: float = DEFAULT_CONFIDENCE, binary: bool = False,
                  parts: Optional[Sequence[Tuple[Sequence[float], int]]] = None) -> Estimate:
    """The mean of ``draws`` independent draws, of which the nonzero ones are ``hits`` (the rest
    are zero), times ``scale``, with its interval: Wilson's when every hit is 1 (``binary``),
    otherwise the normal approximation with the sample variance, clipped to [0, ``bounded``].
    With no hits at all the sample variance says nothing; draws bounded by 1 then get Wilson's
    upper bound for none in ``draws`` (in each part, summed). ``parts``: the draws fall in groups
    that each measure a disjoint part of the quantity, (hits, draws) of each (together ``hits``
    and ``draws``); the value is then the sum of the parts' means, its variance the sum of
    theirs, var_h / n_h (infinite where a part has fewer than two draws)."""
    if draws <= 0:
        raise ValueError("an estimate needs at least one draw")
    hits = np.asarray(hits, np.float64)
    groups = [(np.asarray(h, np.float64), n) for h, n in parts] if parts else [(hits, draws)]
    if binary or (not hits.any() and bounded is not None and bounded <= 1):
        k = int(np.count_nonzero(hits))
        lo, hi = wilson(k, draws, confidence)
        value = k / draws
        if len(groups) > 1:  # no hits: each part's bound for none, summed
            hi = min(1.0, sum(wilson(0, n, confidence)[1] if n > 0 else 1.0 for _, n in groups))
        return Estimate(scale * value, scale * lo, scale * hi, exact=False, draws=draws, confidence=confidence,
                        method="wilson")
    mean = sum(float(h.sum()) / n for h, n in groups if n > 0)
    if all(n > 1 for _, n in groups):
        half = _z(confidence) * math.sqrt(sum(_variance(h, n) / n for h, n in groups))
    else:
        half = math.inf
    lo, hi = mean - half, mean + half
    lo = max(lo, 0.0)
    if bounded is not None:
        hi = min(hi, bounded)
    return Estimate(scale * mean, scale * lo, scale * hi, exact=False, draws=draws, confidence=confidence,
                    method="normal")


def _variance(hits: np.ndarray, draws: int) -> float:
    """The sample variance of ``draws`` draws whose nonzero ones are ``hits``: deviations from the
    mean, the zeros included, not a difference of squares (draws all of one weight have no
    variance, not a rounding error's)."""
    mean = float(hits.sum()) / draws
    return max(0.0, (float(np.square(hits - mean).sum()) + (draws - len(hits)) * mean * mean) / (draws - 1))


def probability(parts: Sequence[Tuple[Any, Sequence[Tuple[float, float, bool, int]], Sequence[int]]],
                bounded: bool = False) -> Estimate:
    """The probability of a group of strings, from each measurement that can produce it: parts
    are (mass, rows, units), where ``mass`` (an ``execute.measure.Mass``) tells how the
    measurement was made, ``rows`` are (prob, weight, summed, stratum) of the group's rows in
    it, and ``units`` how many prefix token paths (exact) or draws (estimated) of the group's
    prefix class it has, per stratum (the part a draw measures, ``Mass.strata``).

    Exact: Σ prob / units, the mean over the class's prefix paths of P(group | path). Sampled:
    the mean of the draws' weight · 1(draw in group) over the class's draws, with the interval of
    that mean (Wilson's when every weight is 1, else the normal approximation): given how many
    draws fell in the class, they are independent draws of a prefix path uniform over it, so
    this is a conditional mean over ``units`` draws; plus Σ prob of the rows summed exactly
    beside the draws (``summed``: one prefix path, whose draws never give those rows), which
    shifts the interval and does not widen it. Where the draws alternate between disjoint parts
    (the canonical tokenizations and the others), the value is the sum of the parts' means
    (``estimate_mean``). Several measurements (a dataset's rows) are averaged, their interval
    half-widths combined in quadrature. ``bounded``: the group is the whole language of one
    measurement, so that its certain bound (``mass.bound``) narrows the estimate's interval (and is
    the value where no draw was made)."""
    values = []
    for mass, rows, strata in parts:
        bound = getattr(mass, "bound", None)
        if bound is not None and not mass.draws:  # the bound alone: certain, from below and above
            low, high = (bound.low, bound.high) if bounded and len(parts) == 1 else (0.0, 1.0)
            values.append(Estimate(low, low, high, exact=False, confidence=mass.confidence, method="bound"))
            continue
        units = sum(strata)
        if units <= 0:
            continue
        if mass.exact:
            values.append(Estimate(min(1.0, math.fsum(r[0] for r in rows) / units), confidence=mass.confidence))
            continue
        drawn = [r for r in rows if not r[2]]
        e = estimate_mean([r[1] for r in drawn], units, 1.0, 1.0, mass.confidence, mass.binary,
                          parts=[([r[1] for r in drawn if r[3] == h], n) for h, n in enumerate(strata)])
        known = math.fsum(r[0] for r in rows if r[2])
        if known:
            e = Estimate(min(1.0, known + e), min(1.0, known + e.low), min(1.0, known + e.high), exact=False,
                         draws=e.draws, confidence=e.confidence, method=e.method)
        if bound is not None and bounded and len(parts) == 1:
            e = within_bound(e, bound)
        values.append(e)
    if len(values) == 1:
        return values[0]
    if not values:
        return Estimate(0.0)
    k = len(values)
    value = math.fsum(values) / k
    if all(v.exact for v in values):
        return Estimate(value, confidence=values[0].confidence)
    down = math.sqrt(math.fsum((v - v.low) ** 2 for v in values)) / k
    up = math.sqrt(math.fsum((v.high - v) ** 2 for v in values)) / k
    return Estimate(value, max(0.0, value - down), min(1.0, value + up), exact=False,
                    draws=sum(v.draws for v in values), confidence=values[0].confidence, method="normal")


def within_bound(e: Estimate, bound) -> Estimate:
    """An estimate's interval narrowed by a certain bound (``execute.bounds.Bound``): it still holds
    the value whenever the estimate's does (the bound alone where they do not meet; ``method``
    then ``bound``, and ``<method>+bound`` where one end is the bound's)."""
    low, high = bound.within(e.low, e.high)
    if (low, high) == (e.low, e.high):
        return e
    method = "bound" if (low, high) == (bound.low, bound.high) else f"{e.method}+bound"
    return Estimate(min(max(float(e), low), high), low, high, exact=False, draws=e.draws, confidence=e.confidence,
                    method=method)


def ci_bound(x, which: str):
    """``low`` or ``high`` end of an ``Estimate``'s interval (a plain number is its own)."""
    return getattr(x, which, x)


@dataclass(frozen=True)
class Chi2Result:
    """A χ² test of independence of two variables over a contingency table.

    ``table`` holds the counts (rows: values of ``a``, columns: values of ``b``), ``n`` their
    total. ``scaled``: the cells were probabilities, turned into counts of ``n_per_row`` draws
    per value of ``a``. ``cramers_v``: the strength of the association (0 to 1), which unlike the
    p-value does not grow with the sample size. ``small``: of a table of counts (not scaled), the
    cells whose expected count is under 5, where the χ² approximation of the p-value is poor;
    ``fisher_p``: then, for a 2 × 2 table of whole counts, Fisher's exact test's p-value."""

    a: str
    b: str
    statistic: float
    dof: int
    p_value: float
    n: float
    cramers_v: float
    a_values: Tuple[Any, ...]
    b_values: Tuple[Any, ...]
    table: Tuple[Tuple[float, ...], ...]
    scaled: bool = False
    n_per_row: Optional[float] = None
    small: int = 0
    fisher_p: Optional[float] = None

    def summary(self) -> str:
        """One line: the test, its statistic, degrees of freedom and p-value (and where the
        expected counts are too small for it, how many, and Fisher's exact p-value)."""
        how = f"probabilities as {self.n_per_row:,g} draws per {self.a}" if self.scaled else f"n = {self.n:,g}"
        line = (f"χ² test of independence of {self.a} and {self.b}: χ² = {self.statistic:.4g}, "
                f"dof = {self.dof}, p = {format_p(self.p_value)}, Cramér's V = {self.cramers_v:.3g} ({how})")
        if self.small:
            cells = len(self.table) * len(self.table[0])
            line += (f"; {self.small} of {cells} cells expect fewer than 5 rows, where χ²'s p-value is unreliable"
                     + (f": Fisher's exact test gives p = {format_p(self.fisher_p)}" if self.fisher_p is not None
                        else " (draw more, or merge rare values)"))
        return line


def cramers_v_interval(test: Chi2Result, confidence: float = DEFAULT_CONFIDENCE) -> Estimate:
    """Cramér's V of a table of counts drawn at random, with its interval at ``confidence``: the
    noncentrality λ = n·V²·(k − 1) of χ²'s distribution where the statistic observed is its
    1 − α/2 and α/2 point (the inversion of Steiger and Fouladi, 1997), λ = 0 where even
    independence puts it lower. Unlike the p-value, V is a property of the model, which more
    draws pin down."""
    from scipy.optimize import brentq
    from scipy.stats import chi2, ncx2
    x, df, alpha = test.statistic, test.dof, 1 - confidence

    def below(lam: float) -> float:  # P(χ²(df, λ) ≤ x)
        return float(chi2.cdf(x, df) if lam <= 0 else ncx2.cdf(x, df, lam))

    def solve(q: float) -> float:  # the λ at which P(χ²(df, λ) ≤ x) = q; it falls as λ grows
        if below(0.0) <= q:
            return 0.0
        high = max(1.0, 2 * x)
        while below(high) > q:
            high *= 2
        return brentq(lambda lam: below(lam) - q, 0.0, high, xtol=1e-12 * high)
    scale = test.n * (min(len(test.table), len(test.table[0])) - 1)
    low, high = (math.sqrt(solve(q) / scale) for q in (1 - alpha / 2, alpha / 2))
    return Estimate(test.cramers_v, min(low, test.cramers_v), min(1.0, max(high, test.cramers_v)), exact=False,
                    draws=int(test.n), confidence=confidence, method="noncentral chi2")


def format_p(p: float) -> str:
    """A p-value as people write it; underflow below 1e-300 shows as such, not as 0."""
    if p == 0:
        return "< 1e-300"
    return f"{p:.3g}"


def sort_key(v):
    """How values sort in results: NULL last, numbers together (first), other types (booleans
    among them) by type name."""
    v = unkey(v)
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    return (v is None, "" if number else type(v).__name__, v if v is not None else 0)


@dataclass(frozen=True)
class BoolKey:
    """A boolean as a key (``hashable``): Python takes true for 1, a database does not."""
    value: bool


def hashable(v):
    """``v`` as a key of a group or a cell: a list as a tuple (token lists), a JSON object (or a
    list holding one) as its JSON text, so that data files' nested values can be grouped; a
    boolean as a ``BoolKey`` (``unkey`` gives the value back)."""
    if isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v)):
        return json.dumps(v, sort_keys=True, ensure_ascii=False, default=str)
    if isinstance(v, bool):
        return BoolKey(v)
    return tuple(hashable(x) for x in v) if isinstance(v, list) else v


def unkey(k):
    """The value a ``hashable`` key stands for (a list as a tuple)."""
    if isinstance(k, BoolKey):
        return k.value
    return tuple(unkey(x) for x in k) if isinstance(k, tuple) else k


def contingency(rows: Sequence[Mapping[str, Any]], a: str, b: str, weight: Optional[str] = None
                ) -> Tuple[List[Any], List[Any], np.ndarray]:
    """The table of ``a`` × ``b`` over ``rows`` (dicts): each row adds its ``weight`` (1 when
    not given) to its cell. Missing cells are zero."""
    cells: Dict[Tuple[Any, Any], float] = {}
    for r in rows:
        for col in (a, b) + ((weight,) if weight else ()):
            if col not in r:
                raise KeyError(col)
        w = 1.0 if weight is None else r[weight]
        if w is None or r[a] is None or r[b] is None:  # NULLs are left out, as aggregates do
            continue
        if isinstance(w, bool) or not isinstance(w, (int, float)):
            raise ValueError(f"the weight {weight!r} must be a number, not {w!r}")
        key = (hashable(r[a]), hashable(r[b]))
        cells[key] = cells.get(key, 0.0) + float(w)
    a_keys = sorted({k[0] for k in cells}, key=sort_key)
    b_keys = sorted({k[1] for k in cells}, key=sort_key)
    table = np.zeros((len(a_keys), len(b_keys)))
    for (x, y), w in cells.items():
        table[a_keys.index(x), b_keys.index(y)] += w
    return [unkey(k) for k in a_keys], [unkey(k) for k in b_keys], table


MAX_TEST_DRAWS = 10 ** 12  # draws a probability may stand for in a test (far more overflow scipy's arithmetic)


def chi2_independence(rows: Sequence[Mapping[str, Any]], a: str, b: str, weight: Optional[str] = None,
                      n_per_row: Optional[float] = None) -> Chi2Result:
    """The χ² test of independence of columns ``a`` and ``b`` of ``rows`` (dicts).

    Cells hold counts of rows, or the sums of ``weight``. Counts are used as they are; with
    ``n_per_row``, each value of ``a`` is rescaled to that many draws (for probabilities, which
    carry no sample size of their own). Cells that are zero for a whole row or column are
    dropped, as the test needs positive expected counts."""
    from scipy.stats import chi2_contingency
    a_vals, b_vals, table = contingency(rows, a, b, weight)
    if (table < 0).any():
        raise ValueError("a contingency table needs counts or probabilities of zero or more")
    keep_r, keep_c = table.sum(axis=1) > 0, table.sum(axis=0) > 0
    table = table[keep_r][:, keep_c]
    a_vals = [v for v, k in zip(a_vals, keep_r) if k]
    b_vals = [v for v, k in zip(b_vals, keep_c) if k]
    if table.shape[0] < 2 or table.shape[1] < 2:
        raise ValueError(f"a test of independence needs at least two values of {a} and of {b} with nonzero "
                         f"cells; found {table.shape[0]} × {table.shape[1]}")
    if n_per_row is not None:
        if not 0 < n_per_row <= MAX_TEST_DRAWS:
            raise ValueError(f"n_per_row must be positive and at most {MAX_TEST_DRAWS:.0e}, not {n_per_row!r}")
        table = table / table.sum(axis=1, keepdims=True) * n_per_row
    stat, p, dof, expected = chi2_contingency(table, correction=False)
    n = float(table.sum())
    v = math.sqrt(stat / (n * (min(table.shape) - 1)))
    small = int((expected < 5).sum()) if n_per_row is None else 0
    fisher_p = None
    if small and table.shape == (2, 2) and (table == np.round(table)).all():
        from scipy.stats import fisher_exact
        fisher_p = float(fisher_exact(table.astype(np.int64))[1])
    return Chi2Result(a, b, float(stat), int(dof), float(p), n, v, tuple(a_vals), tuple(b_vals),
                      tuple(tuple(float(x) for x in row) for row in table), n_per_row is not None, n_per_row,
                      small, fisher_p)


__all__ = ["Estimate", "wilson", "cramers_v_interval", "within_bound", "estimate_mean", "probability", "ci_bound",
           "chi2_independence", "contingency", "Chi2Result", "format_p",
           "sort_key", "DEFAULT_CONFIDENCE", "MAX_TEST_DRAWS"]
