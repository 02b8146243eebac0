"""Queries end to end through ``Connection.sql`` on tiny-gpt2, against independent oracles:
brute-force scoring of every member with transformers, ``re.fullmatch``, and aggregation and
filtering done by hand in Python.

Golden files: ``tests/golden/explain/X.rql`` → ``X.explain`` (the rows of its EXPLAIN statement);
``tests/golden/errors/X.rql`` → ``X.err`` (the rendered error the script ends with). Both run with
the repository root as the current directory, so paths in them are relative. Regenerate with
``pytest tests/test_query.py --update-golden`` and read the diff before keeping it.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from decimal import ROUND_HALF_UP, Decimal
import re
from collections import Counter
from pathlib import Path

import pytest

import relmql
from conftest import fresh
from relmql.errors import CompileError, ModelError, RegexError
from relmql.plan import PlanError
from relmql.syntax import ParseError

from oracle import ranking, tolerance
from test_syntax import check_golden, read, update_golden  # noqa: F401 -- update_golden is a fixture

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden"
EXPLAIN = sorted((GOLDEN / "explain").glob("*.rql"))
ERRORS = sorted((GOLDEN / "errors").glob("*.rql"))

# a finite language of 12 strings; the prefix is the first word
DETS, ANIMALS, VERBS = ("The", "A"), ("cat", "dog", "bird"), ("sat", "ran")
LANG = "(?P<det>The|A) (?P<animal>cat|dog|bird) (?P<verb>sat|ran)"
PREFIX = "(The|A)"
MEMBERS = [(d, f"{d} {a} {v}") for d, a, v in itertools.product(DETS, ANIMALS, VERBS)]
TEXTS = {t for _, t in MEMBERS}
Q = f"MATCHING '{LANG}' PREFIX '{PREFIX}'"


def rows(con, text, params=None):
    return con.sql(text, params).fetchall()


def dicts(con, text, params=None):
    return con.sql(text, params).to_dicts()


def brute(model, order="prob", **rules):
    """(logprob, total_logprob, text) of every member the rules allow, best first: each string's
    canonical tokens scored by a plain transformers forward pass."""
    enc, dec = model.vocabulary.encode, model.vocabulary.decode
    paths = []
    for prefix, text in MEMBERS:
        toks, pre = tuple(enc(text)), tuple(enc(prefix))
        assert toks[:len(pre)] == pre
        paths.append((toks, len(pre)))
    return [(cond, total, dec(toks)) for cond, total, toks, _ in ranking(model, paths, order, **rules)]


def check_against(model, got, expected, order="prob"):
    """Rows (dicts with text, logprob, total_logprob) equal the oracle's, in its order, within the
    float tolerance of the model's dtype."""
    assert [r["text"] for r in got] == [t for _, _, t in expected]
    for r, (cond, total, text) in zip(got, expected):
        n = len(model.vocabulary.encode(text)) + 1  # + the end of text, with eos
        assert abs(r["logprob"] - cond) <= tolerance(model, n) and abs(r["total_logprob"] - total) <= \
            tolerance(model, n), (r, cond, total)
        assert math.isclose(r["prob"], math.exp(r["logprob"]), rel_tol=1e-9)
        assert math.isclose(r["total_prob"], math.exp(r["total_logprob"]), rel_tol=1e-9)
    key = "prob" if order == "prob" else "total_prob"
    values = [r[key] for r in got]
    assert values == sorted(values, reverse=True)


COLS = "SELECT rank, text, prob, total_prob, logprob, total_logprob"


# -- ranking against brute force

def test_ranking_equals_brute_force(con, model):
    got = dicts(con, f"{COLS} {Q}")
    assert len(got) == len(MEMBERS)
    check_against(model, got, brute(model))
    assert [r["rank"] for r in got] == list(range(1, len(MEMBERS) + 1))
    # ORDER BY prob DESC is the default
    assert dicts(con, f"{COLS} {Q} ORDER BY prob DESC") == got


def test_order_by_total_prob_and_limit(con, model):
    expected = brute(model, "total_prob")
    got = dicts(con, f"{COLS} {Q} ORDER BY total_prob DESC")
    check_against(model, got, expected, "total_prob")
    top = dicts(con, f"{COLS} {Q} ORDER BY total_prob DESC LIMIT 4")
    check_against(model, top, expected[:4], "total_prob")
    assert dicts(con, f"{COLS} {Q} LIMIT 3") == dicts(con, f"{COLS} {Q}")[:3]
    assert rows(con, f"SELECT text {Q} LIMIT 0") == []


def test_edits_in_the_prefix_rank_by_total_prob_unless_ordered(con):
    """With PREFIX and edits that may fall in it, rows come by total_prob (ORDER BY prob would read
    every edited prefix before its first row); ORDER BY prob and edit_scope completion keep prob."""
    q = "SELECT text, prob, total_prob MATCHING 'A (cat|dog) sat' PREFIX 'A (cat|dog)'"
    edited = dicts(con, f"{q} USING edits 1 LIMIT 30")
    assert len(edited) == 30
    assert edited == dicts(con, f"{q} USING edits 1 ORDER BY total_prob DESC LIMIT 30")
    assert [r["total_prob"] for r in edited] == sorted((r["total_prob"] for r in edited), reverse=True)
    for extra in ("ORDER BY prob DESC", "edit_scope completion"):
        using = "USING edits 1" + (", " + extra if extra.startswith("edit_") else " " + extra)
        by_prob = dicts(con, f"{q} {using} LIMIT 30")
        assert [r["prob"] for r in by_prob] == sorted((r["prob"] for r in by_prob), reverse=True), extra
        assert by_prob != edited
    assert "total_prob (the default when the prefix has edits" in "\n".join(
        r[0] for r in rows(con, f"EXPLAIN {q} USING edits 1"))


def test_topk_prunes_as_the_oracle_does(con, model):
    # tiny-gpt2 is random: these words rank in the tens of thousands, so topk 30000 keeps some
    expected = brute(model, topk=30000)
    assert 0 < len(expected) < len(MEMBERS)
    got = dicts(con, f"{COLS} {Q} USING topk 30000")
    check_against(model, got, expected)
    assert dicts(con, f"{COLS} {Q} USING topk 1") == []


def test_set_applies_to_later_queries(con, model):
    con = fresh(con)
    using = dicts(con, f"{COLS} {Q} USING topk 30000, eos")
    check_against(model, using, brute(model, topk=30000, eos=True))
    status = con.sql("SET topk = 30000; SET eos = true")
    assert repr(status) == "SET eos = TRUE"
    assert dicts(con, f"{COLS} {Q}") == using
    con.sql("SET topk = NULL; SET eos = off")
    check_against(model, dicts(con, f"{COLS} {Q}"), brute(model))


# -- capture groups and aggregates

def test_capture_groups_are_those_of_re_fullmatch(con):
    got = rows(con, f"SELECT text, group(1), group(2), group('animal'), animal, verb, group(0) {Q}")
    assert len(got) == len(MEMBERS)
    for text, g1, g2, named, animal, verb, g0 in got:
        m = re.fullmatch(LANG, text)
        assert (g1, g2, named, animal, verb, g0) == (m.group(1), m.group(2), m.group("animal"), m.group("animal"),
                                                    m.group("verb"), text)


