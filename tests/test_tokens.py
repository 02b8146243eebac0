"""All-tokenization automata against brute-force segmentation over real vocabularies."""

from __future__ import annotations

import random
import re

import numpy as np
import pytest

from relmql.automata import CompileOptions, compile
from relmql.errors import CompileError

from conftest import enumerate_paths, segmentations, token_index

ALL = CompileOptions(tokenization="all", prefix_tokenization="all")


def all_paths(pattern, vocab, prefix=None, options=ALL):
    return enumerate_paths(compile(pattern, vocab, prefix, options))


@pytest.mark.parametrize("text,expected", [
    ("the", {(1169,), (83, 258), (400, 68), (83, 71, 68)}),
    ("The", {(464,), (51, 258), (817, 68), (51, 71, 68)}),
    ("THE", {(10970,), (4221, 36), (51, 13909), (51, 39, 36)}),
    ("π", {(139, 222), (46582,)}), ("θ", {(138, 116)}), ("э", {(141, 235)}),
    ("’", {(158, 222, 247), (447, 247)}), ("–", {(158, 222, 241), (447, 241), (1906,)}),
    ("®", {(126, 106), (7461,)}), ("©", {(126, 102), (16224,)}), ("¶", {(126, 114), (26604,)}),
    ("·", {(126, 115), (9129,)}), ("´", {(126, 112), (18265,)}), ("‘", {(158, 222, 246), (447, 246)}),
    ("”", {(158, 222, 251), (447, 251)}), ("я", {(141, 237), (40623,)}), ("東", {(162, 251, 109), (30266, 109)}),
])
def test_gpt2_tokenizations_of_words(gpt2_vocab, text, expected):
    got = {toks for toks, _ in all_paths(re.escape(text), gpt2_vocab)}
    assert got == expected


def test_the_man_has_32_tokenizations(gpt2_vocab):
    got = {toks for toks, _ in all_paths("The man", gpt2_vocab)}
    assert len(got) == 32
    assert got == set(segmentations(b"The man", token_index(gpt2_vocab)))


@pytest.mark.parametrize("vocab_name", ["gpt2_vocab", "smol_vocab"])
def test_random_strings_match_brute_force(request, vocab_name):
    vocab = request.getfixturevalue(vocab_name)
    idx = token_index(vocab)
    rng = random.Random(7)
    alphabet = list("ab c.'\n0") + ["é", "東", "😀", "’", "\t", "ſ"]
    for _ in range(40):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))
        got = sorted(toks for toks, _ in all_paths(re.escape(s), vocab))
        assert got == sorted(segmentations(s.encode(), idx)), repr(s)


def test_finite_language_with_prefix(gpt2_vocab):
    idx = token_index(gpt2_vocab)
    prefix = "The (man|woman) was"
    got = all_paths(prefix + " (born|here)", gpt2_vocab, prefix)
    want = set()
    for p in ("The man was", "The woman was"):
        for c in (" born", " here"):
            for a in segmentations(p.encode(), idx):
                for b in segmentations(c.encode(), idx):
                    want.add((a + b, len(a)))
    assert set(got) == want  # tokens never cross the prefix boundary; prefix tokens are flagged
    assert len(got) == len(want)


def test_infinite_language_random_walks_spell_members(gpt2_vocab):
    pattern = r"https://www\.([a-zA-Z0-9]|_|-|#|%)+\.([a-zA-Z0-9]|_|-|#|%|/)+"
    ta = compile(pattern, gpt2_vocab, r"https://www\.", ALL)
    rng = np.random.default_rng(0)
    finals = 0
    for _ in range(100):
        state, toks = ta.start, []
        for _ in range(30):
            arcs = ta.arcs(state)
            k = rng.integers(len(arcs))
            state = int(arcs.targets[k])
            toks.append(int(arcs.tokens[k]))
            text = gpt2_vocab.decode(toks)
            if ta.is_final(state):
                finals += 1
                assert re.fullmatch(pattern, text), text
            else:
                # a prefix of some member
                assert "https://www.".startswith(text) or re.fullmatch(
                    r"https://www\.[a-zA-Z0-9_#%-]*(\.[a-zA-Z0-9_#%/-]*)?", text), text
    assert finals > 20


