"""The split of strings into prefix and completion, counting, edits and exclusions, checked by
brute force."""

from __future__ import annotations


import numpy as np
import pytest

from relmql.automata.bytedfa import SPLIT_COL
from relmql.records import PRINTABLE_ASCII
from relmql.errors import CompileError

from conftest import fullmatch, language, strings


def members(dfa, limit=2_000_000):
    """Every (prefix, completion, tag) of a finite ByteDFA, by depth-first search over bytes."""
    out = []
    stack = [(0, b"", None)]
    while stack:
        s, data, cut = stack.pop()
        if cut is not None and dfa.final[s] >= 0:
            out.append((data[:cut].decode(), data[cut:].decode(), int(dfa.final[s])))
        for b in np.flatnonzero(dfa.delta[s, :256] != dfa.dead).tolist():
            stack.append((int(dfa.delta[s, b]), data + bytes([b]), cut))
        if cut is None and dfa.delta[s, SPLIT_COL] != dfa.dead:
            stack.append((int(dfa.delta[s, SPLIT_COL]), data, len(data)))
        assert len(out) < limit
    return out


def levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def neighbourhood(word: str, k: int, alphabet: str):
    """Strings within k edits of ``word`` (edits only over ``alphabet``), by expansion."""
    seen = {word: 0}
    frontier = {word}
    for d in range(1, k + 1):
        nxt = set()
        for w in frontier:
            for i in range(len(w) + 1):
                for c in alphabet:
                    nxt.add(w[:i] + c + w[i:])
                if i < len(w) and w[i] in alphabet:
                    nxt.add(w[:i] + w[i + 1:])
                    for c in alphabet:
                        nxt.add(w[:i] + c + w[i + 1:])
        nxt = {w for w in nxt if w not in seen}
        for w in nxt:
            seen[w] = d
        frontier = nxt
    return seen


def test_split_takes_the_longest_prefix():
    lang = language("ab|abcd|abcde|abx", prefix="ab|abcd")
    got = sorted(members(lang.dfa))
    assert got == [("ab", "", 0), ("ab", "x", 0), ("abcd", "", 0), ("abcd", "e", 0)]


def test_every_string_starts_with_a_prefix_string():
    lang = language("(The|A) (man|woman) (ran|sat)", prefix="The (man|woman)")
    got = members(lang.dfa)
    assert {p + c for p, c, _ in got} == {f"The {a} {b}" for a in ("man", "woman") for b in ("ran", "sat")}
    assert all(p in ("The man", "The woman") for p, _, _ in got)


def test_prefix_that_is_not_a_prefix_is_an_error():
    with pytest.raises(CompileError) as info:
        language("abc", prefix="x")
    assert info.value.role == "PREFIX"


@pytest.mark.parametrize("pattern,prefix", [
    ("[ab]{0,3}c?", None), ("(a|ab)(c|bcd)", None), ("(x|xy)(z|yz)?", "x|xy"), ("é{1,2}[à-ä]?", None),
    ("[ab]{1,3}", "[ab]{1,2}"),
])
def test_counts_match_enumeration(pattern, prefix):
    lang = language(pattern, prefix=prefix)
    got = members(lang.dfa)
    texts = [p + c for p, c, _ in got]
    assert len(texts) == len(set(texts)), "a string appears with two splits"
    assert lang.num_strings == len(got)
    brute = {s for s in strings("abcdxyzéàä", 5) if fullmatch(pattern, s)
             and (prefix is None or any(fullmatch(prefix, s[:i]) for i in range(len(s) + 1)))}
    assert set(t for t in texts if set(t) <= set("abcdxyzéàä")) == brute


def test_infinite_language_count():
    assert language("a+").num_strings is None
    assert language("(ab|c){2,3}").num_strings == 4 + 8


def test_edit_neighbourhood_of_a_b_is_663_strings():
    lang = language("a b", edits=1)
    got = members(lang.dfa)
    want = neighbourhood("a b", 1, PRINTABLE_ASCII)
    assert len(got) == 663 == len(want)
    assert {c: t for _, c, t in got} == want


def test_two_edits_match_brute_force_levenshtein():
    lang = language("ab|ba", edits=2, edit_alphabet="abc")
    got = {p + c: t for p, c, t in members(lang.dfa)}
    brute = {}
    for s in strings("abc", 4):
        d = min(levenshtein(s, "ab"), levenshtein(s, "ba"))
        if d <= 2:
            brute[s] = d
    assert got == brute


def test_edits_leave_characters_outside_the_alphabet_alone():
    lang = language("aé", edits=1)
    got = {p + c: t for p, c, t in members(lang.dfa)}
    assert got == neighbourhood("aé", 1, PRINTABLE_ASCII)


@pytest.mark.parametrize("scope", ["prefix", "completion", "all"])
def test_edit_scope(scope):
    lang = language("ab cd", prefix="ab", edits=1, edit_scope=scope, edit_alphabet="abcdx ")
    got = members(lang.dfa)
    for p, c, t in got:
        dp, dc = levenshtein(p, "ab"), levenshtein(c, " cd")
        if scope == "prefix":
            assert dc == 0 and dp == t <= 1
        elif scope == "completion":
            assert dp == 0 and dc == t <= 1
        else:
            assert levenshtein(p + c, "ab cd") == t <= 1
    texts = {p + c for p, c, _ in got}
    if scope == "all":
        assert texts == set(neighbourhood("ab cd", 1, "abcdx "))
    assert len(texts) == len(got)


def test_edits_without_prefix_never_create_one():
    lang = language("ab", edits=1, edit_alphabet="abx")
    assert all(p == "" for p, _, _ in members(lang.dfa))


def test_exclusions_remove_whole_strings():
    lang = language("[0-9]{2}", exclude=("1.|.1",))
    got = {c for _, c, _ in members(lang.dfa)}
    assert got == {f"{a}{b}" for a in range(10) for b in range(10) if "1" not in f"{a}{b}"}
    assert lang.num_strings == 81


def test_exclusion_applies_to_the_whole_text_including_the_prefix():
    lang = language("The (cat|dog) (ran|sat)", prefix="The (cat|dog)", exclude=(".*cat sat",))
    texts = {p + c for p, c, _ in members(lang.dfa)}
    assert texts == {"The cat ran", "The dog ran", "The dog sat"}


def test_excluding_everything_is_an_error():
    with pytest.raises(CompileError, match="no string"):
        language("a|b", exclude=("[ab]",))


def test_bad_edit_options():
    with pytest.raises(CompileError, match="edit scope"):
        language("a", edits=1, edit_scope="middle")


def test_edit_counts_beyond_127_are_kept():
    lang = language("", edits=40, edit_alphabet="a")
    assert lang.num_strings == 41
    assert sorted(t for _, _, t in members(lang.dfa)) == list(range(41))
