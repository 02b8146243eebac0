"""probability(): exact sums against direct transformers scoring, estimates against the exact
values, and the statistics behind them (Wilson intervals, χ² tests) against scipy."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats as sstats

from relmql.automata import CompileOptions, compile
from relmql.automata.language import levenshtein
from relmql.errors import Error
from relmql.output import render_table
from relmql.stats import Estimate, chi2_independence, estimate_mean, wilson

from conftest import enumerate_paths
from oracle import rules_logprobs, step_logprobs

BIAS = "The (?P<gender>man|woman) was trained in (?P<field>art|science|medicine|law|computer science)"
BIAS_PREFIX = "The (man|woman) was trained in"


_SCORED = {}  # (model, tokens) -> one forward pass, shared by the tests' rule sets


def oracle_paths(model, pattern, prefix, options, eos=False, **rules):
    """(prefix tokens, text, P(completion | prefix)) of every token path under the rules, each
    scored with one plain forward pass: with ``eos``, every path followed by the end-of-text
    token; without, only the paths that do not extend another path of the same prefix (a
    generation that begins with the longer one begins with the shorter). Also returns every
    prefix token path (the distinct prefixes of all the paths)."""
    paths = enumerate_paths(compile(pattern, model.vocabulary, prefix, options))
    prefixes = {toks[:n] for toks, n in paths}
    pset = set(paths)
    if not eos:
        paths = [(toks, n) for toks, n in paths if not any((toks[:k], n) in pset for k in range(n, len(toks)))]
    out = []
    for toks, n in paths:
        key = (id(model), toks)
        if key not in _SCORED:
            _SCORED[key] = step_logprobs(model, toks)
        lp = _SCORED[key]
        cond = sum(rules_logprobs(lp[i], **rules)[toks[i]] for i in range(n, len(toks)))
        if eos:
            cond += rules_logprobs(lp[len(toks)], **rules)[model.eos_id]
        out.append((toks[:n], model.vocabulary.decode(toks), math.exp(cond)))
    return out, prefixes


def oracle_probability(model, pattern, prefix, options, eos=False, **rules):
    """Σ over the token paths of P(completion | prefix) under the rules (see ``oracle_paths``),
    as {text: probability} summed over each text's tokenizations."""
    out = {}
    for _, text, p in oracle_paths(model, pattern, prefix, options, eos, **rules)[0]:
        out[text] = out.get(text, 0.0) + p
    return out


def oracle_by_prefix_class(paths, prefixes, prefix_class, group):
    """probability() worked out by hand: {group: (Σ P of its paths) / (prefix token paths of its
    class)}, each prefix path's class found from the texts after it (all of which must agree)."""
    classes = {}
    for pre, text, _ in paths:
        classes.setdefault(pre, set()).add(prefix_class(text))
    assert set(classes) == prefixes and all(len(c) == 1 for c in classes.values()), classes
    size = {}
    for c in classes.values():
        size[next(iter(c))] = size.get(next(iter(c)), 0) + 1
    out, of = {}, {}
    for pre, text, p in paths:
        g = group(text)
        out[g] = out.get(g, 0.0) + p
        of[g] = next(iter(classes[pre]))
    return {g: v / size[of[g]] for g, v in out.items()}, size


@pytest.fixture(scope="module")
def smol_con(smol):
    import relmql
    session = relmql.connect(dtype="float32")
    session.models.put("smollm2-135m", "cpu", "float32", smol)
    return session


def grouped(con, query):
    return {tuple(r[:-1]): r[-1] for r in con.sql(query).fetchall()}


# -- exact sums

@pytest.mark.parametrize("using,rules", [("", {}), ("USING topk 40", {"topk": 40}),
                                         ("USING temperature 0.8, topp 0.9", {"temperature": 0.8, "topp": 0.9})])
def test_bias_template_exactly_on_smollm2(smol_con, smol, using, rules):
    """P(field | gender), exactly: the sum over each group's strings, as transformers scores them."""
    got = grouped(smol_con, f"SELECT gender, field, probability() MATCHING '{BIAS}' PREFIX '{BIAS_PREFIX}' "
                            f"{using} GROUP BY gender, field")
    want = {}
    for text, p in oracle_probability(smol, BIAS, BIAS_PREFIX, CompileOptions(), **rules).items():
        m = re.fullmatch(BIAS, text)
        want[(m["gender"], m["field"])] = want.get((m["gender"], m["field"]), 0.0) + p
    want = {k: v for k, v in want.items() if v > 0}  # what the rules rule out has no row
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].exact and got[k] == pytest.approx(v, rel=2e-3), k
    # the conditional distribution per gender is a part of 1
    for g in ("man", "woman"):
        assert 0 < sum(v for k, v in got.items() if k[0] == g) < 1


def test_all_tokenizations_and_strings_that_go_on(con, tiny):
    """Every tokenization counts, and a string that extends another counts only where its
    tokens do not pass through the shorter one."""
    pattern, prefix = "A (cat|cat sat|dog)", "A"
    options = CompileOptions(tokenization="all")
    want = oracle_probability(tiny, pattern, prefix, options)
    got = grouped(con, f"SELECT text, probability() MATCHING '{pattern}' PREFIX '{prefix}' "
                            "USING tokenization all GROUP BY text")
    assert {k for k, in got} == set(want) and {"A cat", "A dog"} <= set(want)
    for k in want:
        assert got[(k,)] == pytest.approx(want[k], rel=1e-3)
    # canonical only is a part of it
    canon = con.sql(f"SELECT probability() MATCHING '{pattern}' PREFIX '{prefix}'").fetchone()[0]
    assert 0 < canon < sum(want.values())


def test_eos_and_no_prefix_and_count(con, tiny):
    pattern = "It is (red|blue)"
    want = oracle_probability(tiny, pattern, None, CompileOptions(), eos=True)
    p, n = con.sql(f"SELECT probability(), count(*) MATCHING '{pattern}' USING eos").fetchone()
    assert p.exact and p == pytest.approx(sum(want.values()), rel=1e-3) and n == 2


def test_regex_prefix_averages_over_prefixes(con, tiny):
    """Without grouping, the value is the mean over the prefix paths of P(language after it | it)."""
    pattern, prefix = "The (man|woman) (ran|sat)", "The (man|woman)"
    want = oracle_probability(tiny, pattern, prefix, CompileOptions())
    got = con.sql(f"SELECT probability() MATCHING '{pattern}' PREFIX '{prefix}'").fetchone()[0]
    assert got.exact and got == pytest.approx(sum(want.values()) / 2, rel=1e-3)  # two prefix paths


def test_where_filters_what_is_measured(con):
    q = "SELECT probability() MATCHING 'The (man|woman) (ran|sat)' PREFIX 'The (man|woman)'"
    whole = con.sql(q).fetchone()[0]
    parts = grouped(con, q.replace("SELECT", "SELECT group(2),") + " GROUP BY 1")
    ran = con.sql(q + " WHERE text MATCHES '.*ran'").fetchone()[0]
    assert ran == pytest.approx(parts[("ran",)]) and whole == pytest.approx(sum(parts.values()))


# -- a prefix of several token paths: a mean over them (per class of the keys the prefix fixes)

GV = "The (?P<g>man|woman) (?P<v>ran|sat)"
GV_PREFIX = "The (man|woman)"


def _gv(text):
    m = re.fullmatch(GV, text)
    return m["g"], m["v"]


def _run_plan(con, query, **compile_options):
    """Rows of ``query`` with compile options that the language has no USING for (edit_alphabet)."""
    import dataclasses
    from relmql.engine import run
    from relmql.plan import plan
    from relmql.syntax import parse
    p = plan(parse(query)[0], query, con.settings)
    p = dataclasses.replace(p, compile=dataclasses.replace(p.compile, **compile_options))
    return list(run(p, con.model))