def test_eager_build_equals_lazy_arcs(gpt2_vocab):
    pattern = "My phone number is ([0-9]{3}) ([0-9]{3}) ([0-9]{4})"
    lazy = compile(pattern, gpt2_vocab, None, ALL)
    eager = compile(pattern, gpt2_vocab, None, CompileOptions(tokenization="all", prefix_tokenization="all",
                                                              max_states=99_999))
    stats = eager.build_eager()
    assert stats.states > 30 and stats.arcs > 1000
    for q in range(eager.dfa.num_states):
        a, b = lazy.arcs(q), eager.arcs(q)
        assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.targets, b.targets)


def test_smollm2_missing_bytes_are_reported(smol_vocab):
    ta = compile("x[\\x04\\x05]", smol_vocab, None, ALL)
    assert any("0x04" in w and "1 strings" in w for w in ta.warnings)
    got = {toks for toks, _ in enumerate_paths(ta)}
    assert {smol_vocab.decode(t) for t in got} == {"x\x05"}
    with pytest.raises(CompileError, match="0x04"):
        compile("\\x04+", smol_vocab, None, ALL)
    with pytest.raises(CompileError, match="0xF5|0xF1"):
        compile("[\\U00040000-\\U00040010]", smol_vocab, None, ALL)


def test_count_paths(gpt2_vocab):
    ta = compile("(a|b) c", gpt2_vocab, "a|b", ALL)
    idx = token_index(gpt2_vocab)
    assert ta.count_paths(ta.start, 10, prefix_only=True) == 2
    total = sum(len(segmentations(s.encode(), idx)) for s in ("a", "b")) * len(segmentations(b" c", idx))
    assert ta.count_paths(ta.start, 10) == total
    ta = compile("a+", gpt2_vocab, None, ALL)
    runs = sum(1 for t in gpt2_vocab.tokens if t and set(t) == {ord("a")})
    assert ta.count_paths(ta.start, 3) == runs + runs ** 2 + runs ** 3


def test_huge_counts_do_not_crash_the_warning(smol_vocab):
    ta = compile("[^\\n]{0,800}", smol_vocab, None, ALL)
    assert any("cannot be produced" in w for w in ta.warnings)


def test_count_paths_is_not_recursive(gpt2_vocab):
    ta = compile("a*", gpt2_vocab, None, ALL)
    assert ta.count_paths(ta.start, 1500) > 10 ** 100


@pytest.mark.parametrize("options,match", [
    (dict(edits=1.5), "whole number"), (dict(edits=100), "whole number"),
    (dict(edit_alphabet="\ud800"), "UTF-8"), (dict(tokenization="some"), "tokenization"),
    (dict(edit_scope="middle"), "edit scope"), (dict(max_states=0), "max_states"), (dict(exclude=[1]), "strings"),
])
def test_bad_options_are_compile_errors(gpt2_vocab, options, match):
    """Options check themselves where they are made, before anything compiles."""
    with pytest.raises(CompileError, match=match):
        compile("ab", gpt2_vocab, None, CompileOptions(**options))


def test_exclusions_accept_a_list_or_one_pattern(gpt2_vocab):
    as_list = compile("ab|a|b|c", gpt2_vocab, None, CompileOptions(exclude=["b", "c"]))
    one = compile("ab|a|b|c", gpt2_vocab, None, CompileOptions(exclude="ab"))
    assert {gpt2_vocab.decode(t) for t, _ in enumerate_paths(as_list)} == {"ab", "a"}
    assert {gpt2_vocab.decode(t) for t, _ in enumerate_paths(one)} == {"a", "b", "c"}
    with pytest.raises(CompileError, match="MATCHING"):
        compile(None, gpt2_vocab)