def test_group_by_equals_aggregating_by_hand(con):
    plain = dicts(con, f"SELECT text, animal, prob, logprob {Q}")
    by_hand = {}
    for r in plain:
        by_hand.setdefault(r["animal"], []).append(r)
    got = dicts(con, f"SELECT animal, count(*) AS n, avg(logprob) AS a, sum(prob) AS s, min(logprob) AS lo, "
                     f"max(text) AS hi {Q} GROUP BY animal")
    assert sorted(r["animal"] for r in got) == sorted(by_hand)
    for r in got:
        members = by_hand[r["animal"]]
        assert r["n"] == len(members) == 4
        assert r["a"] == pytest.approx(sum(m["logprob"] for m in members) / 4, rel=1e-12)
        assert r["s"] == pytest.approx(sum(m["prob"] for m in members), rel=1e-12)
        assert r["lo"] == min(m["logprob"] for m in members)
        assert r["hi"] == max(m["text"] for m in members)
    # groups come out sorted by their values
    assert [r["animal"] for r in got] == sorted(by_hand)


def _kind_of(values):
    values = [v for v in values if v is not None]
    if values and all(isinstance(v, bool) for v in values):
        return "bool"
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "number"
    return "text"


@pytest.mark.parametrize("select,tail", [
    ("text, prob, abs(logprob), -logprob, prob * 100, edits, edit_position, canonical, rank, text || '!', "
     "prob > 0.1, text MATCHES '.*cat.*', group(1) IS NULL, coalesce(prob, 0), length(text)",
     " USING edits 1 LIMIT 8"),
    ("animal, count(*), min(logprob), max(prob), min(text), avg(edits), sum(prob), probability()",
     " GROUP BY animal"),
])
def test_each_column_kind_is_that_of_its_values(con, select, tail):
    """The plan declares each column's kind (the table aligns and the plot chooses by it); the
    values that arrive are of that kind."""
    result = con.sql(f"SELECT {select} {Q}{tail}")
    got = list(result)
    assert got
    for name, k, values in zip(result.columns, result.kinds, zip(*got)):
        if k == "rank":
            k = "number"
        actual = _kind_of(values)
        assert k == actual or not any(v is not None for v in values), (name, k, actual, values[:3])


def test_group_by_alias_position_and_two_columns(con):
    plain = rows(con, f"SELECT group(2), group(3) {Q}")
    one = Counter(a for a, _ in plain)
    by_alias = rows(con, f"SELECT group(2) AS a, count(*) AS n {Q} GROUP BY a")
    by_position = rows(con, f"SELECT group(2) AS a, count(*) AS n {Q} GROUP BY 1")
    assert dict(by_alias) == dict(by_position) == dict(one)
    two = rows(con, f"SELECT animal, verb, count(*) {Q} GROUP BY animal, verb")
    assert {(a, v): n for a, v, n in two} == dict(Counter(plain))
    # an aggregate with no GROUP BY is one row
    assert rows(con, f"SELECT count(*), avg(group(3) = 'sat') {Q}") == [(12, 0.5)]


def test_sample_group_by_counts_the_samples(con):
    plain = rows(con, f"SELECT animal {Q} USING seed 5 SAMPLE 40")
    grouped = rows(con, f"SELECT animal, count(*) {Q} USING seed 5 SAMPLE 40 GROUP BY animal")
    assert dict(grouped) == dict(Counter(a for (a,) in plain))
    assert sum(n for _, n in grouped) == 40


# -- WHERE: compiled into the automaton or run on the rows

def _explain(con, text):
    return "\n".join(line for (line,) in con.sql("EXPLAIN " + text))


@pytest.mark.parametrize("where, keep", [
    ("text NOT MATCHING '.*dog.*'", lambda r: not re.fullmatch(".*dog.*", r["text"])),
    ("text NOT MATCHING 'The .*' AND text NOT MATCHING '.* ran'",
     lambda r: not re.fullmatch("The .*", r["text"]) and not re.fullmatch(".* ran", r["text"])),
    ("text NOT IN ('The cat sat', 'A dog ran', 'not a member')",
     lambda r: r["text"] not in ("The cat sat", "A dog ran")),
    ("NOT text MATCHES '.*i.*'", lambda r: "i" not in r["text"]),
    ("text <> 'The cat sat'", lambda r: r["text"] != "The cat sat"),
])
def test_exclusions_compiled_into_the_automaton(con, where, keep):
    plan = _explain(con, f"SELECT text {Q} WHERE {where}")
    assert "filter        in the automaton: text NOT MATCHING" in plan
    assert "on result rows" not in plan
    everything = dicts(con, f"{COLS} {Q}")
    got = dicts(con, f"{COLS} {Q} WHERE {where}")
    expected = [r for r in everything if keep(r)]
    assert [r["text"] for r in got] == [r["text"] for r in expected]
    for a, b in zip(got, expected):  # the same rows, read in other batches
        assert abs(a["logprob"] - b["logprob"]) <= tolerance(con.model(), len(con.model().vocabulary.encode(a["text"])))
    assert [r["rank"] for r in got] == list(range(1, len(got) + 1))