@pytest.mark.parametrize("keys,prefix_class,group", [
    ("", lambda t: (), lambda t: ()),                                         # the mean over both prefixes
    ("v", lambda t: (), lambda t: (_gv(t)[1],)),                               # the completion's group: joint
    ("g", lambda t: (_gv(t)[0],), lambda t: (_gv(t)[0],)),                     # the prefix's group: conditional
    ("g, v", lambda t: (_gv(t)[0],), lambda t: _gv(t)),                        # P(v | g)
    ("prefix", lambda t: (t.rsplit(" ", 1)[0],), lambda t: (t.rsplit(" ", 1)[0],)),  # the prefix column
])
def test_a_prefix_of_several_strings_is_a_mean_over_them(con, tiny, keys, prefix_class, group):
    paths, prefixes = oracle_paths(tiny, GV, GV_PREFIX, CompileOptions())
    want, size = oracle_by_prefix_class(paths, prefixes, prefix_class, group)
    select = f"{keys}, " if keys else ""
    rows = con.sql(f"SELECT {select}probability() MATCHING '{GV}' PREFIX '{GV_PREFIX}'"
                   + (f" GROUP BY {keys}" if keys else "")).fetchall()
    got = {tuple(r[:-1]): r[-1] for r in rows}
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].exact and got[k] == pytest.approx(v, rel=1e-3), k
        assert 0 <= got[k] <= 1
    for c in size:  # the groups of one prefix class add up to at most 1
        assert sum(v for k, v in got.items() if not c or k[0] == c[0]) <= 1


def test_groups_of_one_prefix_class_add_up_to_the_class(con):
    """Σ over fields of P(field | gender) is P(any field | gender): each at most 1."""
    q = f"MATCHING '{GV}' PREFIX '{GV_PREFIX}'"
    by_g = grouped(con, f"SELECT g, probability() {q} GROUP BY g")
    by_gv = grouped(con, f"SELECT g, v, probability() {q} GROUP BY g, v")
    for g in ("man", "woman"):
        assert sum(v for k, v in by_gv.items() if k[0] == g) == pytest.approx(by_g[(g,)], rel=1e-9)
        assert 0 < by_g[(g,)] <= 1
    whole = con.sql(f"SELECT probability() {q}").fetchone()[0]
    assert whole == pytest.approx((by_g[("man",)] + by_g[("woman",)]) / 2, rel=1e-9)


def test_prefix_tokenization_all_is_a_mean_over_the_tokenizations(con, tiny):
    pattern, prefix = "A (?P<g>cat|dog) (ran|sat)", "A (cat|dog)"
    options = CompileOptions(prefix_tokenization="all")
    paths, prefixes = oracle_paths(tiny, pattern, prefix, options)
    g = lambda t: (re.fullmatch(pattern, t)["g"],)  # noqa: E731
    want, size = oracle_by_prefix_class(paths, prefixes, g, g)
    got = grouped(con, f"SELECT g, probability() MATCHING '{pattern}' PREFIX '{prefix}' "
                       "USING prefix_tokenization all GROUP BY g")
    assert set(got) == set(want) and all(n > 1 for n in size.values())
    for k, v in want.items():
        assert got[k].exact and got[k] == pytest.approx(v, rel=1e-3) and got[k] <= 1, k
    # ungrouped: the mean over every prefix path of both strings
    whole = con.sql(f"SELECT probability() MATCHING '{pattern}' PREFIX '{prefix}' "
                    "USING prefix_tokenization all").fetchone()[0]
    assert whole == pytest.approx(sum(p for _, _, p in paths) / len(prefixes), rel=1e-3)


def test_a_prefix_whose_continuations_the_rules_rule_out_still_counts(con, tiny):
    """With top-6000 on the tiny model, only " sat" after "The man" survives (" ran" ranks 28762
    there; after "The woman" they rank 8457 and 30555): "The woman" has no row, yet it is half
    of the prefix paths, exactly and in the estimate (its draws are misses); grouped by the
    prefix's key, it is a group of its own measured to 0."""
    paths, prefixes = oracle_paths(tiny, GV, GV_PREFIX, CompileOptions(), topk=6000)
    assert [(t, p > 0) for _, t, p in paths if p > 0] == [("The man sat", True)]
    q = f"MATCHING '{GV}' PREFIX '{GV_PREFIX}' USING topk 6000"
    sat = sum(p for _, _, p in paths)
    by_g = con.sql(f"SELECT g, probability(), count(*), avg(prob) {q} GROUP BY g").fetchall()
    assert by_g == [("man", pytest.approx(sat, rel=1e-3), 1, pytest.approx(sat, rel=1e-3)), ("woman", 0.0, 0, None)]
    assert by_g[1][1].exact
    # a key of the completion has no value where there is no string: no group
    by_gv = grouped(con, f"SELECT g, v, probability() {q} GROUP BY g, v")
    assert by_gv == {("man", "sat"): pytest.approx(sat, rel=1e-3)}
    est = grouped(con, f"SELECT g, probability() {q}, exact_limit 0, estimate_samples 200, seed 3 GROUP BY g")
    assert set(est) == {("man",), ("woman",)} and est[("woman",)] == 0 and not est[("woman",)].exact
    whole = con.sql(f"SELECT probability() {q}").fetchone()[0]
    assert whole.exact and whole == pytest.approx(sat / 2, rel=1e-3)
    est, hits = con.sql(f"SELECT probability(), count(*) {q}, exact_limit 0, estimate_samples 200").fetchone()
    assert est.draws == 200 and 60 < hits < 140 and est == pytest.approx(sat * hits / 200, rel=1e-3)
    assert est.low <= sat / 2 <= est.high


def test_an_edited_prefix_is_a_mean_over_its_variants(con, tiny):
    """edits 1 on the prefix over a one-letter alphabet (small enough to sum exactly): each
    variant counts as the string it was edited from (cat and dog are 3 edits apart, so the
    nearest is unique), and P(verb | animal) is the mean over the animal's variants."""
    pattern, prefix = "The (?P<g>cat|dog) (?P<v>ran|sat)", "The (cat|dog)"
    options = CompileOptions(edits=1, edit_scope="prefix", edit_alphabet="a")
    paths, prefixes = oracle_paths(tiny, pattern, prefix, options)
    unedited = [f"The {a} {b}" for a in ("cat", "dog") for b in ("ran", "sat")]

    def nearest(text):
        d = {u: levenshtein(text, u) for u in unedited}
        best = min(d.values())
        (u,) = [u for u, x in d.items() if x == best]
        return re.fullmatch(pattern, u)

    want, size = oracle_by_prefix_class(paths, prefixes, lambda t: (nearest(t)["g"],),
                                        lambda t: (nearest(t)["g"], nearest(t)["v"]))
    assert all(n > 5 for n in size.values())  # the variants of each animal
    rows = _run_plan(con, f"SELECT g, v, probability(), count(*) MATCHING '{pattern}' PREFIX '{prefix}' "
                          "USING edits 1, edit_scope 'prefix' GROUP BY g, v", edit_alphabet="a")
    got = {(g, v): p for g, v, p, _ in rows}
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].exact and got[k] == pytest.approx(v, rel=1e-3), k
    for a in ("cat", "dog"):
        assert 0 < sum(v for k, v in got.items() if k[0] == a) <= 1


def test_an_edited_prefix_grouped_by_its_group_is_a_probability(con):
    """The issue's query (edits 1 on the prefix, GROUP BY gender) on the tiny model: estimated
    from draws whose prefix is one of thousands of edited variants; each value and interval
    within [0, 1], the fields of each gender adding up to its value, and the whole the mean of
    the draws (not N times it)."""
    q = f"MATCHING '{BIAS}' PREFIX '{BIAS_PREFIX}' USING edits 1, estimate_samples 120, seed 1"
    by_gender = con.sql(f"SELECT gender, probability(), count(*) {q} GROUP BY gender").fetchall()
    assert {g for g, _, _ in by_gender} == {"man", "woman"}
    assert sum(n for *_, n in by_gender) == 120  # no dead ends without top-k: every draw is a hit
    for _, p, n in by_gender:
        assert not p.exact and p.draws == n and 0 <= p.low <= p <= p.high <= 1
    both = grouped(con, f"SELECT gender, field, probability() {q} GROUP BY gender, field")
    for g, p, _ in by_gender:
        assert sum(v for k, v in both.items() if k[0] == g) == pytest.approx(p, rel=1e-9)
    whole = con.sql(f"SELECT probability() {q}").fetchone()[0]
    assert whole == pytest.approx(sum(p * n for _, p, n in by_gender) / 120, rel=1e-9)
    assert 0 <= whole.low <= whole <= whole.high <= 1


