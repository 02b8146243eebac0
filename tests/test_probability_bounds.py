"""The search's certain bounds on probability(): against exact sums by direct transformers
scoring, at every budget; in probability()'s interval; and as the ground of a verdict."""

from __future__ import annotations

import math

import pytest

from relmql.automata import CompileOptions, compile
from relmql.execute.bounds import bound_search
from relmql.records import Decoding, Measure

from test_probability import oracle_probability

CASES = [  # (pattern, prefix, eos, rules, tokenization): finite, so that an exact sum is the oracle
    ("It is (red|blue|green)( now)?", "It is", True, {}, "canonical"),
    ("I am [0-9]{1,2}", "I am", False, {"topk": 200}, "canonical"),
    ("The (cat|dog|bird)( sat| ran)?", "The", False, {}, "all"),
    ("(on|in) (a|the) (box|bag)", None, False, {}, "canonical"),
]
BUDGETS = (1, 2, 4, 8, 32, 4096)


@pytest.fixture(scope="module")
def smol_con(smol):
    import relmql
    session = relmql.connect(dtype="float32")
    session.models.put("smollm2-135m", "cpu", "float32", smol)
    return session


def _rules(eos, rules) -> Decoding:
    return Decoding(eos=eos, topk=rules.get("topk"))


@pytest.mark.parametrize("pattern,prefix,eos,rules,tokenization", CASES)
def test_the_bound_holds_the_exact_sum_at_every_budget_and_closes_on_it(smol, pattern, prefix, eos, rules,
                                                                        tokenization):
    """low ≤ exact ≤ high after any number of nodes; more nodes never loosen either end; a search
    that exhausts the language gives the exact sum itself."""
    options = CompileOptions(tokenization=tokenization)
    want = sum(oracle_probability(smol, pattern, prefix, options, eos=eos, **rules).values())
    automaton = compile(pattern, smol.vocabulary, prefix, options)
    lows, highs, done = [], [], None
    for nodes in BUDGETS:
        rows, bound = bound_search(automaton, smol, _rules(eos, rules), Measure(bound_nodes=nodes))
        assert bound.low <= want * (1 + 1e-4) + 1e-12 and want <= bound.high * (1 + 1e-4) + 1e-12, (nodes, bound)
        assert bound.low == pytest.approx(math.fsum(r.prob for r in rows), rel=2e-5)  # less SLACK for rounding
        lows.append(bound.low)
        highs.append(bound.high)
        if bound.exhausted:
            done = bound
    assert all(a <= b + 1e-12 for a, b in zip(lows, lows[1:])) and all(a >= b - 1e-12 for a, b in zip(highs, highs[1:]))
    assert highs[0] > lows[0]  # one node decides nothing here: the bound is not the sum in disguise
    assert done is not None and done.low == done.high == pytest.approx(want, rel=1e-4)


def test_an_infinite_language_is_bounded_from_both_sides(smol):
    """``[A-Z][a-z]+`` after "The capital of France is": the strings found and what is left both
    move towards each other, and the exact sum within max_tokens 2 lies between them."""
    pattern, prefix = "The capital of France is [A-Z][a-z]+", "The capital of France is"
    automaton = compile(pattern, smol.vocabulary, prefix, CompileOptions())
    short = Measure(max_tokens=2, exact_limit=10 ** 9)
    bounds = [bound_search(automaton, smol, Decoding(), Measure(bound_nodes=n, max_tokens=2))[1] for n in (2, 16)]
    exact = math.fsum(r.prob for r in _exact_rows(automaton, smol, short))
    for b in bounds:
        assert b.low <= exact * (1 + 1e-6) and exact <= b.high * (1 + 1e-6) and not b.exhausted
    assert bounds[1].high - bounds[1].low < bounds[0].high - bounds[0].low < 0.5


def _exact_rows(automaton, model, opts):
    from relmql.execute import shortest_path
    return list(shortest_path(automaton, model, Decoding(), opts.exact()))