@pytest.mark.parametrize("where, keep", [
    ("completion <> ' dog sat'", lambda r: r["completion"] != " dog sat"),
    ("group(2) NOT IN ('cat')", lambda r: re.fullmatch(LANG, r["text"]).group(2) != "cat"),
    ("verb = 'ran' OR det = 'A'", lambda r: r["text"].endswith("ran") or r["text"].startswith("A ")),
    ("text MATCHES '.*i.*'", lambda r: "i" in r["text"]),
    ("NOT (text MATCHES '.*i.*' AND det = 'The')", lambda r: not ("i" in r["text"] and r["text"].startswith("The "))),
    ("logprob > :cut", None),
])
def test_row_filters(con, where, keep):
    everything = dicts(con, f"SELECT text, completion, logprob {Q}")
    cut = sorted(r["logprob"] for r in everything)[len(everything) // 2]
    if keep is None:
        keep = lambda r: r["logprob"] > cut  # noqa: E731
    plan = _explain(con, f"SELECT text {Q} WHERE {where}")
    assert "filter        on result rows: " in plan and "in the automaton" not in plan
    got = dicts(con, f"SELECT text, completion, logprob {Q} WHERE {where}", {"cut": cut})
    expected = [r for r in everything if keep(r)]
    assert 0 < len(expected) < len(everything)
    assert [r["text"] for r in got] == [r["text"] for r in expected]
    # LIMIT counts the rows that pass
    n = len(expected) - 1
    limited = rows(con, f"SELECT text, rank {Q} WHERE {where} LIMIT {n}", {"cut": cut})
    assert [t for t, _ in limited] == [r["text"] for r in expected[:n]]
    assert [k for _, k in limited] == list(range(1, n + 1))  # rank numbers the rows that pass


@pytest.mark.parametrize("where", ["rank > 1", "rank <= 2", "text <> 'x' AND rank = 2"])
def test_where_cannot_use_rank(con, where):
    """rank numbers the rows WHERE keeps: read in WHERE, every candidate row would be the next
    one (rank > 1 kept nothing, and searched an infinite language until a bound)."""
    with pytest.raises(PlanError, match="WHERE cannot use rank: rank numbers the rows that WHERE keeps") as info:
        con.sql(f"SELECT rank, text MATCHING 'The [a-z]+' PREFIX 'The' WHERE {where} LIMIT 3")
    text = info.value.source
    assert text[info.value.span[0]:info.value.span[1]] == "rank" and info.value.span[0] > text.index("WHERE")
    assert "LIMIT n keeps the first n rows" in info.value.hint


def test_where_split_between_automaton_and_rows(con):
    text = f"SELECT text {Q} WHERE text NOT MATCHING 'A .*' AND group(2) <> 'cat' LIMIT 2"
    plan = _explain(con, text)
    assert "in the automaton: text NOT MATCHING 'A .*'" in plan
    assert "on result rows: group(2) <> 'cat'" in plan
    everything = [t for (t,) in rows(con, f"SELECT text {Q}")]
    expected = [t for t in everything if not t.startswith("A ") and " cat " not in t][:2]
    assert [t for (t,) in rows(con, text)] == expected


def test_where_with_edits_still_filters_the_rows(con):
    # edited strings may match what the exclusion removed from the unedited language: it also runs on rows
    text = "SELECT text, edits MATCHING 'The (cat|dog)' PREFIX 'The' WHERE text NOT MATCHING '.*dog' " \
           "USING edits 1, edit_scope completion LIMIT 8"
    plan = _explain(con, text)
    assert "in the automaton" in plan and "on result rows: text NOT MATCHING '.*dog'" in plan
    got = rows(con, text)
    assert len(got) == 8 and not any(re.fullmatch(".*dog", t) for t, _ in got)
    assert {e for _, e in got} <= {0, 1}


# -- SAMPLE

def test_sample_is_reproducible_per_seed(con):
    a = rows(con, f"SELECT text, prefix, completion {Q} USING seed 3 SAMPLE 20")
    assert len(a) == 20
    assert all(t in TEXTS for t, _, _ in a)
    assert all(t == p + c for t, p, c in a)
    assert rows(con, f"SELECT text, prefix, completion {Q} USING seed 3 SAMPLE 20") == a
    b = rows(con, f"SELECT text, prefix, completion {Q} USING seed 4 SAMPLE 20")
    assert len(b) == 20 and b != a
    # samples repeat (with replacement): 20 draws of 12 strings
    assert len(set(a)) < 20
    assert len(rows(con, f"SELECT text {Q} SAMPLE 3")) == 3
    assert rows(con, f"SELECT text {Q} SAMPLE 0") == []


def test_set_seed(con):
    seeded = fresh(con, seed=7)
    con = fresh(con)
    with_using = rows(con, f"SELECT text {Q} USING seed 7 SAMPLE 10")
    con.sql("SET seed = 7")
    assert rows(con, f"SELECT text {Q} SAMPLE 10") == with_using
    assert rows(seeded, f"SELECT text {Q} SAMPLE 10") == with_using


def test_sample_limit_and_where(con):
    got = rows(con, f"SELECT text {Q} WHERE verb = 'sat' USING seed 1 SAMPLE 30 LIMIT 5")
    assert len(got) == 5 and all(t.endswith(" sat") for (t,) in got)
    plain = rows(con, f"SELECT text {Q} USING seed 1 SAMPLE 30")
    assert got == [r for r in plain if r[0].endswith(" sat")][:5]


def test_sample_redraws_a_prefix_the_rules_leave_nothing_after(con, model):
    # under topk 30000 and eos, no string starting with "A" is left; four starting with "The" are
    allowed = {t for _, _, t in brute(model, topk=30000, eos=True)}
    assert allowed and all(t.startswith("The ") for t in allowed)
    got = rows(con, f"SELECT text {Q} USING topk 30000, eos SAMPLE 5")
    assert len(got) == 5 and {t for (t,) in got} <= allowed


# -- parameters and functions

def test_escape_and_concatenation(con):
    got = rows(con, "SELECT text, group(1) MATCHING escape(:x) || '(a|b)'", {"x": "a.b("})
    assert sorted(got) == [("a.b(a", "a"), ("a.b(b", "b")]
    assert rows(con, "SELECT :a || '-' || :b AS c, 'x' || 'y' MATCHING 'q' LIMIT 1", {"a": "1", "b": "two"}) == \
        [("1-two", "xy")]


@pytest.mark.parametrize("literal", ["a.b(", "1+1=2? (yes) [no] {x} ^$|\\*.", "it's", "", "tab\there",
                                     "é ünïcode ∑", "(?P<x>a)\\1"])
def test_escape_matches_exactly_the_literal(con, literal):
    (e,), = rows(con, "SELECT escape(:x) MATCHING 'q' LIMIT 1", {"x": literal})
    assert re.fullmatch(e, literal)
    assert re.compile(e).groups == 0
    for other in (literal + "x", "x" + literal, literal[:-1], literal.replace(".", "x").replace("(", "y")):
        if other != literal:
            assert not re.fullmatch(e, other)
    if literal:
        assert rows(con, "SELECT text MATCHING escape(:x)", {"x": literal}) == [(literal,)]


def test_parameters_in_other_clauses(con):
    got = rows(con, f"SELECT text {Q} USING topk :k LIMIT :n", {"k": 30000, "n": 2})
    assert got == rows(con, f"SELECT text {Q} USING topk 30000 LIMIT 2")


def test_text_functions(con, tmp_path):
    s = "The cat sat on the mat. The end"
    (tmp_path / "stop.txt").write_text("the\non\n", encoding="utf-8")
    (tmp_path / "items.txt").write_text("# a comment line\nNew York\n\n  a.b  \n(x|y)\n", encoding="utf-8")
    params = {"s": s, "stop": str(tmp_path / "stop.txt"), "f": str(tmp_path / "items.txt")}
    (got,) = dicts(con, "SELECT last_word(:s) AS lw, drop_last_word(:s) AS dl, words(:s) AS w, "
                        "words(:s, lines(:stop)) AS w2, any_of(lines(:f)) AS a, length(lines(:f)) AS n "
                        "MATCHING 'q' LIMIT 1", params)
    assert got["lw"] == "end" and got["dl"] == "The cat sat on the mat. The"
    distinct = list(dict.fromkeys(re.findall(r"\w+", s)))
    assert distinct == ["The", "cat", "sat", "on", "the", "mat", "end"]
    for w in distinct:
        assert re.fullmatch(got["w"], w)
    for not_a_word in ("ca", "cat sat", "mat.", "The cat", "", "dog"):
        assert not re.fullmatch(got["w"], not_a_word)
    assert [w for w in distinct if re.fullmatch(got["w2"], w)] == ["cat", "sat", "mat", "end"]
    assert got["n"] == 3
    items = ["New York", "a.b", "(x|y)"]
    assert all(re.fullmatch(got["a"], i) for i in items)
    assert not re.fullmatch(got["a"], "axb") and not re.fullmatch(got["a"], "x")
    # as languages: words() is the set of distinct words, any_of() the set of lines
    assert sorted(t for (t,) in rows(con, "SELECT text MATCHING words(:s)", params)) == sorted(distinct)
    assert sorted(t for (t,) in rows(con, "SELECT text MATCHING any_of(lines(:f))", params)) == sorted(items)
    assert rows(con, "SELECT last_word(:s), drop_last_word(:s) MATCHING 'q' LIMIT 1", {"s": "word"}) == [("word", "")]


# -- datasets: one query per data row

PER_ROW = ("SELECT :row_number AS n, :q AS q, group(1) AS verb, prob "
           "MATCHING escape(:q) || ' (sat|ran|flew)' PREFIX escape(:q) "
           "WHERE logprob > :floor LIMIT 1")
DATA = [{"q": "The cat", "target": "sat", "floor": -100},
        {"q": "The dog", "target": "ran", "floor": -100},
        {"q": "A bird", "target": "flew", "floor": 0},  # nothing has logprob > 0: one NULL row
        {"q": "It's a dog", "target": "ran", "floor": -100}]


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in DATA) + "\n", encoding="utf-8")
    return str(path)


def by_hand(con, query, data, select=lambda i: True):
    """The per-row query run separately for each row; a row with no result gives one NULL row."""
    out = []
    for i, row in enumerate(data, 1):
        if not select(i):
            continue
        got = rows(con, query, {**row, "row_number": i})
        out.extend(got or [(i, row["q"], None, None)])
    return out