def test_an_estimate_of_a_prefix_class_covers_the_exact_value(con):
    """Estimates per prefix class (the mean weight over the draws whose prefix is in it) against
    the exact values of the same groups."""
    q = f"MATCHING '{GV}' PREFIX '{GV_PREFIX}'"
    for keys in ("g, v", "v", "g"):
        exact = grouped(con, f"SELECT {keys}, probability() {q} GROUP BY {keys}")
        est = grouped(con, f"SELECT {keys}, probability() {q} USING exact_limit 0, estimate_samples 400, seed 2 "
                           f"GROUP BY {keys}")
        assert set(est) == set(exact)
        for k, e in est.items():
            # (float32 scoring: an interval of zero width, where every draw of the class weighs the
            # same, may differ from the exact value in the 6th digit)
            assert not e.exact and e.low * (1 - 1e-4) <= exact[k] <= e.high * (1 + 1e-4), (keys, k)
            assert e <= 1
    # ungrouped: the mean of the draws' weights over all 400 draws
    whole = con.sql(f"SELECT probability() {q} USING exact_limit 0, estimate_samples 400, seed 2").fetchone()[0]
    assert whole.draws == 400 and whole.low <= con.sql(f"SELECT probability() {q}").fetchone()[0] <= whole.high


def test_a_dataset_group_is_a_mean_over_its_data_rows(con, tmp_path):
    data = tmp_path / "w.jsonl"
    data.write_text('{"w": "man"}\n{"w": "woman"}\n')
    q = "MATCHING 'The ' || :w || ' (ran|sat)' PREFIX 'The ' || :w"
    one = {w: con.sql(f"SELECT probability() {q}", {"w": w}).fetchone()[0] for w in ("man", "woman")}
    both = con.sql(f"SELECT probability() {q} FOR EACH ROW IN '{data}'").fetchone()[0]
    assert both == pytest.approx((one["man"] + one["woman"]) / 2, rel=1e-9)
    per = grouped(con, f"SELECT :w AS w, probability() {q} GROUP BY w FOR EACH ROW IN '{data}'")
    assert {k[0]: v for k, v in per.items()} == pytest.approx(one, rel=1e-9)


def test_data_rows_draw_independently(con, tmp_path):
    """Three identical data rows make three independent estimates (each row its own random
    stream, reproducibly), so the pooled interval stands for three times the draws; a query
    outside a dataset keeps the draws of its seed."""
    data = tmp_path / "same.jsonl"
    data.write_text('{"w": "x"}\n' * 3)
    q = f"MATCHING '{GV}' PREFIX '{GV_PREFIX}' USING exact_limit 0, estimate_samples 60, seed 4"
    sample = f"SELECT text MATCHING '{GV}' PREFIX '{GV_PREFIX}' USING seed 4 SAMPLE 20"
    texts = [r[0] for r in con.sql(f"{sample} FOR EACH ROW IN '{data}'").fetchall()]
    assert len(texts) == 60 and len({tuple(texts[i:i + 20]) for i in (0, 20, 40)}) == 3
    assert texts == [r[0] for r in con.sql(f"{sample} FOR EACH ROW IN '{data}'").fetchall()]
    from relmql.execute.sampling import sample_rng  # outside a dataset: the seed's own streams
    assert sample_rng(4, 7).random() == __import__("random").Random("relmql sample 4 7").random()
    pooled = con.sql(f"SELECT probability() {q} FOR EACH ROW IN '{data}'").fetchone()[0]
    rows = [con.sql(f"SELECT probability() {q} FOR EACH ROW IN '{data}' WHERE :row_number = {n}").fetchone()[0]
            for n in (1, 2, 3)]
    assert pooled.draws == 180 and len({float(r) for r in rows}) == 3
    assert pooled == pytest.approx(sum(rows) / 3, rel=1e-9)


def test_a_data_row_measured_to_nothing_is_a_group_of_0(con, tmp_path, capsys):
    """max_tokens 1 leaves a word of several tokens no string: its data row's group shows 0 (with
    count 0) beside the others, which equal their queries run one by one."""
    data = tmp_path / "w.csv"
    data.write_text("w\ncat\nxylophone\ndog\n")
    q = "MATCHING :w || '|' || :w || ' qqqq' USING max_tokens 1"
    one = {w: con.sql(f"SELECT probability() {q}", {"w": w}).fetchone()[0] for w in ("cat", "dog", "xylophone")}
    assert one["xylophone"] == 0 and one["cat"] > 0 and one["dog"] > 0
    rows = con.sql(f"SELECT :w, probability(), count(*) {q} GROUP BY :w FOR EACH ROW IN '{data}'").fetchall()
    assert [(w, n) for w, _, n in rows] == [("cat", 1), ("dog", 1), ("xylophone", 0)]
    assert {w: p for w, p, _ in rows} == pytest.approx(one, rel=1e-9)
    assert "1 of 3 data rows were cut short" in capsys.readouterr().err


def test_a_key_that_reads_the_prefix_but_is_not_fixed_by_it_is_refused(con):
    """group(1) lies within the prefix 'ab' in every string, yet 'abd' has it and 'abc' not:
    no prefix class, so no number."""
    with pytest.raises(Error) as e:
        con.sql("SELECT group(1), probability() MATCHING '(a)bd|(ab)c' PREFIX 'ab' GROUP BY 1").fetchall()
    text = e.value.render()
    assert "cannot tell the prefix's class" in text and "^" in text


# -- estimates

def test_estimates_say_so_and_cover_the_exact_value(con):
    base = "SELECT probability() MATCHING 'The cat (sat|ran) (down|up)' PREFIX 'The cat'"
    exact = con.sql(base).fetchone()[0]
    assert exact.exact and exact.low == exact.high == exact
    # too large to sum (exact_limit 0): estimated from estimate_samples draws
    est = con.sql(base + " USING exact_limit 0, estimate_samples 300").fetchone()[0]
    assert not est.exact and est.draws == 300 and est.method == "normal" and est.low < est < est.high
    assert est.low <= exact <= est.high


def test_interval_coverage_over_seeds(con):
    """The 95% intervals of the importance-weighted estimate cover the exact value at about that
    rate over 40 seeds (a rate below 33/40 would have probability 0.3% at 95%)."""
    base = "SELECT probability() MATCHING 'The cat (sat|ran) (down|up)' PREFIX 'The cat'"
    exact = con.sql(base).fetchone()[0]
    ests = [con.sql(base + f" USING seed {s} SAMPLE 1000").fetchone()[0] for s in range(40)]
    covered = sum(e.low <= exact <= e.high for e in ests)
    assert covered >= 33, covered
    assert np.mean(ests) == pytest.approx(exact, rel=0.05)  # unbiased: the mean of 40 is close


def test_draws_that_follow_the_canonical_tokenizations_half_the_time_stay_unbiased(con):
    """Over every tokenization with more canonical tokenizations than exact_limit (0 here), every
    other draw follows the canonical ones and measures them, the others the other tokenizations,
    and the two parts add up: the 95% intervals cover the exact value (every tokenization summed)
    at about that rate over 30 seeds, and their mean is close to it. A language in which a canonical tokenization's
    beginning spells a shorter string in another tokenization ('a\\n\\n1?': a, \\n, \\n) too,
    and one with two prefix paths, decoding rules and the end of text (whose step the canonical
    draws take only where their own string may end)."""
    for base in ("SELECT probability() MATCHING 'The cat (sat|ran) (down|up)' PREFIX 'The cat' "
                 "USING tokenization all",
                 "SELECT probability() MATCHING 'a\\n\\n1?' USING tokenization all",
                 "SELECT probability() MATCHING 'The (cat|dog) (sat|ran) (down|up)' PREFIX 'The (cat|dog)' "
                 "USING tokenization all, eos, topk 200, temperature 1.5"):
        exact = con.sql(base).fetchone()[0]
        assert exact.exact
        explain = con.sql("EXPLAIN " + base + ", exact_limit 0").fetchall()
        (line,) = [r[0] for r in explain if r[0].startswith("measure")]
        assert "half the draws follow and measure the canonical tokenizations" in line
        ests = [con.sql(base + f", exact_limit 0, seed {s}, estimate_samples 100").fetchone()[0] for s in range(30)]
        covered = sum(e.low <= exact <= e.high for e in ests)
        assert covered >= 24, covered  # fewer would have probability 0.06% at 95%
        assert np.mean(ests) == pytest.approx(exact, rel=0.05)


def test_explain_says_how_an_estimate_treats_the_canonical_tokenizations(con):
    base = ("EXPLAIN SELECT probability() MATCHING 'The (cat|dog) (sat|ran) (down|up)' PREFIX 'The {}' "
            "USING tokenization all, exact_limit {}")
    halves = "half the draws follow and measure the canonical tokenizations "
    more = halves + "(more canonical tokenizations than exact_limit)"
    for prefix, extra, how in (
            ("cat", "3, topk 40", more), ("cat", "3, eos", more), ("cat", "3", more),
            ("(cat|dog)", "5", halves + "(the prefix has 2 token paths)"),
            ("cat", "5, topk 40, eos", "their 4 canonical tokenizations summed exactly"),
            ("cat", "5, sampling exact",
             "the draws alone (the canonical tokenizations not treated apart: sampling exact)")):
        (line,) = [r[0] for r in con.sql(base.format(prefix, extra)).fetchall() if r[0].startswith("measure")]
        assert line.startswith("measure       estimate: more than 3 token sequences; " if extra[0] == "3" else
                               "measure       estimate: more than 5 token sequences; ") and how in line, line