@pytest.mark.parametrize("vocab_name", ["gpt2_vocab", "smol_vocab", "gemma_vocab"])
def test_fewest_tokens_is_the_shortest_tokenization_and_bounds_the_canonical_one(request, vocab_name):
    """``fewest_tokens`` (which lets a query with no string that fits in max_tokens say so at
    once): under all tokenizations, the fewest completion tokens of any accepted token path,
    found by a breadth-first walk of its arcs; under canonical tokenization, at most that fewest. ``most``
    caps it at ``most + 1``, and a budget too small to finish gives the depth it reached, never
    more than the true value."""
    from collections import deque

    def shortest(ta) -> int:
        """The fewest completion tokens of an accepted path: 0-1 breadth first over the token
        automaton's own arcs (a prefix token costs 0)."""
        best = {ta.start: 0}
        todo = deque([ta.start])
        while todo:
            s = todo.popleft()
            arcs = ta.arcs(s)
            for t, pre in zip(arcs.targets.tolist(), arcs.prefix.tolist()):
                d = best[s] + (not pre)
                if d < best.get(t, d + 1):
                    best[t] = d
                    todo.appendleft(t) if pre else todo.append(t)
        return min(d for s, d in best.items() if ta.is_final(s))

    vocab = request.getfixturevalue(vocab_name)
    cases = [("x(ab|cd){2,3}", None), ("The (cat|dog) sat on the (mat|hat)", "The"),
             ("Hello, wörld[0-9]{2}!", "Hello,"), ("(~{16}|q{3})z", None), ("a(ardvark){2}", "a"),
             ("([a-c]{2} ){2}", None)]
    for pattern, prefix in cases:
        fewest = {}
        for mode in ("all", "canonical"):
            ta = compile(pattern, vocab, prefix, CompileOptions(tokenization=mode, prefix_tokenization=mode))
            fewest[mode] = shortest(ta)
            got = ta.fewest_tokens(64)
            if mode == "all":
                assert got == fewest["all"], (pattern, got, fewest)
            assert got <= fewest[mode], (pattern, mode, got, fewest)
            if got:
                assert ta.fewest_tokens(got - 1) == got  # none in got - 1: most + 1
            if got > 1:
                assert ta.fewest_tokens(64, budget=1) <= got
        assert fewest["all"] <= fewest["canonical"]


def test_a_language_too_long_for_max_tokens_is_known_at_once(gpt2_vocab):
    """200 letters take at least 7 GPT-2 tokens (its longest letter tokens have 15 or so
    letters): ``too_long`` tells a max_tokens they cannot fit in, checked against the canonical
    encodings of a few of the strings, and None where the bound does not rule the strings out."""
    ta = compile("x[a-z]{200}", gpt2_vocab, "x")
    need = ta.too_long(2)
    assert need is not None and need > 2
    rng = random.Random(3)
    for _ in range(20):
        text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(200))
        assert len(gpt2_vocab.encode(text)) >= need
    assert len(gpt2_vocab.encode("ab" * 100)) >= need
    longest = max(len(t) for t in gpt2_vocab.tokens if t and t.isalpha() and t.islower())
    assert need >= -(-200 // longest)
    assert ta.too_long(need) is None and ta.too_long(64) is None


def test_trie_walks_agree_whichever_way_a_state_is_walked(smol_vocab):
    """``walk_dfa`` walks a state densely (every trie node) or pruned (only live nodes), choosing
    by how much of the vocabulary its first two bytes begin: the arcs are the same either way,
    and those of a token-by-token walk of the DFA."""
    from relmql.automata.trie import trie_for
    ta = compile(r'The rivers? ran [a-z]+ "high", said (he|she)\.', smol_vocab)
    delta, trie = ta.delta, trie_for(smol_vocab)
    dead = delta.shape[0] - 1
    states = np.arange(dead)
    mixed = trie.walk_dfa(delta, states)
    for every in (0.0, 2.0):  # all dense, all pruned
        assert all(np.array_equal(a, b) for a, b in zip(mixed, trie.walk_dfa(delta, states, dense_at=every)))
    bounds, toks, tgts = mixed
    rng = random.Random(5)
    sample = set(rng.sample(range(len(smol_vocab.tokens)), 3000))
    sample |= {i for i, t in enumerate(smol_vocab.tokens) if t is not None and t[:2] in (b" r", b" s", b"Th")}
    for q in states.tolist():
        want = {}
        for i in sorted(sample):
            t = smol_vocab.tokens[i]
            if t is None:
                continue
            s = q
            for b in t:
                s = delta[s, b]
                if s == dead:
                    break
            if s != dead:
                want[i] = int(s)
        got = dict(zip(toks[bounds[q]:bounds[q + 1]].tolist(), tgts[bounds[q]:bounds[q + 1]].tolist()))
        assert {i: s for i, s in got.items() if i in sample} == want, q


@pytest.mark.parametrize("mode", ["all", "canonical"])
def test_an_automaton_is_freed_with_its_last_reference(gpt2_vocab, mode):
    # its parts point back to it; a reference cycle would keep every table alive until a full
    # garbage collection (three eager builds in a row held three automata's arrays)
    import gc
    import weakref
    from relmql.automata.language import LanguageSpec, compile_language
    from relmql.automata.tokens import TokenAutomaton
    automaton = TokenAutomaton(compile_language(LanguageSpec("Hello (cat|dog)s?", "Hello")), gpt2_vocab, mode, mode)
    automaton.arcs(automaton.start)
    gone = weakref.ref(automaton)
    gc.disable()
    try:
        del automaton
        assert gone() is None
    finally:
        gc.enable()