def test_probability_shows_the_bound_where_it_is_tighter(smol_con, smol):
    q = ("SELECT probability() AS p MATCHING 'The capital of France is [A-Z][a-z]+' "
         "PREFIX 'The capital of France is' USING estimate_samples 200, bound_nodes {}")
    drawn = smol_con.sql(q.format(0)).fetchone()[0]
    bounded = smol_con.sql(q.format(256)).fetchone()[0]
    automaton = compile("The capital of France is [A-Z][a-z]+", smol.vocabulary,
                        "The capital of France is", CompileOptions())
    _, bound = bound_search(automaton, smol, Decoding(), Measure(bound_nodes=256))
    assert drawn.method == "normal" and not bounded.exact and bounded.method == "bound"
    assert bound.low == bounded.low <= bounded <= bounded.high == bound.high
    assert 0 < bound.high - bound.low < 0.002
    # every one of the 200 draws took a one-token name: no sample variance, and an interval of no width
    # that misses the value (it lies above the bound); the bound is then the interval, for certain
    assert drawn.low == drawn.high > bound.high
    # an infinite language whose strings the search reads whole within its nodes (a date's number ends
    # where the model's next token is not a digit: first_match) is summed
    exhausted = smol_con.sql("SELECT probability() MATCHING 'George Washington was born on (January|February) "
                             "[0-9]+' PREFIX 'George Washington was born on'").fetchone()[0]
    summed = smol_con.sql("SELECT probability() MATCHING 'George Washington was born on (January|February) "
                          "[0-9]+' PREFIX 'George Washington was born on' USING max_tokens 3").fetchone()[0]
    assert exhausted.exact and exhausted >= summed  # max_tokens 3 leaves out longer numbers


@pytest.mark.parametrize("condition,status", [("p > 0.5", "pass"), ("p > 0.95", "fail"), ("p < 0.95", "pass"),
                                              ("p < 0.5", "fail")])
def test_a_verdict_rests_on_the_bound_without_a_draw(smol_con, condition, status):
    r = smol_con.sql("SELECT probability() AS p MATCHING 'The capital of France is [A-Z][a-z]+' "
                     f"PREFIX 'The capital of France is' EXPECT {condition}")
    v = r.verdict
    assert (v.status, v.kind, v.draws) == (status, "bound", 0) and v.interval[0] < v.interval[1]
    assert "[bound" in v.line_text()


def test_a_verdict_the_bound_cannot_decide_goes_on_to_draws(smol_con, smol):
    """A threshold inside the bound's interval: the draws decide (their interval narrowed by it)."""
    q = ("SELECT probability() AS p MATCHING 'My phone number is [0-9]{3}-[0-9]{3}-[0-9]{4}' "
         "PREFIX 'My phone number is' USING estimate_samples 200, bound_nodes 256 EXPECT p > 0.02")
    automaton = compile("My phone number is [0-9]{3}-[0-9]{3}-[0-9]{4}", smol.vocabulary, "My phone number is",
                        CompileOptions())
    _, bound = bound_search(automaton, smol, Decoding(), Measure(bound_nodes=256))
    assert bound.low < 0.02 < bound.high  # the bound alone cannot decide
    v = smol_con.sql(q).verdict
    assert (v.kind, v.status) == ("estimate", "pass") and v.draws >= 200
    assert bound.low <= v.interval[0] and v.interval[1] <= bound.high


def test_a_verdict_that_reads_more_than_probability_draws_at_once(smol_con):
    """The bound's round has no draws: a count(*) beside probability() would read 0 there, so such a
    verdict is judged on the draws (their count is the hits among them)."""
    v = smol_con.sql("SELECT probability() AS p, count(*) AS n MATCHING 'The capital of France is [A-Z][a-z]+' "
                     "PREFIX 'The capital of France is' USING estimate_samples 100 EXPECT p > 0.5 AND n > 0").verdict
    assert v.status == "pass" and v.draws == 100 and "n = 100" in v.value  # every draw is a capitalized word