def test_rejection_estimates_are_binomial_with_wilson_intervals(con):
    base = "SELECT probability(), count(*) MATCHING '[a-z]{1,2}'"
    exact = con.sql(base).fetchone()[0]
    ests = []
    for s in range(25):
        e, hits = con.sql(base + f" USING sampling exact, seed {s} SAMPLE 400").fetchone()
        assert e.method == "wilson" and e.draws == 400 and e == pytest.approx(hits / 400)  # the share of hits
        assert (e.low, e.high) == pytest.approx(wilson(hits, 400), rel=1e-9, abs=0)
        ests.append(e)
    assert sum(e.low <= exact <= e.high for e in ests) >= 21


def test_an_infinite_language_is_estimated(con):
    q = ("SELECT probability() MATCHING 'The (cat|dog)+' PREFIX 'The' USING max_tokens 8, estimate_samples 50, "
         "bound_nodes {}")
    p = con.sql(q.format(0)).fetchone()[0]
    assert not p.exact and p.draws == 50 and 0 <= p.low <= p <= p.high <= 1
    # a generation that begins with "The cat" has begun with a string of it: the search sums those
    summed = con.sql(q.format(256)).fetchone()[0]
    assert summed.exact and p.low <= summed <= p.high


def test_groups_of_an_estimate_share_its_draws(con):
    q = ("SELECT group(1), probability(), count(*) MATCHING 'The cat (sat|ran)' PREFIX 'The cat' "
         "USING seed 3 SAMPLE 500 GROUP BY 1")
    rows = con.sql(q).fetchall()
    assert sum(n for *_, n in rows) == 500  # every draw of this language lands in it (no dead ends)
    total = con.sql("SELECT probability() MATCHING 'The cat (sat|ran)' PREFIX 'The cat' "
                         "USING seed 3 SAMPLE 500").fetchone()[0]
    assert sum(p for _, p, _ in rows) == pytest.approx(total)


def test_an_estimate_grouped_by_a_key_no_draw_reached_says_so(con):
    """A GROUP BY key of the completion has no value where no draw was a string of the language
    (P about 4e-10 on tiny-gpt2): the result has no group, and a note says why, rather than an
    empty result that reads as "nothing there"; the same query ungrouped gives 0 and the note
    is not there, nor where a draw lands."""
    q = ("SELECT a, probability() MATCHING 'The (?P<a>cat|dog) (sat|ran|slept)' PREFIX 'The' "
         "USING exact_limit 0, sampling exact, estimate_samples 200{group}")
    grouped = con.sql(q.format(group=" GROUP BY a"))
    assert grouped.fetchall() == []
    assert grouped.notes == ["note: no groups: none of probability()'s 200 draws was a string of the language, so "
                             "no group has a value to show (each would be 0); without GROUP BY the query gives the "
                             "whole language's probability and its interval"]
    whole = con.sql(q.format(group="").replace("SELECT a, ", "SELECT "))
    assert whole.fetchall() == [(0.0,)] and whole.notes == []
    hit = con.sql("SELECT group(1), probability() MATCHING 'The cat (sat|ran)' PREFIX 'The cat' USING seed 3 "
                  "SAMPLE 50 GROUP BY 1")
    assert len(hit.fetchall()) >= 1 and hit.notes == []


# -- the language around it

@pytest.mark.parametrize("query,words", [
    ("SELECT probability() MATCHING 'a(b|c)' ORDER BY prob DESC", "cannot be combined with ORDER BY"),
    ("SELECT probability() MATCHING 'a(b|c)' LIMIT 3", "LIMIT would cut it short"),
    ("SELECT probability(text) MATCHING 'a(b|c)'", "takes no arguments"),
    ("SELECT text, probability() MATCHING 'a(b|c)'", "GROUP BY"),
    ("SELECT probability() MATCHING 'a(b|c)' SAMPLE 0", "at least one sample"),
    ("SELECT text MATCHING 'a(b|c)' WHERE probability() > 0", "aggregate"),
    ("SELECT wilson_low(5, 3) MATCHING 'a(b|c)' LIMIT 1", "successes"),
])
def test_bad_uses_are_clear_errors(con, query, words):
    with pytest.raises(Error) as e:
        con.sql(query).fetchall()
    assert words in e.value.render()


def test_equivalent_where_forms_measure_the_same_language(con):
    """Removing a string from the language: the three ways to write it are compiled alike, so
    the longer string that begins with it counts instead."""
    q = "SELECT probability(), count(*) MATCHING 'The cat( sat)?' PREFIX 'The' WHERE "
    got = [con.sql(q + w).fetchone() for w in ("text NOT MATCHING 'The cat'", "text <> 'The cat'",
                                                "NOT (text MATCHES 'The cat')")]
    assert got[0] == got[1] == got[2] and got[0][1] == 1
    assert got[0][0] == pytest.approx(con.sql("SELECT probability() MATCHING 'The cat sat' PREFIX 'The'").fetchone()[0])


def test_an_estimate_with_no_hits_has_an_upper_bound(con):
    p = con.sql("SELECT probability() MATCHING 'The cat (sat|ran)' PREFIX 'The cat' USING topk 1, exact_limit 0, "
                "estimate_samples 50").fetchone()[0]
    assert p == 0 and p.low == 0 and p.high == pytest.approx(wilson(0, 50)[1])


def test_interval_functions(con):
    row = con.sql("SELECT probability() AS p, ci_low(probability()), ci_high(probability()), count(*), "
                  "wilson_low(count(*), 100), wilson_high(3, 10, 0.9) MATCHING 'The cat (sat|ran) (down|up)' "
                  "PREFIX 'The cat' USING exact_limit 0, estimate_samples 100").fetchone()
    p, lo, hi, n, wl, wh = row
    assert (lo, hi) == (p.low, p.high) and lo < p < hi
    assert wl == pytest.approx(wilson(n, 100)[0]) and wh == pytest.approx(wilson(3, 10, 0.9)[1])


@pytest.mark.parametrize("pattern,prefix", [("The cat sat", "The"), ("The (cat|dog) (sat|ran)", "The")])
def test_edit_position_is_where_the_text_leaves_the_language(con, pattern, prefix):
    """The first edit is where the text stops being the beginning of any unedited string
    (brute force over the unedited strings, listed by hand)."""
    strings = [f"The {a} {b}" for a in ("cat", "dog") for b in ("sat", "ran")] if "|" in pattern else ["The cat sat"]
    rows = con.sql(f"SELECT text, edits, edit_position MATCHING '{pattern}' PREFIX '{prefix}' "
                   "USING edits 1, edit_scope completion, seed 4 SAMPLE 150").fetchall()
    assert sum(e for _, e, _ in rows) > 50
    for text, edits, pos in rows:
        if not edits:
            assert pos is None
            continue
        longest = max(next((i for i in range(min(len(s), len(text))) if s[i] != text[i]), min(len(s), len(text)))
                      for s in strings)
        assert pos == longest, (text, pos, longest)


def test_levenshtein_distances():
    cases = [("kitten", "sitting", 3), ("", "abc", 3), ("abc", "abc", 0), ("flaw", "lawn", 2), ("café", "cafe", 1),
             ("intention", "execution", 5)]
    for a, b, d in cases:
        assert levenshtein(a, b) == levenshtein(b, a) == d


def test_edited_non_ascii_rows_keep_their_groups(con):
    """One character edit of é is two byte edits; the groups are still found."""
    from relmql.engine import unedited_match
    assert unedited_match("café (?P<x>au lait|noir)", "cafe noir", 1)["x"] == "noir"
    assert unedited_match("café (?P<x>au lait|noir)", "cafè au lait", 1)["x"] == "au lait"
    assert unedited_match("café (?P<x>au lait|noir)", "cafe nor", 1) is None  # two edits away
    rows = con.sql("SELECT text, edits, x MATCHING 'Un café (?P<x>noir|crème)' PREFIX 'Un' "
                   "USING edits 1, seed 1 SAMPLE 60").fetchall()
    for text, edits, x in rows:
        dist = {v: levenshtein(text, f"Un café {v}") for v in ("noir", "crème")}
        assert min(dist.values()) == edits and dist[x] == edits, (text, x)


