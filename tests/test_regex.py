"""The byte automaton of a pattern against Python's own ``re.fullmatch``."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relmql.automata import regex as rx
from relmql.automata.bytedfa import SPLIT_COL
from relmql.errors import CompileError, RegexError

from conftest import fullmatch, language, strings

ALPHABET = ["a", "b", "0", "é", " ", "\n", "_", "B"]


def accepts_all(dfa, texts):
    """Vectorized membership of many strings (no prefix) in a ByteDFA."""
    out = np.zeros(len(texts), bool)
    encoded = [t.encode("utf-8") for t in texts]
    by_len = {}
    for i, b in enumerate(encoded):
        by_len.setdefault(len(b), []).append(i)
    q0 = dfa.delta[0, SPLIT_COL]
    for n, idx in by_len.items():
        arr = np.frombuffer(b"".join(encoded[i] for i in idx), np.uint8).reshape(len(idx), n)
        s = np.full(len(idx), q0, np.int64)
        for j in range(n):
            s = dfa.delta[s, arr[:, j]]
        out[idx] = dfa.final[s] >= 0
    return out


def check(pattern, texts):
    dfa = language(pattern).dfa
    got = accepts_all(dfa, texts)
    want = np.array([fullmatch(pattern, t) for t in texts])
    bad = [t for t, g, w in zip(texts, got, want) if g != w]
    assert not bad, f"{pattern!r}: disagrees with re.fullmatch on {bad[:5]!r}"


SMALL = list(strings(ALPHABET, 4))


# the cases where outlines-core truncates the language (a shorter match shadows a longer one)
@pytest.mark.parametrize("pattern", [
    "a|ab", "ab|a", "a|aa|aaa", "(a|ab)*", "20|2022", "2022|20", "a+?", "a{1,3}?", "(a|b)*?b",
    "a{1,3}", "(?:a|ab)(?:c|bcd)?", "a??b", "(a*)*", "(a|)+", "",
])
def test_prefix_shadowing_exhaustive(pattern):
    check(pattern, list(strings("ab02", 5)))


@pytest.mark.parametrize("pattern", ["(?:a*b)?", "(?:a*bb){,2}", "(?:a*b){0,3}", "(a*b){1,2}", "(?:(?:ab)*c){,2}",
                                     r"(?:(?P<g>a*\W{2}?)){,2}"])
def test_an_optional_item_that_loops_back_to_its_start(pattern):
    """Copies of an item laid out one after another (its strings none a prefix of another): where
    its start is on a loop (a*b), the start of the first copy is not where a run may end. The
    fuzz found (a*b)? taking "a"."""
    check(pattern, list(strings("ab!", 6)))


@pytest.mark.parametrize("pattern", [
    r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", ".", "(?s).", "[^a]", "[^\\w\\d]", r"(?a)\w", r"(?a)[^\s]",
    "[é-ü]", "[\\u0100-\\U00010400]", r"\N{EM DASH}", "(?i)[k]", "(?i)s", "(?i)[^a-z]", "(?i)é",
])
def test_character_classes_on_every_code_point(pattern):
    texts = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    check(pattern, texts)


def test_surrogates_are_not_strings():
    assert language("a|[\\ud800-\\udfff]").num_strings == 1


ATOMS = ["a", "b", "0", "é", " ", ".", r"\d", r"\w", r"\s", r"\D", r"\W", "[ab]", "[^a]", "[a-c0]", r"[^\w]",
         r"\.", r"\x61", "[é-ê]", "(?:)", r"\u00e9", "[_B]", r"\n", "[\\s0]"]
QUANT = ["*", "+", "?", "*?", "+?", "??", "{2}", "{0,2}", "{1,}", "{,2}", "{1,3}?", "{0}", "{2,2}"]


def regexes():
    return st.recursive(
        st.sampled_from(ATOMS),
        lambda inner: st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda t: f"{t[0]}|{t[1]}"),
            inner.map(lambda x: f"({x})"),
            st.tuples(inner, st.sampled_from(QUANT)).map(lambda t: f"(?:{t[0]}){t[1]}"),
            st.tuples(st.text("ab", min_size=1, max_size=3), inner).map(lambda t: f"(?P<{t[0]}x>{t[1]})"),
        ),
        max_leaves=7,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(regexes(), st.sampled_from(["", "(?i)", "(?s)", "(?a)", "(?x)"]))
def test_random_regexes_match_re(pattern, flags):
    pattern = flags + pattern
    try:
        re.compile(pattern)
    except re.error:
        return  # e.g. a duplicate group name: Python rejects it, and so does relmql (tested below)
    check(pattern, SMALL)


@pytest.mark.parametrize("pattern,message,span", [
    ("a(b", "missing ), unterminated subpattern", (1, 2)),
    ("a[", "unterminated character set", (1, 2)),
    ("a**", "multiple repeat", (2, 3)),
    (r"(a)\1", "back-references", (3, 5)),
    ("(?P<x>a)(?P=x)", "back-references", (8, 14)),
    ("a(?=b)", "look-ahead", (1, 6)),
    ("a(?!b)", "look-ahead", (1, 6)),
    ("(?<=a)b", "look-behind", (0, 6)),
    (r"a\bc", "word boundaries", (1, 3)),
    (r"a\B", "word boundaries", (1, 3)),
    ("(a(?(1)b|c))", "a conditional inside group 1, the group it tests", (2, 11)),
    ("(?:(a)x|(a)b)*+(?(1)c|d)", "inside a possessive repetition", (15, 24)),
    (r"\q", "bad escape", (0, 1)),
])
def test_regex_errors_point_inside_the_pattern(pattern, message, span):
    with pytest.raises(RegexError) as info:
        rx.parse(pattern)
    err = info.value
    assert message in err.message
    assert err.span == span
    rendered = err.render()
    assert pattern in rendered
    caret = rendered.splitlines()[2]
    assert caret.index("^") - 2 == span[0]


# ---- constructs whose set of strings depends on the engine's order: atomic groups, possessive
# repetitions, conditionals, anchors inside the pattern (automata/backtrack.py)

BACKTRACKING = [  # (pattern, alphabet): every string up to 6 characters against re.fullmatch
    ("(?>a|ab)c", "abc"), ("(?>ab|a)c", "abc"), ("(?>a*)a|b", "ab"), ("(?>a*?)a", "ab"), ("(?>a+)b", "ab"),
    ("(?>(?:a|b)*)b|a", "ab"), ("(?>a|b)*c", "abc"), ("(?>x(?:a|ab))c?", "xabc"), ("(?>(?>a|ab)c|abd)", "abcd"),
    ("a*+", "ab"), ("a*+a|b", "ab"), ("a++b", "ab"), ("a?+a", "ab"), ("a{1,3}+a", "ab"), ("a{,2}+b", "ab"),
    ("(?:ab|a)*+b", "ab"), ("(?:a|ab)++c", "abc"), ("(?:a*)*+b", "ab"), ("(?:a?)++b", "ab"), ("(?:|a)*+b", "ab"),
    ("[ab]*+b|a", "ab"), ("(?:a|b)*+c", "abc"),
    ("(a)?(?(1)b|c)", "abc"), ("(?P<x>a)?(?(x)b|c)", "abc"), ("(a)?(?(1)b)", "abc"), ("(?(1)a|b)(c)", "abc"),
    ("(?:(a)|b)*(?(1)c|d)", "abcd"), ("(a)*(?(1)b|c)*", "abc"), ("(?:(a)|b)(?(1)c|d)+", "abcd"),
    ("((a)|b)(?(2)c|d)(?(1)x|y)", "abcdxy"), ("(?>(a)|b)(?(1)c|d)", "abcd"),
    ("(?m)(?:^[a-z]{3}\n?)+", "ab\n"), ("(?:^|a)+", "ab"), ("a*(^a)", "ab"), ("a$\n", "a\n"), (r"a\Z\n?", "a\n"),
    ("(?m)a$\n^b", "ab\n"), ("(?m)(?:a$\n?)+", "a\n"), ("a$\n?b?", "ab\n"), ("(?:a|\n^)+", "a\n"),
    ("(?m)(?:^a|b$)*\n?", "ab\n"), (r"(?:\A|b)a+", "ab"), ("a(?:$|b)\n?", "ab\n"), ("(?m)^$\n?", "a\n"),
    ("(?s)(?>.*)a|a", "ab\n"), ("(?>a$)?\n", "a\n"), ("(?:a|b)*+$\n?", "ab\n"), ("(?i)(?>A|ab)c", "aAbBc"),
    ("(?>a(?:b|$))+\n?", "ab\n"), ("(?>(a)*)(?(1)b|c)", "abc"),
]


@pytest.mark.parametrize("pattern,alphabet", BACKTRACKING)
def test_backtracking_constructs_match_re(pattern, alphabet):
    check(pattern, list(strings(alphabet, 6)))


def test_the_issues_examples_are_regular_and_exact():
    """The constructs of issue 16, each against re.fullmatch on every string of its alphabet."""
    for pattern in ["(?>ab|a)b", "a*+", "a++", "a?+", "a{1,3}+", "(a)?(?(1)b|c)", "(?m)(?:^[a-z]{3}\n?)+",
                    "(?:^|a)+", "a*(^a)", "a$\n"]:
        check(pattern, list(strings("abx\n", 6)))
    assert language("(?>ab|a)b").num_strings == 1  # the group commits to "ab": only "abb"
    with pytest.raises(CompileError, match="matches no string"):
        language("a*+a")  # a*+ takes every a


ATOMS_BT = ["a", "b", "\n", "[ab]", ".", "(?:)", "^", "$", r"\A", r"\Z"]
QUANT_BT = ["*", "+", "?", "*+", "++", "?+", "{0,2}+", "{1,2}+", "*?", "+?", "{2}"]


def backtracking_regexes():
    """Random patterns over atomic groups, possessive and lazy repetitions, anchors anywhere and
    conditionals on an optional group just before them."""
    def cond(parts):
        group, yes, no = parts
        return f"({group})?(?(1){yes}|{no})"
    return st.recursive(
        st.sampled_from(ATOMS_BT),
        lambda inner: st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda t: f"{t[0]}|{t[1]}"),
            inner.map(lambda x: f"(?>{x})"),
            st.tuples(inner, st.sampled_from(QUANT_BT)).map(lambda t: f"(?:{t[0]}){t[1]}"),
            st.tuples(inner, inner, inner).map(cond),
        ),
        max_leaves=8,
    )


SMALL_BT = list(strings("ab\n", 6))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(backtracking_regexes(), st.sampled_from(["", "(?m)", "(?s)"]))
def test_random_backtracking_patterns_match_re(pattern, flags):
    pattern = flags + pattern
    try:
        want = np.array([fullmatch(pattern, t) for t in SMALL_BT])
    except (re.error, SystemError):  # SystemError: a CPython bug in some conditionals
        return
    try:
        got = accepts_all(language(pattern).dfa, SMALL_BT)
    except (CompileError, RegexError) as e:
        assert any(m in e.message for m in ("matches no string", "cannot be compiled", "possessive repetition")), \
            e.message
        got = np.zeros(len(SMALL_BT), bool) if "matches no string" in e.message else want
    bad = [t for t, g, w in zip(SMALL_BT, got, want) if g != w]
    assert not bad, f"{pattern!r}: disagrees with re.fullmatch on {bad[:5]!r}"


@pytest.mark.parametrize("pattern, twin", [
    (r"(?>\w+)", r"\w+"), (r"(?>[^\W\d]|\d|_)+", r"\w+"), (r"(?s)(?>.)*é", r"(?s).*é"),
    (r"(?>[\ud7ff\ue000\U00010000-\U0010ffff])+", r"[\ud7ff\ue000\U00010000-\U0010ffff]+"),
    (r"(?>\W)?(?:a|\s)", r"\W?(?:a|\s)"), (r"(?i)(?>ß|é)+\w", r"(?i)(?:ß|é)+\w"),
])
def test_a_backtracking_patterns_byte_automaton_is_minimal(pattern, twin):
    """A DFA over classes of code points spelled out over UTF-8 bytes (utf8dfa.py): the same
    strings and the same minimal size as the plain pattern with the same language."""
    got, want = language(pattern), language(twin)
    assert got.dfa.num_states == want.dfa.num_states
    texts = ["", "a", "é", "ß", "Ω", "_", "0", " ", "\n", "\ud7ff", "\ue000", "\U00010000", "\U0010ffff", "aé",
             "ßé", "é" * 3, "a\U0010ffffb", "!a", "!\t"]
    assert list(accepts_all(got.dfa, texts)) == [fullmatch(pattern, t) for t in texts]


def test_backtracking_automata_are_bounded():
    # 32,769 states, whose subset construction does more work than 10,000 states may
    with pytest.raises(CompileError, match="too costly to build within the limit of 10,000 states") as info:
        language("(?>(?:a|b)*a(?:a|b){14})c", max_states=10_000)
    assert "atomic groups" in info.value.hint and info.value.span == (0, 25)
    with pytest.raises(CompileError, match="more than 1,000 states"):  # few sets, each cheap
        language("(?>[ab]{1500})", max_states=1_000)
    assert language("(?>(?:a|b)*a(?:a|b){14})c").dfa.num_states == 32_770  # within the default limit


def test_anchors_at_the_edges_are_allowed():
    for pattern in ["^ab$", r"\Aab\Z", "(^a|^b)c$", "(?:^)a", "^(a|b)$"]:
        core = re.sub(r"\^|\$|\\A|\\Z", "", pattern)
        check(pattern, list(strings("abc", 3)))
        assert language(pattern).num_strings == language(core).num_strings


def test_empty_language_is_an_error():
    with pytest.raises(CompileError, match="matches no string"):
        language("[^\\x00-\\U0010FFFF]")


def test_too_large_automaton_is_an_error_with_a_span():
    with pytest.raises(CompileError) as info:
        language("ab(c{1000}){1000}", max_states=10_000)
    assert info.value.span is not None
    assert "states" in info.value.message
    with pytest.raises(CompileError, match="more than"):
        language("(a|b)*a(a|b){16}", max_states=5_000)  # determinization blows up


def test_verbose_flag_and_comments():
    check("(?x) a b # comment\n | c", list(strings("abc ", 3)))
    check("a(?#comment)b*", list(strings("ab", 4)))


def test_scoped_ascii_and_unicode_flags_switch_each_other_off():
    check(r"(?a)(?u:\w)", [chr(c) for c in range(0x200)])
    check(r"(?u)(?a:\w)", [chr(c) for c in range(0x200)])


def test_deep_nesting_is_a_clean_error():
    pattern = "(" * 400 + "a" + ")" * 400
    try:
        re.compile(pattern)
    except (re.error, RecursionError):
        return
    with pytest.raises(RegexError, match="nested too deeply"):
        rx.parse(pattern)


def test_case_insensitive_check_does_not_leak_warnings():
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        language("(?i)[[a]")


@pytest.mark.parametrize("pattern", [r"\w{36}", r"[^\W\d_]{1,40}", "x" * 17_000])
def test_size_estimate_is_close_to_the_real_size(pattern):
    assert language(pattern).dfa.num_states < 100_000


# ---- repetitions: nullable items, items whose copies overlap, rows of optional items

ROW = "a?b?a?a?b?ab?b?a?b?b?a?a?b?"  # no repeated block: built one item at a time


@pytest.mark.parametrize("pattern,alphabet", [
    ("(?:a?){7}", "ab"), ("(?:a|b?){5}", "ab"), ("X?(R||){6}", "XRa"), ("(a|ab){0,5}", "ab"),
    ("(a*){4}", "ab"), ("(?:a{0,3}){3}", "ab"), ("((ab)?c?){4}", "abc"), ("(?:a{2,3}){0,4}", "ab"),
    ("(?:a{2,3}){2,4}", "ab"), ("(a|aa){3,6}", "ab"), ("(?:a*b|a){0,3}", "ab"), ("(?:ab|a){2,}", "ab"),
    ("(?:a?b?){3,5}", "ab"), ("(?:a+b?){2,4}", "ab"), ("(?:(?:ab)?c?){2,}", "abc"), ("(?:[ab]{1,2}){2,3}", "abc"),
    ("(?:é|éa|a){0,4}", "éab"), ("(?:a{2}){1,3}", "ab"), ("(?:a{2,}){0,3}", "ab"), ("(?:a{2,}){2,3}", "ab"),
    ("(?:(?:)|a){3}", "ab"), ("b(?:){5}", "ab"), ("(?:[^\\x00-\\U0010ffff]){0,3}b", "ab"),
    ("b(?:[^\\x00-\\U0010ffff]){2,3}|a", "ab"), ("(?:[^\\x00-\\U0010ffff])*b", "ab"), ("a?a?a?b?b?", "ab"),
    ("(?:a?b?)" * 6, "ab"), ("a?b?" * 7 + "c" + "(?:ab)?" * 5, "abc"), (ROW, "ab"), (f"c{ROW}c{ROW}", "abc"),
    ("((a|b)?){3}a", "ab"), ("(?:(?:a|ab)(?:c|bcd)?){0,3}", "abcd"), ("(?:a|b|ab){1,4}", "ab"),
    ("(?:a{1,2}b?){0,3}", "ab"), ("abc{2}d?(?:ef)?", "abcdef"),
])
def test_repetitions_match_re(pattern, alphabet):
    check(pattern, list(strings(alphabet, 8 if len(alphabet) <= 3 else 6)))


def split_counts(item: str, text: str) -> int:
    """The numbers of non-empty strings of ``item`` that ``text`` splits into, as a bit set (bit k:
    k strings), by dynamic programming over ``re.fullmatch`` of ``item`` on every substring."""
    piece = re.compile(item)
    counts = [1] + [0] * len(text)
    for j in range(1, len(text) + 1):
        for i in range(j):
            if counts[i] and piece.fullmatch(text[i:j]):
                counts[j] |= counts[i] << 1
    return counts[-1]


def repeat_oracle(item: str, lo: int, hi: int, text: str) -> bool:
    """Whether ``text`` fully matches ``(?:item){lo,hi}``, without running that pattern in ``re``
    (which backtracks exponentially on some of these)."""
    counts = split_counts(item, text)
    nullable = re.fullmatch(item, "") is not None
    return any(counts >> k & 1 and (nullable or k >= lo) for k in range(hi + 1))


@pytest.mark.parametrize("item,lo,hi,pieces", [
    ("(ab)?c?", 0, 300, ["ab", "c", "abc"]),
    ("a|ab", 0, 500, ["a", "ab"]),
    ("a|aa", 20, 600, ["a", "aa"]),
    ("a{2,3}", 0, 400, ["aa", "aaa"]),
    (r"\w+\s?", 0, 100, ["wörd", "a", "b ", "é\n"]),
    ("a?b?", 3, 400, ["a", "b", "ab"]),
    ("(?:a|b)*c?", 0, 300, ["ab", "c", "bac", "a"]),
])
def test_long_repetitions_match_a_split_oracle(item, lo, hi, pieces):
    import random
    rng = random.Random(0)
    dfa = language(f"(?:{item}){{{lo},{hi}}}").dfa
    for _ in range(12):
        k = rng.choice([rng.randrange(hi + 1), hi, hi + 1, lo, max(lo - 1, 0)])
        text = "".join(rng.choice(pieces) for _ in range(k))
        if rng.random() < 0.3 and text:  # a change that may or may not leave the language
            at = rng.randrange(len(text))
            text = text[:at] + rng.choice(["b", "c", "a", ""]) + text[at + 1:]
        got = accepts_all(dfa, [text])[0]
        assert got == repeat_oracle(item, lo, hi, text), (item, lo, hi, text)


@pytest.mark.parametrize("pattern,count", [
    ("X?(R||){3335}", 2 * 3336),  # from PCRE's tests: once more than 300 s
    ("(?:a?){400}", 401),
    ("(?:a|b?){400}", 2 ** 401 - 1),  # [ab]{0,400}
    ("(a*){100}", None),
    ("(?:a{0,3}){200}", 601),
    ("(?:a{2,3}){0,1000}", 3000),  # 0, then 2 to 3000 a's
    ("(a|aa){0,2000}", 4001),
    ("(?:a|b){3,5000}", sum(2 ** k for k in range(3, 5001))),
    ("(?:ab|a){1000,2000}", sum(2 ** k for k in range(1000, 2001))),  # a word of {a, ab} reads one way
    # copies laid out in one pass (OpenFST's bounded closure took 38 s for a{1,90000})
    ("(?:a{1,300}){1,300}", 90000),
    ("x(?:ab|cde){2,3000}y", sum(2 ** k for k in range(2, 3001))),
], ids=lambda v: v if isinstance(v, str) else "")
def test_repetition_sizes(pattern, count):
    assert language(pattern).num_strings == count


def test_source_size_is_checked_before_parsing():
    from relmql.automata.regex_fst import check_source
    words = "|".join(f"w{i}" for i in range(30_000))
    with pytest.raises(CompileError) as info:
        check_source(words, 100_000)
    err = info.value
    assert "at least" in err.message and "limit of 100,000" in err.message and "max_states" in err.hint
    assert err.span == (0, len(words))
    check_source("(?#" + "x" * 200_000 + ")a", 100_000)  # a comment: no states
    check_source("(?:" + "x" * 200_000 + "){0}a", 100_000)  # repeated zero times
    check_source("[" + "x" * 200_000 + "]", 100_000)  # one class
    check_source("(?x)" + " " * 200_000 + "a", 100_000)  # verbose spaces


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(regexes(), st.sampled_from(["", "(?i)", "(?s)", "(?x)", "(?x:a b)", "\\ud800", "a{0}", "(?#c)", "[^\\s\\S]"]),
       st.sampled_from(["", "\\x61", "\\N{EM DASH}", "\\u00e9", "\\101", "\\.", "{", "}", "(?P<n>é)", "\\Z"]))
def test_source_atoms_are_a_lower_bound_of_the_estimate(pattern, before, after):
    from relmql.automata.regex_fst import estimate_states, simplify
    pattern = before + pattern + after
    try:
        parsed = rx.parse(pattern)
    except RegexError:
        return
    assert rx.atom_count(pattern) <= estimate_states(simplify(parsed.root)) - 1