def test_dataset_is_one_query_per_row(con, jsonl):
    expected = by_hand(con, PER_ROW, DATA)
    assert len(expected) == 4 and expected[2] == (3, "A bird", None, None)
    got = rows(con, f"{PER_ROW} FOR EACH ROW IN '{jsonl}'")
    assert got == expected
    assert got[0][3] is not None and got[0][2] in ("sat", "ran", "flew")


def test_no_row_because_of_the_rules_or_the_token_bounds_is_noted(con, jsonl, capsys):
    """A search with no row because top-k kept none of the tokens the language allows next, or a
    token bound cut every way short, says so once on stderr, with what to change; a dataset query
    once for all its data rows."""
    assert rows(con, "SELECT text MATCHING 'zq(a|b)' USING topk 2") == []
    err = capsys.readouterr().err
    assert err == ("note: no rows: topk 2 kept none of the tokens MATCHING allows next where the search needed "
                   "one (raise or drop it, or put the text's beginning in PREFIX: the rules apply to the "
                   "completion only)\n")
    assert len(rows(con, "SELECT text MATCHING 'zq(a|b)' PREFIX 'zq'")) == 2 and capsys.readouterr().err == ""
    # the token bounds: every string needs two or more completion tokens (known before the
    # search); 'zivg' can be spelt in two GPT-2 tokens, but its canonical tokens are three
    # (z iv g), which the search finds cut short; the prefix needs three
    assert rows(con, "SELECT text MATCHING 'zq(a|b)' USING max_tokens 1") == []
    assert capsys.readouterr().err == ("note: no rows: each string of MATCHING takes at least 2 tokens, and "
                                       "max_tokens is 1 (raise it)\n")
    assert rows(con, "SELECT text MATCHING 'zivg' USING max_tokens 2") == []
    assert capsys.readouterr().err == ("note: no rows: the completions reached max_tokens (2 tokens) where MATCHING "
                                       "goes on (raise it)\n")
    assert rows(con, "SELECT text MATCHING 'The cat sat( down)?' PREFIX 'The cat sat' USING max_prefix_tokens 2") == []
    assert capsys.readouterr().err == ("note: no rows: the prefix reached max_prefix_tokens (2 tokens) where PREFIX "
                                       "goes on (raise it)\n")
    # rows, and strings the bound left out; probability() within the bound (with eos, the long
    # strings would count)
    assert len(rows(con, "SELECT text MATCHING 'zq(a|b)|z' USING max_tokens 1")) == 1
    assert capsys.readouterr().err == ("note: the rows are only the strings within the bounds: the completions "
                                       "reached max_tokens (1 token) where MATCHING goes on (raise it)\n")
    assert len(rows(con, "SELECT probability() MATCHING 'zq(a|b)|z' USING max_tokens 1, eos")) == 1
    assert capsys.readouterr().err == ("note: probability() measures only the strings within the bounds: the "
                                       "completions reached max_tokens (1 token) where MATCHING goes on (raise it)\n")
    rows(con, "SELECT probability() MATCHING 'zq(a|b)|z' USING max_tokens 8, eos")
    assert capsys.readouterr().err == ""
    # datasets: without the rules every data row has rows; top-1 keeps none of ' sat', ' ran', ' flew'
    query = (f"SELECT :row_number AS n, text MATCHING escape(:q) || ' (sat|ran|flew)' PREFIX escape(:q) "
             f"{{}} FOR EACH ROW IN '{jsonl}'")
    assert all(text is not None for _, text in rows(con, query.format(""))) and capsys.readouterr().err == ""
    assert rows(con, query.format("USING topk 1")) == [(n, None) for n in range(1, 5)]
    assert capsys.readouterr().err == ("note: 4 of 4 data rows have no rows: topk 1 kept none of the tokens "
                                       "MATCHING allows next where the search needed one (raise or drop it, or "
                                       "put the text's beginning in PREFIX)\n")

def test_dataset_where_and_limit_select_rows(con, jsonl):
    got = rows(con, f"{PER_ROW} FOR EACH ROW IN '{jsonl}' WHERE :row_number <> 2")
    assert got == by_hand(con, PER_ROW, DATA, lambda i: i != 2)
    got = rows(con, f"{PER_ROW} FOR EACH ROW IN '{jsonl}' WHERE :row_number <> 2 LIMIT 2")
    assert [r[0] for r in got] == [1, 3]
    got = rows(con, f"{PER_ROW} FOR EACH ROW IN '{jsonl}' WHERE :target = 'ran'")
    assert [r[0] for r in got] == [2, 4]



def test_a_dataset_is_read_as_its_rows_are_needed(con, jsonl, monkeypatch):
    """The data file is read as a stream: rows past the clause's LIMIT are never read (a damaged
    line beyond it is no error), and no pass holds the whole file (a count of the rows, for the
    progress total and the notes, comes first, so a damaged line within it stops the query
    before any model call)."""
    from relmql.plan import datasets as planner
    with open(jsonl, "a", encoding="utf-8") as f:
        f.write("{not json\n")
    read = []
    real = planner.iter_rows
    monkeypatch.setattr(planner, "iter_rows", lambda *a: (read.append(r) or r for r in real(*a)))
    got = rows(con, f"{PER_ROW} FOR EACH ROW IN '{jsonl}' WHERE :row_number <> 2 LIMIT 2")
    assert [r[0] for r in got] == [1, 3] and max(r["row_number"] for r in read) == 3  # not 4, nor line 6
    calls = con.model().stats.calls
    with pytest.raises(relmql.Error, match="line 6"):
        rows(con, f"{PER_ROW} FOR EACH ROW IN '{jsonl}'")
    assert con.model().stats.calls == calls


def test_dataset_aggregate_equals_the_per_row_computation(con, jsonl):
    per_row = by_hand(con, PER_ROW, DATA)
    hits = [verb == row["target"] for (_, _, verb, _), row in zip(per_row, DATA)]
    assert hits[2] is False  # the NULL row is a miss
    (acc, n, found), = rows(con, f"SELECT avg(group(1) = :target), count(*), count(group(1)) "
                                 f"MATCHING escape(:q) || ' (sat|ran|flew)' PREFIX escape(:q) "
                                 f"WHERE logprob > :floor LIMIT 1 FOR EACH ROW IN '{jsonl}'")
    assert acc == pytest.approx(sum(hits) / len(hits))
    assert (n, found) == (4, 3)
    # grouped across rows
    grouped = rows(con, f"SELECT :target AS t, count(*) MATCHING escape(:q) || ' (sat|ran|flew)' "
                        f"PREFIX escape(:q) LIMIT 2 GROUP BY t FOR EACH ROW IN '{jsonl}'")
    assert dict(grouped) == {"sat": 2, "ran": 4, "flew": 2}


def test_csv_dataset_with_lambada_style_functions(con, tmp_path):
    path = tmp_path / "passages.csv"
    passages = ["the cat sat on the mat", "one two three two", "a dog and a dog"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["passage text", "id"])  # a header with a space: the field is :passage_text
        for i, p in enumerate(passages):
            w.writerow([p, str(i)])
    query = ("SELECT :id AS id, group(1) AS answer, last_word(:passage_text) AS target "
             "MATCHING escape(drop_last_word(:passage_text)) || ' (' || words(drop_last_word(:passage_text)) || ')' "
             "PREFIX escape(drop_last_word(:passage_text)) LIMIT 1")
    got = rows(con, f"{query} FOR EACH ROW IN '{path}'")
    expected = []
    for i, p in enumerate(passages):
        one = rows(con, query, {"passage_text": p, "id": str(i)})
        assert len(one) == 1
        context = p.rsplit(" ", 1)[0]
        assert one[0][1] in re.findall(r"\w+", context) and one[0][2] == p.split()[-1]
        expected.extend(one)
    assert got == expected
    assert [r[0] for r in got] == ["0", "1", "2"]  # CSV fields are text
    got = rows(con, f"{query} FOR EACH ROW IN '{path}' WHERE :row_number <> 2 LIMIT 5")
    assert got == [expected[0], expected[2]]
    accuracy = query.replace("SELECT :id AS id, group(1) AS answer, last_word(:passage_text) AS target",
                             "SELECT avg(group(1) = last_word(:passage_text))")
    (acc,), = rows(con, f"{accuracy} FOR EACH ROW IN '{path}'")
    assert acc == pytest.approx(sum(a == t for _, a, t in expected) / 3)