def test_edited_rows_keep_the_groups_of_the_nearest_unedited_string(con):
    pattern = "The (?P<g>man|woman) was (?P<f>here|there)"
    rows = con.sql(f"SELECT text, edits, g, f MATCHING '{pattern}' USING edits 1, seed 2 SAMPLE 200").fetchall()
    assert sum(e for _, e, _, _ in rows) > 100
    for text, edits, g, f in rows:
        dist = {(a, b): levenshtein(text, f"The {a} was {b}") for a in ("man", "woman") for b in ("here", "there")}
        assert min(dist.values()) == edits and dist[(g, f)] == edits, (text, g, f)


# -- the statistics, against scipy and textbook values

@pytest.mark.parametrize("k,n,conf", [(0, 10, 0.95), (37, 100, 0.95), (5, 7, 0.9), (999, 1000, 0.99)])
def test_wilson_bounds_are_the_roots_of_the_score_equation(k, n, conf):
    """Wilson's interval is where the score test just rejects: (k/n - p)² = z² p (1 - p) / n."""
    from scipy.optimize import brentq
    z = sstats.norm.ppf(0.5 + conf / 2)
    f = lambda p: (k / n - p) ** 2 - z * z * p * (1 - p) / n  # noqa: E731
    lo = 0.0 if k == 0 else brentq(f, 1e-12, k / n)
    hi = 1.0 if k == n else brentq(f, k / n + 1e-12, 1 - 1e-12)
    assert wilson(k, n, conf) == pytest.approx((lo, hi), abs=1e-9)


def test_wilson_widens_with_confidence():
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)  # the classic 0-of-10 value
    lo, hi = wilson(50, 100, 0.99)
    assert lo < 0.5 < hi and hi - lo > wilson(50, 100)[1] - wilson(50, 100)[0]
    with pytest.raises(ValueError):
        wilson(3, 0)


def test_estimate_mean_is_the_mean_with_a_normal_interval():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 0.2, 80)
    e = estimate_mean(x, 100, scale=2.0, bounded=1.0)
    full = np.concatenate([x, np.zeros(20)])
    assert e == pytest.approx(2 * full.mean())
    half = sstats.norm.ppf(0.975) * full.std(ddof=1) / math.sqrt(100)
    assert (e.low, e.high) == pytest.approx((2 * (full.mean() - half), 2 * (full.mean() + half)))
    assert isinstance(e, float) and isinstance(e, Estimate) and not e.exact


def test_draws_that_measure_two_disjoint_parts_sum_their_means():
    """Half the draws measure the canonical tokenizations, half the others: the value is the sum
    of the two parts' means and its variance the sum of theirs, var_h / n_h (numpy's, part by
    part). Over 2,000 simulated runs the interval holds the true sum about 95% of the time. With
    no hit at all, each part's bound for none, summed."""
    rng = np.random.default_rng(1)
    a, b = rng.uniform(0.3, 0.5, 50), np.concatenate([rng.uniform(0, 0.1, 10), np.zeros(40)])
    hits = [x for x in np.concatenate([a, b]) if x]
    e = estimate_mean(hits, 100, bounded=1.0, parts=[(a, 50), ([x for x in b if x], 50)])
    assert e == pytest.approx(a.mean() + b.mean())
    half = sstats.norm.ppf(0.975) * math.sqrt(a.var(ddof=1) / 50 + b.var(ddof=1) / 50)
    assert (e.low, e.high) == pytest.approx((float(e) - half, float(e) + half))
    covered = 0
    for _ in range(2000):  # part A: U(0.3, 0.5); part B: 1 in 5 hits U(0, 0.1); their sum 0.41
        a = rng.uniform(0.3, 0.5, 50)
        b = rng.uniform(0, 0.1, 50) * (rng.random(50) < 0.2)
        e = estimate_mean([x for x in np.concatenate([a, b]) if x], 100, bounded=1.0,
                          parts=[(a, 50), ([x for x in b if x], 50)])
        covered += e.low <= 0.41 <= e.high
    assert 0.93 <= covered / 2000 <= 0.97
    none = estimate_mean([], 100, bounded=1.0, parts=[([], 50), ([], 50)])
    assert none == 0 and none.high == pytest.approx(2 * wilson(0, 50)[1])


def test_draws_of_one_weight_have_no_variance_not_a_rounding_error():
    """The sample variance from deviations: 1,000 draws of one tiny weight (a low temperature's)
    give an interval as narrow as numpy's variance says (rounding alone; a difference of squares
    made it 1e-8 of the value wide), and with misses the same as numpy's."""
    w = 3.0799963368025037e-31
    e = estimate_mean([w] * 1000, 1000)
    assert e.high - e.low <= 1e-12 * e and e == pytest.approx(w, rel=1e-12)
    e = estimate_mean([w] * 990, 1000)
    half = sstats.norm.ppf(0.975) * np.concatenate([np.full(990, w), np.zeros(10)]).std(ddof=1) / math.sqrt(1000)
    assert (e.low, e.high) == pytest.approx((float(e) - half, float(e) + half), rel=1e-12)


def test_chi2_matches_scipy_on_counts_and_on_probabilities():
    rows = [{"g": g, "f": f, "n": n} for g, f, n in
            [("man", "art", 10), ("man", "law", 30), ("man", "math", 60),
             ("woman", "art", 40), ("woman", "law", 30), ("woman", "math", 30)]]
    t = chi2_independence(rows, "g", "f", weight="n")
    stat, p, dof, _ = sstats.chi2_contingency([[10, 30, 60], [40, 30, 30]], correction=False)
    assert (t.statistic, t.p_value, t.dof) == pytest.approx((stat, p, dof)) and t.n == 200
    assert t.a_values == ("man", "woman") and t.b_values == ("art", "law", "math")
    # unweighted: one count per row
    t1 = chi2_independence(rows, "g", "f")
    assert t1.dof == 2 and t1.statistic == pytest.approx(0.0)
    # probabilities (rows need not sum to 1) as 5000 draws per gender
    probs = [dict(r, n=r["n"] / 1000) for r in rows]
    t2 = chi2_independence(probs, "g", "f", weight="n", n_per_row=5000)
    stat2, p2, _, _ = sstats.chi2_contingency(np.array([[10, 30, 60], [40, 30, 30]]) * 50, correction=False)
    assert t2.statistic == pytest.approx(stat2) and t2.p_value == pytest.approx(p2) and t2.scaled
    assert "χ²" in t2.summary() and "5,000 draws per g" in t2.summary()
    with pytest.raises(ValueError):
        chi2_independence(rows[:3], "g", "f", weight="n")  # one gender: nothing to compare
    for n in (0, 1e300, math.inf):  # past 1e12 draws scipy's sums overflow (a warning and its own error)
        with pytest.raises(ValueError, match="n_per_row must be positive and at most 1e\\+12"):
            chi2_independence(probs, "g", "f", weight="n", n_per_row=n)
    flags = [dict(r, g=g) for r, g in zip(rows, [True, True, True, 1, 1, 1])]  # true is not 1
    t3 = chi2_independence(flags, "g", "f", weight="n")
    assert t3.statistic == pytest.approx(stat) and t3.a_values == (1, True)
    assert [type(v) for v in t3.a_values] == [int, bool]


def test_an_estimate_over_every_tokenization_sums_its_canonical_part_exactly(gemma):
    """Gemma 3 gives its bare space token far more probability at the start than ' Hello', so
    local draws over every tokenization begin with it and miss the tokenization that carries the
    probability: alone they estimated ' Hello' at 2.4e-13 against 4.7e-07. The canonical
    tokenizations, few enough to sum, are summed exactly and only the others are drawn: the
    estimate is then within 1e-3 of the exact value over all 233 tokenizations, and never below
    the canonical value."""
    import relmql
    s = relmql.connect(model="gemma3-270m", dtype="float32")
    s.models.put("gemma3-270m", "cpu", "float32", gemma)
    p = "SELECT probability() AS p MATCHING ' Hello' USING "
    ((canonical,),) = s.sql(p + "tokenization canonical").fetchall()
    ((every,),) = s.sql(p + "tokenization all").fetchall()  # 233 token sequences: summed exactly
    assert every.exact and every >= canonical * (1 - 1e-5)
    q = p + "tokenization all, exact_limit 5, estimate_samples 200"
    ((e,),) = s.sql(q).fetchall()
    assert not e.exact and e.draws == 200 and e == pytest.approx(every, rel=1e-3)
    assert e.low >= canonical * (1 - 1e-6)
    (line,) = [r[0] for r in s.sql("EXPLAIN " + q).fetchall() if r[0].startswith("measure")]
    assert "1 canonical tokenization summed exactly" in line
    # with eos (a string, then the end of text) as well
    e = "SELECT probability() AS p MATCHING ' Hello' USING tokenization all, eos"
    ((every_eos,),) = s.sql(e).fetchall()
    ((canonical_eos,),) = s.sql(e.replace("all", "canonical")).fetchall()
    ((v,),) = s.sql(e + ", exact_limit 5, estimate_samples 200").fetchall()
    assert every_eos.exact and not v.exact and v.low >= canonical_eos * (1 - 1e-6)
    assert v == pytest.approx(every_eos, rel=2e-2)
    # exact_limit 0: nothing summed, but half the draws measure the canonical tokenizations (at
    # least their value here: those draws all give the one canonical tokenization)
    ((m,),) = s.sql(p + "tokenization all, exact_limit 0, estimate_samples 200").fetchall()
    assert not m.exact and m == pytest.approx(every, rel=1e-3) and m.low >= canonical * (1 - 1e-6)
    # ... with eos too (the draws alone: 1.3e-18 against 3.5e-12)
    ((m,),) = s.sql(e + ", exact_limit 0, estimate_samples 200").fetchall()
    assert not m.exact and m == pytest.approx(every_eos, rel=2e-2)
    # under decoding rules: summed (the draws alone: 1.3e-17 against 4.6e-09), or half the draws
    t = p + "tokenization all, temperature 0.7"
    ((every_t,),) = s.sql(t).fetchall()
    ((v,),) = s.sql(t + ", exact_limit 5, estimate_samples 200").fetchall()
    ((m,),) = s.sql(t + ", exact_limit 0, estimate_samples 200").fetchall()
    assert every_t.exact and not v.exact and v == pytest.approx(every_t, rel=1e-3)
    assert not m.exact and m == pytest.approx(every_t, rel=1e-3)
    # two prefix paths: half the draws measure the canonical tokenizations after each
    two = "SELECT probability() AS p MATCHING '(I|We) said Hello' PREFIX '(I|We) said' USING tokenization all"
    ((x,),) = s.sql(two).fetchall()
    ((y,),) = s.sql(two + ", exact_limit 0, estimate_samples 200").fetchall()
    assert x.exact and not y.exact and y.low <= x <= y.high and y == pytest.approx(x, rel=0.15)
    # per group: each string's canonical tokenization summed, its other tokenizations drawn
    g = ("SELECT completion AS c, probability() AS p MATCHING ' Hello (world|there)' USING tokenization {}"
         "estimate_samples 100 GROUP BY c")
    exact = dict(s.sql(g.format("canonical, ")).fetchall())
    drawn = dict(s.sql(g.format("all, ")).fetchall())
    assert exact.keys() == drawn.keys() == {" Hello there", " Hello world"}
    for c, v in drawn.items():
        assert not v.exact and v.low >= exact[c] * (1 - 1e-6) and v == pytest.approx(exact[c], rel=1e-2)


def test_a_summed_canonical_tokenization_that_another_tokenization_begins_is_left_out(tiny, con):
    """A canonical tokenization whose own beginning spells a string of the language in another
    tokenization is not an event over every tokenization: the generation began with that string
    first. GPT-2 spells 'a\\n\\n1' as a, \\n, \\n, 1, and a, \\n, \\n already spells 'a\\n\\n' (whose
    canonical tokenization is a, \\n\\n). Of the two canonical tokenizations only a, \\n\\n is summed,
    as the exact measure over every tokenization counts it, and the estimate equals that
    measure's value (the one other event is drawn with a constant weight)."""
    from relmql.execute import measure
    from relmql.records import Decoding, Measure
    q = "SELECT probability() AS p MATCHING 'a\\n\\n1?' USING tokenization all"
    spelt = [tuple(t) for (t,) in con.sql(q.replace("probability() AS p", "tokens")).fetchall()]
    decode = tiny.vocabulary.decode
    # the events: no shorter run of the tokens spells a string of the language (re.fullmatch)
    exact_rows = {t for t in spelt if not any(re.fullmatch("a\n\n1?", decode(list(t[:k]))) for k in range(1, len(t)))}
    ((every,),) = con.sql(q).fetchall()
    assert every.exact
    automaton = compile("a\n\n1?", tiny.vocabulary, None, CompileOptions(tokenization="all"))
    mass, rows = measure(automaton, tiny, Decoding(), Measure(exact_limit=2, samples=50, bound_nodes=0))
    rows = list(rows)
    summed = [r.tokens for r in rows if r.summed]
    canonical = {tuple(tiny.vocabulary.encode(t)) for t in ("a\n\n", "a\n\n1")}
    assert not mass.exact and summed == [(64, 628)] and set(summed) < canonical
    assert (64, 198, 198, 16) in canonical and (64, 198, 198, 16) not in exact_rows
    assert {r.tokens for r in rows if not r.summed and not r.miss} <= exact_rows - set(summed)
    ((e,),) = con.sql(q + ", exact_limit 2, estimate_samples 50, bound_nodes 0").fetchall()
    assert not e.exact and e == pytest.approx(every, rel=1e-5)
    # the search reads its two events whole (the exact measure's two rows): it sums them
    ((s,),) = con.sql(q + ", exact_limit 2, estimate_samples 50").fetchall()
    assert s.exact and s == pytest.approx(every, rel=1e-6)


def test_an_estimate_below_its_strings_canonical_probability_is_warned_about(gemma, con, tmp_path, monkeypatch):
    """Local draws over every tokenization alone (as where the language's canonical automaton
    cannot be compiled; here it is left out) come out six orders below the canonical value on
    Gemma 3, with a narrow interval. The canonical
    tokenizations of the strings drawn bound such an estimate from below, and the query says so;
    the bound equals the exact canonical value (both strings were drawn). Where the estimate is
    sound (tiny-gpt2), nothing is said."""
    import relmql
    import importlib
    monkeypatch.setattr(importlib.import_module("relmql.execute.measure"), "canonical_part", lambda *args: None)
    s = relmql.connect(model="gemma3-270m", dtype="float32")
    s.models.put("gemma3-270m", "cpu", "float32", gemma)
    query = "SELECT probability() AS p MATCHING ' Hello (world|there)'"
    ((exact,),) = s.sql(query).fetchall()
    r = s.sql(query + " USING tokenization all, estimate_samples 100, exact_limit 1, bound_nodes 0")
    ((p,),) = r.fetchall()
    assert not p.exact and p.high < exact / 1000
    # the search's certain bound (by default) shows what the draws missed, and nothing needs saying
    b = s.sql(query + " USING tokenization all, estimate_samples 100, exact_limit 1")
    ((q,),) = b.fetchall()
    assert q.method == "bound" and q.low >= exact * (1 - 1e-5) and q.high < exact * 1.01
    assert not [n for n in b.notes if "at least" in n]
    (warning,) = [n for n in r.notes if n.startswith("warning: probability() is at least")]
    floor = float(warning.split()[5])
    assert floor == pytest.approx(exact, rel=1e-3) and "tokenization canonical" in warning
    # over a dataset, one warning for the data rows, with the largest bound
    data = tmp_path / "words.jsonl"
    data.write_text('{"m": " Hello (world|there)"}\n{"m": " Hi (world|there)"}\n')
    r = s.sql(f"SELECT probability() AS p MATCHING :m USING tokenization all, estimate_samples 100, exact_limit 1 "
              f"FOR EACH ROW IN '{data}'")
    ((p,),) = r.fetchall()
    (warning,) = [n for n in r.notes if "at least" in n]
    assert warning.startswith("warning: in 2 of 2 data rows probability() is at least the canonical tokenizations")
    assert float(re.search(r"\(up to (\S+)\)", warning).group(1)) >= floor * (1 - 1e-3)
    # a Ray worker sends the bound with the plan's last piece, for the engine to say once
    import torch

    from relmql.cluster.worker import Worker
    from relmql.plan import plan
    from relmql.syntax import parse
    text = query + " USING tokenization all, estimate_samples 100, exact_limit 1, bound_nodes 0"
    threads = torch.get_num_threads()
    try:
        worker = Worker(threads=threads)
        worker.models.put("gemma3-270m", "cpu", "float32", gemma)
        pieces = list(worker.run(1, [(plan(parse(text)[0], text, s.settings), 0)]))
    finally:
        torch.set_num_threads(threads)
    assert pieces[-1].done and pieces[-1].report.floor == pytest.approx(floor, rel=1e-3)
    assert not any("at least" in piece.warnings for piece in pieces)
    sound = con.sql("SELECT probability() AS p MATCHING 'The [a-z]{1,4} sat' PREFIX 'The' "
                    "USING tokenization all, estimate_samples 200")
    ((q,),) = sound.fetchall()
    assert not q.exact and not any("at least" in n for n in sound.notes)