# -- bad input: every class of DESIGN §6, with the span under the right text

BAD = [
    # (query, error class, text under the span, words of the message)
    ("SELECT text MATCHING 'a' WHERE", ParseError, "", "ends early"),
    ("SELECT text MATCHING 'a' LIMT 3", ParseError, "LIMT", "unexpected 'LIMT'"),
    ("SELECT text MATCHING 'a' FOR EACH ROW IN 'x.csv' LIMIT 1 TEST INDEPENDENCE OF a, b", ParseError, "TEST",
     "FOR EACH ROW IN comes last"),
    ("SELECT text MATCHING 'a' FOR EACH ROW IN 'x.csv' WHERE text = 'a'", PlanError, "text",
     "reads their fields (:name)"),
    ("SELECT text FROM MATCHING 'a'", ParseError, "MATCHING", "FROM needs a model name before MATCHING"),
    ("SELECT text MATCHING 'a(b'", RegexError, "(", "missing )"),
    ("SELECT text MATCHING 'it''s a ''b'' [z-a]'", RegexError, "z", "bad character range"),
    ("SELECT text MATCHING 'x''y''(?<=x)z'", RegexError, "(?<=x)", "look-behind"),
    ("SELECT text MATCHING 'a(?=b)'", RegexError, "(?=b)", "look-ahead"),
    ("SELECT text MATCHING '(a)\\1'", RegexError, "\\1", "back-reference"),
    ("SELECT text MATCHING 'The (cat|dog)' PREFIX 'The(?!x)'", RegexError, "(?!x)", "look-ahead"),
    ("SELECT text MATCHING 'The (cat|dog)' WHERE text NOT MATCHING 'The (?=c)cat'", RegexError, "(?=c)",
     "look-ahead"),  # a WHERE filter compiled into the automaton, placed in the query like MATCHING
    ("SELECT text MATCHING 'The (cat|dog)' WHERE text NOT MATCHING 'The ' || '(?=c)cat'", RegexError,
     "'The ' || '(?=c)cat'", "look-ahead"),
    ("SELECT text MATCHING 'The (cat|dog)' WHERE text <> 'The cat' AND text NOT IN ('The dog')", CompileError,
     "'The cat' AND text NOT IN ('The dog')", "no string once the exclusions are applied"),
    ("SELECT text MATCHING 'a' USING topq 3", PlanError, "topq", "did you mean topp"),
    ("SELECT text MATCHING 'a' USING tokenisation all", PlanError, "tokenisation", "did you mean tokenization"),
    ("SELECT txt MATCHING 'a'", PlanError, "txt", "did you mean text"),
    ("SELECT lenght(text) MATCHING 'a'", PlanError, "lenght", "did you mean length"),
    ("SELECT len(text) AS n MATCHING 'a'", PlanError, "len", "did you mean length()"),
    ("SELECT text MATCHING 'a' TEST NORMALITY OF text", PlanError, "NORMALITY", "unknown test 'normality'"),
    ("SELECT text, prob MATCHING 'a' TEST INDEPENDENCE OF text", PlanError, "text", "compares two columns"),
    ("SELECT text, count(*) AS n MATCHING 'a' SAMPLE 2 GROUP BY text TEST INDEPENDENCE OF text, n", PlanError, "n",
     "n is an aggregate: it weighs the cells"),
    # with count(*) beside it to weigh the cells, p's values were taken as categories (chi2 = 6 over 6 rows)
    ("SELECT g, probability() AS p, count(*) MATCHING '(?P<g>a|b)c' GROUP BY g TEST INDEPENDENCE OF g, p",
     PlanError, "p", "p is an aggregate: it weighs the cells"),
    ("SELECT text MATCHING 'a' PREFIX 'b'", CompileError, "b", "no string of MATCHING starts with"),
    # each pattern fits max_states, MATCHING split after PREFIX does not: the caret under MATCHING
    ("SELECT text MATCHING '" + "x" * 60 + "(a|b)' PREFIX '" + "x" * 60 + "' USING max_states 100", CompileError,
     "x" * 60 + "(a|b)", "the automaton has more than 100 states"),
    ("SELECT text MATCHING 'The cat sat on the mat' USING edits 5, max_states 2000", CompileError,
     "edits 5", "5 edits make too large an automaton"),  # the option that makes it too large
    ("SELECT text MATCHING 'a' FOR EACH ROW IN 'no/such/file.jsonl'", PlanError, "'no/such/file.jsonl'",
     "no data file"),
    ("SELECT text MATCHING 'a' USING topk 'x'", PlanError, "'x'", "topk is a whole number"),
    ("SELECT text MATCHING 'a' USING topk 0", PlanError, "0", "at least 1"),
    ("SELECT text MATCHING 'a' USING temperature -1", PlanError, "-1", "at least 1e-30"),
    ("SELECT text MATCHING 'a' USING tokenization some", PlanError, "some", "canonical, all"),
    ("SELECT text MATCHING 'a' SAMPLE -1", PlanError, "-1", "SAMPLE must be a whole number"),
    ("SELECT text MATCHING 'a' SAMPLE 'a'", PlanError, "'a'", "SAMPLE must be a whole number"),
    ("SELECT text MATCHING 'a' LIMIT 1.5", PlanError, "1.5", "LIMIT must be a whole number"),
    ("SELECT text MATCHING 'a' ORDER BY text", PlanError, "text", "cannot order by 'text'"),
    ("SELECT text MATCHING 'a' ORDER BY prob ASC", PlanError, "prob ASC", "DESC"),
    ("SELECT text MATCHING 'a' SAMPLE 3 ORDER BY prob DESC", PlanError, "prob DESC", "not both"),
    ("SELECT text MATCHING 'a' WHERE count(*) > 1", PlanError, "count(*)", "aggregate"),
    ("SELECT text, count(*) MATCHING 'a'", PlanError, "text", "GROUP BY"),
    ("SELECT text, count(*) MATCHING '(a)' GROUP BY group(1)", PlanError, "text", "GROUP BY"),
    ("SELECT text MATCHING 'a' USING topk 3, eos, topk 4", PlanError, "topk", "given twice"),
    ("SELECT text MATCHING 'a' USING model 'tiny-gpt2'", PlanError, "model", "FROM model"),
    ("SELECT text MATCHING 'a' USING dtype 'float16'", PlanError, "dtype", "SET dtype"),
    ("SELECT text MATCHING escape(:y) || '(a|b)'", PlanError, ":y", "parameter :y has no value"),
    ("SELECT text MATCHING 'a' WHERE text = :nope", PlanError, ":nope", "has no value"),
    ("SELECT text MATCHING '(a)' GROUP BY 3", PlanError, "3", "there is 1 output column"),
    ("SELECT group(2) MATCHING '(a)'", PlanError, "group(2)", "no group 2"),
    ("SELECT text WHERE prob > 0", PlanError, None, "needs MATCHING"),
    ("SELECT text MATCHING 1 + 2", PlanError, "1 + 2", "must be text"),
    ("SHOW MODLES", PlanError, "MODLES", "SHOW MODLES is not known"),
    ("SET topq = 1", PlanError, "topq", "did you mean topp"),
    ("SET topk = 'many'", PlanError, "'many'", "topk is a whole number, not 'many'"),
    ("SELECT length(prob) AS n MATCHING 'a'", PlanError, "prob", "length() expects text or a list here"),
    ("SELECT ln(-1) AS x MATCHING 'a'", PlanError, "ln(-1)", "the logarithm of a negative number"),
    ("SELECT round(prob, 'x') AS x MATCHING 'a'", PlanError, "'x'", "round() expects a whole number here"),
    ("SELECT text MATCHING NULL", PlanError, "NULL", "must be text (a regex), not NULL"),
    ("SELECT text MATCHING 'a' LIMIT 2.5", PlanError, "2.5", "a whole number of zero or more, not 2.5"),
    ("SELECT regexp_replace(text, '(a)', '\\9') AS x MATCHING 'a'", PlanError,
     "regexp_replace(text, '(a)', '\\9')", "bad replacement '\\9': invalid group reference 9"),
    # a regex that re refuses, in a WHERE test or a function, is a RegexError as in MATCHING: under
    # the construct where it is a literal (quotes doubled inside), else under the expression
    ("SELECT regexp_replace(text, '(a', 'b') AS x MATCHING 'a'", RegexError, "(", "missing ), unterminated"),
    ("SELECT regexp_extract(text, '(') AS g MATCHING 'a'", RegexError, "(", "regexp_extract(): missing )"),
    ("SELECT text MATCHING 'a' WHERE text MATCHES 'it''s('", RegexError, "(", "missing ), unterminated"),
    ("SELECT text MATCHING 'a' WHERE text MATCHES 'b' || '(a'", RegexError, "'b' || '(a'",
     "at character 2 of the regex"),
    ("SELECT text MATCHING 'a' WHERE text MATCHES 'a{99999999999}'", RegexError, "'a{99999999999}'",
     "pattern too complex for Python's re: the repetition number is too large"),
    ("SELECT regexp_extract(text, '(a)', 5) AS g MATCHING 'a'", PlanError, "regexp_extract(text, '(a)', 5)",
     "no group 5: the regex has 1 group (0 is the whole match)"),
    ("SELECT regexp_extract(text, 'a', -1) AS g MATCHING 'a'", PlanError, "regexp_extract(text, 'a', -1)",
     "no group -1: the regex has 0 groups"),
    # POSIX classes, which re reads as their characters: refused wherever a regex is read
    ("SELECT text MATCHING 'The [[:alpha:]]+'", RegexError, "[", "[:alpha:] is a POSIX class, which Python's regex "
     "syntax does not have (it would match the characters ':alph'); write [a-zA-Z]"),
    ("SELECT text MATCHING 'a' WHERE text MATCHES '[^[:digit:]]'", RegexError, "[", "write [0-9] or \\d"),
    ("SELECT text MATCHING 'a' PREFIX '[:space:]'", RegexError, "[", "write \\s"),
    # surrogates, which no UTF-8 text holds: a JSON-style pair is named as the character it writes
    ("SELECT text MATCHING 'The \\ud83d\\ude00'", RegexError, "\\ud83d\\ude00",
     "is a UTF-16 pair of surrogates, which re reads as two code points no UTF-8 text holds: write the character "
     "it stands for, \U0001f600 or \\U0001F600"),
    ("SELECT text MATCHING 'a|\\udc00'", RegexError, "\\udc00", "U+DC00 is a surrogate code point"),
]