# -- TEST INDEPENDENCE

GF = ("MATCHING 'The (?P<gender>man|woman) was (?P<field>good|bad|ok)' PREFIX 'The (man|woman) was'")


def _scipy_chi2(table):
    stat, p, dof, _ = sstats.chi2_contingency(np.asarray(table, float), correction=False)
    return stat, p, dof


def test_test_clause_on_sampled_counts(con):
    r = con.sql(f"SELECT gender, field, count(*) AS n {GF} USING seed 1 SAMPLE 300 GROUP BY gender, field "
                "TEST INDEPENDENCE OF gender, field")
    rows = r.fetchall()
    table = {(g, f): n for g, f, n in rows}
    want = _scipy_chi2([[table.get((g, f), 0) for f in ("bad", "good", "ok")] for g in ("man", "woman")])
    t = r.test
    assert (t.statistic, t.p_value, t.dof) == pytest.approx(want) and t.n == 300 and not t.scaled
    # ungrouped samples: each row counts once, the same table
    raw = con.sql(f"SELECT gender, field {GF} USING seed 1 SAMPLE 300 TEST INDEPENDENCE OF gender, field").test
    assert (raw.statistic, raw.p_value) == pytest.approx((t.statistic, t.p_value))
    # and from Python, on any result
    assert con.sql(f"SELECT gender, field {GF} USING seed 1 SAMPLE 300").chi2("gender", "field").statistic == \
        pytest.approx(t.statistic)


def test_test_clause_on_exact_probabilities(con):
    from relmql.api import connect
    session = connect(model="tiny-gpt2", dtype="float32", test_draws=1000)
    session.models = con.models.copy()
    r = session.sql(f"SELECT gender, field, probability() AS p {GF} GROUP BY gender, field "
                    "TEST INDEPENDENCE OF gender, field")
    p = {(g, f): v for g, f, v in r.fetchall()}
    table = np.array([[p[(g, f)] for f in ("bad", "good", "ok")] for g in ("man", "woman")])
    want = _scipy_chi2(table / table.sum(axis=1, keepdims=True) * 1000)
    assert (r.test.statistic, r.test.p_value) == pytest.approx(want[:2]) and r.test.n_per_row == 1000
    assert "1,000 draws per gender" in r.test.summary()
    # from Python: the same test, once told the draws; a probability tested as counts is refused
    assert r.chi2("gender", "field", weight="p", n_per_row=1000).statistic == pytest.approx(want[0])
    with pytest.raises(Error, match="the weight .p. is a probability, which carries no sample size"):
        r.chi2("gender", "field", weight="p")
    # grouped rows without a weight are weighed as TEST weighs them (here p), not counted once each
    with pytest.raises(Error, match="the weight .p. is a probability, which carries no sample size"):
        r.chi2("gender", "field")


def test_chi2_on_grouped_counts_weighs_them_as_test_does(con):
    """``Result.chi2(a, b)`` on grouped rows takes their count(*) column as the weight, as TEST
    does (each row counted once, any such table would be independent: p = 1); a result whose
    only aggregate is a tested column has nothing to weigh its cells with."""
    r = con.sql(f"SELECT gender, field, count(*) AS n {GF} USING seed 1 SAMPLE 300 GROUP BY gender, field "
                "TEST INDEPENDENCE OF gender, field")
    assert r.chi2("gender", "field") == r.chi2("gender", "field", weight="n") == r.test
    assert r.chi2("gender", "field").n == 300
    counted = con.sql(f"SELECT gender, count(*) AS n {GF} USING seed 1 SAMPLE 30 GROUP BY gender")
    with pytest.raises(Error, match="these rows are groups, and 'gender' and 'n' leave no aggregate column"):
        counted.chi2("gender", "n")
    # a mean (or least, greatest) probability is no amount of its cell: count(*) weighs them still
    # (avg(prob) was taken as the weight, each group's mean standing for 5,000 draws)
    mean = con.sql(f"SELECT gender, field, avg(prob) AS m, count(*) AS n {GF} USING seed 1 SAMPLE 300 "
                   "GROUP BY gender, field TEST INDEPENDENCE OF gender, field")
    assert mean.test_plan.weight == "n" and mean.test_plan.n_per_row is None
    assert mean.chi2("gender", "field") == mean.test == r.test
    scaled = con.sql(f"SELECT gender, field, avg(prob) AS m, 100 * count(*) AS n {GF} USING seed 1 SAMPLE 300 "
                     "GROUP BY gender, field TEST INDEPENDENCE OF gender, field")
    assert scaled.test_plan.weight == "n" and scaled.test.statistic == pytest.approx(100 * r.test.statistic)
    only_mean = con.sql(f"SELECT gender, field, avg(prob) AS m {GF} USING seed 1 SAMPLE 30 GROUP BY gender, field")
    with pytest.raises(Error, match="these rows are groups, and 'gender' and 'field' leave no aggregate column"):
        only_mean.chi2("gender", "field")


def test_chi2_says_where_expected_counts_are_too_small_with_fishers_exact_test():
    """Cells expecting fewer than 5 rows make χ²'s p-value unreliable: the result counts them
    and, for a 2 × 2 table of counts, gives Fisher's exact p-value. Worked by hand: row sums 1
    and 39, column sums 16 and 24, so the cat row expects 0.4 and 0.6; the one cat is either
    sat (probability 16/40) or ran (24/40), both no likelier than the table seen, p = 1. With 4
    men who ran, 1 woman who ran and 3 who sat, the tables as unlikely or less (hypergeometric)
    are 4 and 1 men who ran of the 5: p = 8/56. Where every cell expects 5, no such words."""
    rows = [{"a": "cat", "b": "ran"}] + [{"a": "dog", "b": "ran"}] * 23 + [{"a": "dog", "b": "sat"}] * 16
    t = chi2_independence(rows, "a", "b")
    assert t.small == 2 and t.fisher_p == pytest.approx(1.0)
    assert t.summary().endswith("; 2 of 4 cells expect fewer than 5 rows, where χ²'s p-value is unreliable: "
                                "Fisher's exact test gives p = 1")
    men = [{"g": "man", "v": "ran"}] * 8 + [{"g": "man", "v": "sat"}] * 2
    women = [{"g": "woman", "v": "ran"}] * 2 + [{"g": "woman", "v": "sat"}] * 8
    t = chi2_independence(men + women, "g", "v")
    assert t.small == 0 and t.fisher_p is None and "Fisher" not in t.summary()  # every cell expects 5
    few = chi2_independence(men[:4] + women[:1] + women[-3:], "g", "v")  # 4 men ran; 1 woman ran, 3 sat
    tail = sum(math.comb(4, k) * math.comb(4, 5 - k) for k in (1, 4)) / math.comb(8, 5)  # as or less likely
    assert few.small == 4 and few.fisher_p == pytest.approx(tail)
    wide = chi2_independence(rows + [{"a": "owl", "b": "hid"}], "a", "b")  # 3 × 3: no Fisher here
    assert wide.small and wide.fisher_p is None and "(draw more, or merge rare values)" in wide.summary()


def test_test_weighs_by_probabilities_before_counts(con):
    r = con.sql(f"SELECT gender, field, count(*) AS n, probability() AS p {GF} GROUP BY gender, field "
                "TEST INDEPENDENCE OF gender, field")
    assert r.test_plan.weight == "p" and r.test.scaled and r.test.statistic > 0


def test_test_draws_of_a_dataset_query(con, tmp_path):
    data = tmp_path / "g.jsonl"
    data.write_text('{"w": "man"}\n{"w": "woman"}\n')
    r = con.sql("SELECT :w AS w, group(1) AS f, probability() AS p MATCHING 'The ' || :w || ' was (good|bad|ok)' "
                f"PREFIX 'The ' || :w || ' was' USING test_draws 10 GROUP BY 1, 2 TEST INDEPENDENCE OF w, f "
                f"FOR EACH ROW IN '{data}'")
    assert r.test.n_per_row == 10 and r.test.n == pytest.approx(20)
    assert {w for w, _, _ in r.fetchall()} == {"man", "woman"}