def test_regexes_are_read_as_re_reads_them_without_its_warnings(con):
    """A set that re will one day read otherwise ('[a&&b]': today a, & and b) is read as re reads
    it today, in MATCHING and in MATCHES alike, and re's FutureWarning (which named relmql's own
    source line) is not shown; a POSIX class is refused with the caret on its bracket."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = sorted(t for t in ("The &", "The a", "The b", "The c") if re.fullmatch("The [a&&b]", t))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = sorted(t for (t,) in rows(con, "SELECT text MATCHING 'The [a&&b]' PREFIX 'The'"))
        kept = sorted(t for (t,) in rows(con, "SELECT text MATCHING 'The (&|a|b|c)' PREFIX 'The' "
                                              "WHERE text MATCHES 'The [a&&b]'"))
    assert got == kept == want == ["The &", "The a", "The b"]
    query = "SELECT text MATCHING 'The [[:alpha:]]+'"
    with pytest.raises(RegexError) as e:
        rows(con, query)
    assert e.value.span[0] == query.index("[:alpha:]")


def test_a_surrogate_in_python_text_renders_as_its_escape(con):
    """Python text may hold a lone surrogate, which no stream can write: the message shows it
    escaped; the suggestion for a pair matches what the pair meant."""
    with pytest.raises(RegexError) as e:
        con.sql("SELECT text MATCHING :q", {"q": "The \ud800"}).fetchall()
    assert "'The ⟨here⟩\\ud800'" in e.value.render() and e.value.render().encode("utf-8")
    assert [t for (t,) in con.sql("SELECT text MATCHING 'The \\U0001F600'")] == ["The \U0001f600"]


@pytest.mark.parametrize("query, cls, under, words", BAD, ids=[b[0][:60] for b in BAD])
def test_bad_input_is_a_located_error(con, query, cls, under, words):
    with pytest.raises(relmql.Error) as info:
        list(con.sql(query))
    e = info.value
    assert type(e) is cls or isinstance(e, cls), (type(e), e.render())
    assert words in e.message or words in (e.hint or ""), e.render()
    assert e.source == query
    if under is None:
        assert "Traceback" not in e.render()
        return
    assert e.span is not None, e.render()
    start, end = e.span
    if under == "":  # the end of the text
        assert start == len(query)
    else:
        assert query[start:end] == under, e.render()
    rendered = e.render()
    caret = rendered.splitlines()[2] if rendered.splitlines()[1].startswith("  ") else None
    if caret is not None:
        assert caret.index("^") - 2 == start and caret.count("^") == max(1, end - start)


def test_caret_counts_wide_characters_as_two_columns(con):
    # a terminal shows 東, 京 and 😀 two columns wide and é's combining accent in no column of its own
    query = "SELECT text MATCHING '東京 😀 cafe\u0301 [z-a]'"
    with pytest.raises(RegexError) as info:
        rows(con, query)
    line, caret = info.value.render().splitlines()[1:3]
    assert line == "  " + query
    # columns before the z: 東京 4, space, 😀 2, space, "cafe" 4 (+ 0 for the accent), space, "["
    assert caret.index("^") == 2 + len("SELECT text MATCHING '") + 4 + 1 + 2 + 1 + 4 + 1 + 1, caret
    assert caret.count("^") == 1


def test_numbers_at_the_edges(con):
    (got,) = rows(con, "SELECT ln(0) AS a, exp(1000) AS b, ln(1) AS c, length('abc') AS d MATCHING 'q'")
    assert got == (-math.inf, math.inf, 0.0, 3)  # ln(0): an impossible string's log-probability
    assert len(rows(con, "SELECT text MATCHING 'a(b|c|d)' LIMIT 2e0")) == 2  # a whole number written as a float
    with pytest.raises(PlanError, match=r"topk is a whole number, not '1\.5'"):  # a parameter's text
        rows(con, "SELECT text MATCHING 'a' USING topk :k", {"k": "1.5"})
    assert len(rows(con, "SELECT text MATCHING 'a(b|c|d)' PREFIX 'a' USING topk :k", {"k": "50000"})) == 3
    # one reading of a whole number everywhere: LIMIT, options and functions' arguments take a
    # parameter's text and a float with no fraction alike
    assert len(rows(con, "SELECT text MATCHING 'a(b|c|d)' LIMIT :n", {"n": "2e0"})) == 2
    (got,) = rows(con, "SELECT regexp_extract(text, 'a(b)', :g) AS g, round(0.123, 2.0) AS r MATCHING 'ab'",
                  {"g": "1"})
    assert got == ("b", 0.12)  # the group number, not a group named '1'

def test_a_column_name_given_twice_keeps_its_first_column(con):
    """``SELECT *, prob``: the star's prob keeps its name (code that reads r["prob"] still works),
    the second is prob_2; a name already taken is passed over."""
    r = con.sql("SELECT *, prob MATCHING 'ab' LIMIT 1")
    cols, (row,) = r.columns, r.fetchall()
    assert cols.count("prob") == 1 and cols[-1] == "prob_2" and cols.index("prob") < len(cols) - 1
    assert row[cols.index("prob")] == row[-1] == math.exp(row[cols.index("logprob")])
    assert con.sql("SELECT text AS a, prob AS a, tokens AS a_2 MATCHING 'ab'").columns == ("a", "a_3", "a_2")


def test_round_and_remainder_as_sql_has_them(con):
    """Halves away from zero and the dividend's sign, as PostgreSQL's numeric and DuckDB give them
    (Python's round(2.5) is 2 and -7 % 3 is 2)."""
    (got,) = rows(con, "SELECT round(2.5), round(-2.5), round(0.125, 2), round(2.675, 2), round(1250, -2), "
                       "round(-0.5), round(ln(0)), -7 % 3, 7 % -3, -7.5 % 2, 7 % 3 MATCHING 'a'")
    assert got == (3.0, -3.0, 0.13, 2.68, 1300.0, -1.0, -math.inf, -1, 1, -1.5, 1)
    # numbers of more than 28 digits (decimal's default precision), and more decimals than a float has
    (got,) = rows(con, "SELECT round(1e300, 2), round(123456789012345678901234567890), round(1e20, 10), "
                       "round(1.5e-9, 400), round(1.2345e305, -303), round(5, -1000), round(1/prob) MATCHING 'a'")
    assert got[:6] == (1e300, 1.2345678901234568e29, 1e20, 1.5e-9, 1.23e305, 0.0)
    assert got[6] == float(Decimal(repr(1 / rows(con, "SELECT prob MATCHING 'a'")[0][0])).quantize(
        Decimal(1), rounding=ROUND_HALF_UP))


def test_regex_error_span_inside_a_computed_regex_is_the_expression(con):
    query = "SELECT text MATCHING escape(:x) || '(a'"
    with pytest.raises(RegexError) as info:
        con.sql(query, {"x": "b"}).fetchall()
    e = info.value
    assert query[e.span[0]:e.span[1]] == "escape(:x) || '(a'"
    # where in what it evaluated to ('b(a': the error at the open group, as re puts it)
    import re
    with pytest.raises(re.error) as want:
        re.compile("b(a")
    assert f"at character {want.value.pos + 1} of the regex MATCHING evaluates to: 'b⟨here⟩(a'" in e.message
    long = "x" * 100
    with pytest.raises(RegexError) as info:
        con.sql(query, {"x": long}).fetchall()
    assert f"evaluates to: …'{'x' * 30}⟨here⟩(a'" in info.value.message


def test_unknown_model_is_a_model_error(con):
    with pytest.raises(ModelError) as info:
        con.sql("SELECT text FROM 'smolm2' MATCHING 'a'").fetchall()
    assert "did you mean 'smollm2-135m'" in info.value.message
    with pytest.raises(ModelError):
        relmql.connect(model="no-such-model").sql("SELECT text MATCHING 'a'").fetchall()


def test_unknown_model_error_points_at_the_from_clause(con):
    query = "SELECT text FROM 'smolm2' MATCHING 'a'"
    with pytest.raises(ModelError) as info:
        con.sql(query).fetchall()
    assert info.value.span is not None and query[info.value.span[0]:info.value.span[1]] == "'smolm2'"


def test_empty_language_after_exclusions(con):
    with pytest.raises(CompileError, match="matches no string"):
        con.sql(f"SELECT text {Q} WHERE text NOT MATCHING '.*'").fetchall()


def test_errors_in_dataset_rows(con, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": "a"}\nnot json\n', encoding="utf-8")
    query = f"SELECT text MATCHING escape(:q) FOR EACH ROW IN '{bad}'"
    with pytest.raises(PlanError, match="line 2: not JSON") as info:
        con.sql(query).fetchall()
    assert query[info.value.span[0]:info.value.span[1]] == f"'{bad}'"
    other = tmp_path / "rows.txt"
    other.write_text("x\n", encoding="utf-8")
    with pytest.raises(PlanError, match="data files are"):
        con.sql(f"SELECT text MATCHING 'a' FOR EACH ROW IN '{other}'")
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"q": "a"}\n', encoding="utf-8")
    query = f"SELECT text MATCHING escape(:qq) FOR EACH ROW IN '{ok}'"
    with pytest.raises(PlanError, match=r"parameter :qq has no value; did you mean :q\?") as info:
        con.sql(query).fetchall()
    assert query[info.value.span[0]:info.value.span[1]] == ":qq"
    gap = tmp_path / "gap.jsonl"  # the second data row lacks the field (it is on line 3)
    gap.write_text('{"q": "a"}\n\n{"r": "b"}\n', encoding="utf-8")
    with pytest.raises(PlanError, match=rf"parameter :q has no value.*\(data row 2 of {re.escape(str(gap))}\)"):
        con.sql(f"SELECT text MATCHING escape(:q) FOR EACH ROW IN '{gap}'").fetchall()
    with pytest.raises(PlanError, match=r"escape\(\) expects text here, got a number \(1\) \(data row 2 of"):
        gap.write_text('{"q": "a"}\n{"q": 1}\n', encoding="utf-8")
        con.sql(f"SELECT escape(:q) AS e MATCHING 'a' FOR EACH ROW IN '{gap}'").fetchall()
    for name, content, words in (
            ("twice.csv", "q,q\na,b\n", "the header names 'q' twice"),
            ("clash.jsonl", '{"my q": "a", "my-q": "b"}\n', "the fields 'my q' and 'my-q' would both be :my_q"),
            ("number.jsonl", '{"q": "a", "row_number": 7}\n', "would both be :row_number"),
            ("more.csv", 'q,n\na,1\n"b,c",2,3\n', "more.csv, line 3: 3 cells where the header names 2"),
            ("fewer.csv", 'q,n\na,1\n"b\nc"\n', "fewer.csv, line 4: 1 cell where the header names 2"),
            ("fewer.tsv", 'q\tn\na\t1\nb\n', "fewer.tsv, line 3: 1 cell where the header names 2")):
        (tmp_path / name).write_text(content, encoding="utf-8")
        with pytest.raises(PlanError, match=re.escape(words)):  # one of them was dropped without a word
            con.sql(f"SELECT text MATCHING 'a' FOR EACH ROW IN '{tmp_path / name}'").fetchall()
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes("q\ncaf\u00e9\n".encode("latin-1"))
    query = f"SELECT text MATCHING escape(:q) FOR EACH ROW IN '{latin1}'"
    with pytest.raises(PlanError, match="not UTF-8 text") as info:
        con.sql(query).fetchall()
    assert query[info.value.span[0]:info.value.span[1]] == f"'{latin1}'"


def test_every_field_name_is_a_parameter(con, tmp_path):
    """Fields named in any script, or beginning with a digit, are :name-able, and a result
    column may be named in any script (as Python's and DuckDB's identifiers may)."""
    path = tmp_path / "rows.csv"
    path.write_text("caf\u00e9,1st,na\u00efve word,\u540d\u524d\nab,2,x,y\n", encoding="utf-8")
    got = con.sql(f"SELECT :caf\u00e9 AS n\u00famero, :1st + 1 AS n, :na\u00efve_word AS w, :\u540d\u524d AS j "
                  f"MATCHING 'a' FOR EACH ROW IN '{path}' WHERE :caf\u00e9 <> ''")
    assert got.columns == ("n\u00famero", "n", "w", "j")
    assert got.fetchall() == [("ab", 3, "x", "y")]


def test_data_files_as_spreadsheets_and_editors_write_them(con, tmp_path):
    """A byte-order mark (Excel's "CSV UTF-8", Notepad), numbers and booleans as CSV text, and
    JSON objects as values: the same answers as the typed JSONL rows."""
    csv_path, jsonl_path, words = tmp_path / "rows.csv", tmp_path / "rows.jsonl", tmp_path / "words.txt"
    csv_path.write_text("\ufeffq,n,flag\na,1,true\nb,2,false\nc,3,TRUE\n", encoding="utf-8")
    jsonl_path.write_text("\ufeff" + "".join(json.dumps(r) + "\n" for r in (
        {"q": "a", "n": 1, "flag": True, "o": {"k": 1}}, {"q": "b", "n": 2, "flag": False, "o": {}},
        {"q": "c", "n": 3, "flag": True, "o": {"k": 1}})), encoding="utf-8")
    words.write_text("\ufeffa\nc\n", encoding="utf-8")
    query = (f"SELECT :q AS q, :n * 10 AS n10, :q IN lines('{words}') AS listed MATCHING escape(:q) "
             "FOR EACH ROW IN '{}' WHERE :n <> 2 AND :flag")
    expected = [("a", 10, True), ("c", 30, True)]  # 'a': the first field and the first line, after the mark
    assert rows(con, query.format(csv_path)) == rows(con, query.format(jsonl_path)) == expected
    assert rows(con, f"SELECT :q AS q MATCHING escape(:q) FOR EACH ROW IN '{csv_path}' WHERE :n = 2") == [("b",)]
    grouped = rows(con, f"SELECT :o AS o, count(*) AS c MATCHING escape(:q) GROUP BY o FOR EACH ROW IN '{jsonl_path}'")
    assert sorted(grouped, key=lambda r: r[1]) == [({}, 1), ({"k": 1}, 2)]  # objects are grouped by value
    tsv, quoted = tmp_path / "said.tsv", tmp_path / "said.csv"  # TSV has no quoting; CSV does
    said = ['"Hi," she said', 'a "b" c', '""']
    tsv.write_text("q\tn\n" + "".join(f"{q}\t{i}\n" for i, q in enumerate(said)), encoding="utf-8")
    quoted.write_text("q,n\n" + "".join(f'"{q.replace(chr(34), chr(34) * 2)}",{i}\n' for i, q in enumerate(said)),
                      encoding="utf-8")
    for path in (tsv, quoted):
        assert rows(con, f"SELECT :q AS q MATCHING escape(:q) FOR EACH ROW IN '{path}'") == [(q,) for q in said]
    tsv.write_text("q\tn\na\tb\t1\n", encoding="utf-8")
    with pytest.raises(PlanError, match="3 cells where the header names 2") as info:
        rows(con, f"SELECT :q AS q MATCHING escape(:q) FOR EACH ROW IN '{tsv}'")
    assert "TSV cell cannot hold a tab" in info.value.hint
    mixed = tmp_path / "mixed.jsonl"  # true and 1 (and [true] and [1]) are different values, as in SQL
    mixed.write_text("".join(json.dumps({"q": q, "v": v}) + "\n" for q, v in
                             [("a", 1), ("b", True), ("c", 1), ("d", [True]), ("e", [1]), ("f", 1.0)]))
    got = rows(con, f"SELECT :v AS v, count(*) AS c, min(:q) AS q MATCHING escape(:q) GROUP BY v "
                    f"FOR EACH ROW IN '{mixed}'")
    assert sorted((repr(v), c, q) for v, c, q in got) == [("1", 3, "a"), ("True", 1, "b"), ("[1]", 1, "e"),
                                                          ("[True]", 1, "d")]
    with pytest.raises(PlanError, match=r"a condition is true or false, not text \('a'\)") as info:
        rows(con, f"SELECT :q AS q MATCHING escape(:q) FOR EACH ROW IN '{csv_path}' WHERE :q")
    assert info.value.hint and "compare it" in info.value.hint


def test_text_that_spells_a_number_is_one_where_a_number_is_needed(con):
    """A parameter's value is text (``-p n=2``); compared with a number, in arithmetic or as a
    number argument it is the number it spells, and other text is an error, not false."""
    (got,) = rows(con, "SELECT :n = 2 AS eq, :n + 1 AS s, -:n AS neg, round(:x, 1) AS r, :n > 1.5 AS gt MATCHING 'a'",
                  {"n": "2", "x": "0.25"})
    assert got == (True, 3, -2, 0.3, True)  # (halves away from zero)
    with pytest.raises(PlanError, match="cannot compare text with a number"):
        rows(con, "SELECT :w > 1 AS x MATCHING 'a'", {"w": "abc"})
    assert rows(con, "SELECT :w = 'abc' AS x, :w = 1 AS y MATCHING 'a'", {"w": "abc"}) == [(True, False)]
    with pytest.raises(PlanError, match="a condition is true or false"):
        rows(con, "SELECT text MATCHING 'a(b|c)' WHERE 'maybe'")


# -- golden files

@pytest.fixture
def at_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def test_golden_sets_are_there():
    assert len(EXPLAIN) >= 6 and len(ERRORS) >= 15
    for folder, suffix in (("explain", ".explain"), ("errors", ".err")):
        for expected in (GOLDEN / folder).glob("*" + suffix):
            assert expected.with_suffix(".rql").is_file(), f"{expected} has no input"


@pytest.mark.parametrize("path", EXPLAIN, ids=lambda p: p.stem)
def test_golden_explain(con, path, update_golden, at_repo):
    con = fresh(con)
    result = con.sql(read(path))
    assert result.kind == "text" and result.columns == ("plan",)
    text = "\n".join(line for (line,) in result) + "\n"
    assert str(REPO) not in text
    check_golden(path.with_suffix(".explain"), text, update_golden)


@pytest.mark.parametrize("path", ERRORS, ids=lambda p: p.stem)
def test_golden_error(con, path, update_golden, at_repo):
    text = read(path)
    con = fresh(con)
    with pytest.raises(relmql.Error) as info:
        list(con.sql(text))
    rendered = info.value.render().replace(str(REPO), "<repo>") + "\n"
    assert "Traceback" not in rendered
    check_golden(path.with_suffix(".err"), rendered, update_golden)


def test_a_batch_size_given_is_kept(con):
    """Without batch_size the search's batches grow while rows are far apart; a number given is
    the size of every batch."""
    def traversal(sql):
        return next(line for (line,) in fresh(con).sql("EXPLAIN " + sql) if line.startswith("traversal"))
    query = "SELECT text MATCHING 'The (cat|dog)' LIMIT 1"
    assert "batches of 32 nodes (up to 128 while rows are far apart)," in traversal(query)
    assert "batches of 8 nodes," in traversal(query.replace(" LIMIT", " USING batch_size 8 LIMIT"))
    assert "batches of 128 nodes," in traversal(query.replace(" LIMIT", " USING batch_size 128 LIMIT"))