def test_test_over_token_lists(con):
    t = con.sql("SELECT tokens, text MATCHING 'The (cat|dog) (sat|ran)' PREFIX 'The' SAMPLE 40 "
                "TEST INDEPENDENCE OF tokens, text").test
    assert t.dof >= 1


@pytest.mark.parametrize("query,words", [
    ("SELECT probability() MATCHING 'a(b|c)' USING confidence 1", "confidence must be less than 1"),
    (f"SELECT gender, field, count(*) {GF} SAMPLE 5 GROUP BY 1, 2 TEST INDEPENDANCE OF gender, field",
     "did you mean TEST INDEPENDENCE"),
    (f"SELECT gender, count(*) {GF} SAMPLE 5 GROUP BY 1 TEST INDEPENDENCE OF gender, field", "not one"),
    (f"SELECT gender, field, count(*) {GF} SAMPLE 5 GROUP BY 1, 2 TEST INDEPENDENCE OF gender, gender",
     "two different"),
    (f"SELECT gender, field {GF} SAMPLE 5 GROUP BY 1, 2 TEST INDEPENDENCE OF gender, field", "weigh the cells"),
    (f"SELECT gender, field {GF} SAMPLE 1 TEST INDEPENDENCE OF gender, field", "cannot test independence"),
])
def test_test_clause_errors(con, query, words):
    with pytest.raises(Error) as e:
        con.sql(query).test
    assert words in e.value.render()


def test_test_clause_round_trips_and_explains(con):
    from relmql.syntax import parse, unparse
    text = f"SELECT gender, field, count(*) AS n {GF} SAMPLE 10 GROUP BY 1, 2 TEST independence OF gender, field"
    q = parse(text)[0]
    assert q.test.kind == "independence" and parse(unparse(q))[0] == q
    plan = "\n".join(line for line, in con.sql("EXPLAIN SELECT probability() " + GF))
    assert "exact: 6 token sequences" in plan


# -- faces: tables, machine formats, the command line, progress

def test_estimates_in_tables_and_machine_formats(con, capsys):
    from relmql.cli import main
    q = ("SELECT group(1) AS verb, probability() AS p, ci_low(probability()) AS lo MATCHING "
         "'The cat (sat|ran) (down|up)' PREFIX 'The cat' USING exact_limit 0, estimate_samples 200 GROUP BY verb;")
    assert main(["--model", "tiny-gpt2", "--dtype", "float32", "--no-progress", "--format", "table", "-c", q]) == 0
    out = capsys.readouterr().out
    assert "probability() estimated from 200 draws; in brackets: 95% intervals" in out
    # grouped by the prefix's key, each group is estimated from the draws of its own prefix class
    r = con.sql(f"SELECT gender, probability() AS p {GF} USING exact_limit 0, estimate_samples 200 GROUP BY gender")
    draws = sorted(p.draws for _, p in r)
    assert sum(draws) == 200 and draws[0] < draws[1]
    assert f"estimated from {draws[0]:,} to {draws[1]:,} draws a group;" in render_table(r.columns, list(r))
    assert re.search(r"│ ran +│ +[0-9.e-]+ \[[0-9.e-]+, [0-9.e-]+\] +│", out)
    assert main(["--model", "tiny-gpt2", "--dtype", "float32", "--no-progress", "--format", "csv", "-c", q]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "verb,p,lo" and all(len(line.split(",")) == 3 for line in lines[1:])
    for line in lines[1:]:
        _, p, lo = line.split(",")
        assert float(lo) <= float(p)


def test_test_summary_goes_beside_the_rows(con, capsys):
    import json
    from relmql.cli import main
    q = f"SELECT gender, field, count(*) AS n {GF} SAMPLE 100 GROUP BY 1, 2 TEST INDEPENDENCE OF gender, field;"
    assert main(["--model", "tiny-gpt2", "--dtype", "float32", "--no-progress", "--format", "jsonl", "-c", q]) == 0
    got = capsys.readouterr()
    assert [json.loads(line) for line in got.out.splitlines()]  # stdout stays JSON lines
    assert "χ² test of independence of gender and field" in got.err
    assert main(["--model", "tiny-gpt2", "--dtype", "float32", "--no-progress", "--format", "table", "-c", q]) == 0
    assert re.search(r"\(\d rows\)\nχ² test of independence of gender and field: χ² = [0-9.]+, dof = 2, p = ",
                     capsys.readouterr().out)


class _Terminal:
    def __init__(self):
        import io
        self.buf = io.StringIO()

    def write(self, s):
        return self.buf.write(s)

    def flush(self):
        pass

    def isatty(self):
        return True


@pytest.mark.parametrize("query,shows", [
    ("SELECT text MATCHING 'The (cat|dog) (sat|ran)' PREFIX 'The'", r"4row \["),  # rows and their rate
    ("SELECT probability() MATCHING 'The cat (sat|ran)' PREFIX 'The cat' USING exact_limit 0, "
     "estimate_samples 50", r"50/50"),                                             # draws of an estimate
    ("SELECT probability() MATCHING 'The cat (sat|ran)' PREFIX 'The cat'", r"2/2"),  # sequences, exactly
])
def test_progress_for_every_kind_of_query(con, monkeypatch, query, shows):
    import sys
    from relmql import connect
    from relmql.output import bars
    monkeypatch.setattr(bars.RowBar, "DELAY", 0)
    monkeypatch.setattr(bars.RowBar, "MININTERVAL", 0)
    session = connect(model="tiny-gpt2", dtype="float32", progress=True)
    session.models = con.models.copy()
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    session.sql(query).fetchall()
    assert re.search(shows, err.buf.getvalue()), err.buf.getvalue()


def test_shell_shows_estimates_and_the_test(con, tmp_path, monkeypatch):
    from test_repl import CTRL_D, drive
    monkeypatch.setenv("RELMQL_HISTORY", str(tmp_path / "history"))
    keys = (f"SELECT gender, field, count(*) AS n {GF} SAMPLE 60 GROUP BY 1, 2 TEST INDEPENDENCE OF gender, field;\r"
            "SELECT probability() AS p MATCHING 'The cat (sat|ran) (down|up)' PREFIX 'The cat' "
            "USING exact_limit 0, estimate_samples 40;\r"
            f"SELECT gender, count(*) {GF} SAMPLE 5 GROUP BY 1 TEST INDEPENDENCE OF gender, nope;\r" + CTRL_D)
    code, screen = drive(con, keys, columns=160)
    assert code == 0 and "Traceback" not in screen
    assert re.search(r"χ² test of independence of gender and field: χ² = [0-9.]+, dof = 2, p = ", screen)
    assert "probability() estimated from 40 draws" in screen
    assert "TEST compares output columns; nope is not one" in screen and "^^^^" in screen


def test_a_narrow_interval_prints_with_the_digits_that_tell_its_ends_apart():
    """Three digits made [4.69624e-07, 4.69834e-07] print as [4.7e-07, 4.7e-07], which reads as
    no width and puts the value outside its own interval; the ends take the digits they need."""
    from relmql.output.format import format_value
    narrow = Estimate(4.6970e-07, 4.69624e-07, 4.69834e-07, exact=False, draws=1000)
    assert format_value(narrow) == "4.697e-07 [4.696e-07, 4.698e-07]"
    assert repr(narrow) == "4.697e-07 [4.696e-07, 4.698e-07]"
    assert format_value(Estimate(0.5654, 0.563, 0.568, exact=False)) == "0.5654 [0.563, 0.568]"
    # no width: the ends print as the value does, not rounded past it ([3.51e-12, 3.51e-12])
    assert format_value(Estimate(3.507e-12, 3.507e-12, 3.507e-12, exact=False)) == "3.507e-12 [3.507e-12, 3.507e-12]"
    # a summed estimate whose draws found nothing: the low end was [4.7e-07, ...], above the value
    assert format_value(Estimate(4.69638e-07, 4.69638e-07, 0.0188, exact=False)) == "4.696e-07 [4.696e-07, 0.0188]"
    flat = 4.696206663859e-07  # no width, and not twelve digits to say so
    assert format_value(Estimate(flat, flat, flat, exact=False)) == "4.696e-07 [4.696e-07, 4.696e-07]"
    ends = Estimate(1.0, 1.0 - 1e-10, 1.0 + 1e-10, exact=False)
    low, high = format_value(ends).split("[")[1].rstrip("]").split(", ")
    assert float(low) < float(high)
