"""The executor against independent oracles: direct transformers scoring, brute-force
rankings, and the exact distributions for sampling."""

from __future__ import annotations

import math
import threading
from collections import Counter

import numpy as np
import pytest
import torch
from scipy import stats as sstats

from relmql.automata import CompileOptions, compile
from relmql.execute import (Cancelled, Decoding, ExecutionError, Sample, SampleStats, SearchStats, ShortestPath,
                            execute, shortest_path)

from conftest import enumerate_paths, segmentations, token_index
from oracle import ranking, rules_logprobs, step_logprobs, tolerance

CANON = CompileOptions()
ALL = CompileOptions(tokenization="all", prefix_tokenization="all")


def check_ranking(model, pattern, prefix, options, order, rules, batch_size=8):
    ta = compile(pattern, model.vocabulary, prefix, options)
    kw = {k: v for k, v in rules.items() if k != "eos"}
    brute = ranking(model, enumerate_paths(ta), order, rules.get("eos", False), **kw)
    rows = list(execute(ta, model, ShortestPath(order=order, batch_size=batch_size), Decoding(**rules)))
    assert len(rows) == len(brute)
    column = "logprob" if order == "prob" else "total_logprob"
    values = [r.get(column) for r in rows]
    assert values == sorted(values, reverse=True)
    for r, (cond, total, toks, n) in zip(rows, brute):
        completion = len(r.tokens) - r.prefix_tokens + rules.get("eos", False)
        assert abs(r.logprob - cond) <= tolerance(model, completion, r.prefix_tokens == 0), (r, cond)
        assert abs(r.total_logprob - total) <= tolerance(model, completion + r.prefix_tokens), (r, total)
    # the same sequences (ties may come in either order)
    assert {r.tokens for r in rows} == {b[2] for b in brute}
    for r in rows:
        assert r.text == r.prefix + r.completion
        assert model.vocabulary.decode(r.tokens) == r.text
        assert r.prefix_tokens == next(b[3] for b in brute if b[2] == r.tokens)
    return rows


RULES = [{}, {"topk": 40}, {"topp": 0.9}, {"temperature": 0.7}, {"eos": True},
         {"topk": 100, "temperature": 1.3, "topp": 0.95, "eos": True}]


@pytest.mark.parametrize("rules", RULES)
@pytest.mark.parametrize("order", ["prob", "total_prob"])
def test_ranking_with_a_regex_prefix_on_smollm2(smol, rules, order):
    prefix = "The (man|woman) was trained in"
    check_ranking(smol, prefix + " (art|science|math|law|medicine)", prefix, CANON, order, rules)


@pytest.mark.parametrize("options", [CANON, ALL], ids=["canonical", "all"])
def test_ranking_on_gemma3_sentencepiece(gemma, options):
    """Gemma 3 (SentencePiece-style BPE, 262,144 tokens): the rows are those of direct float32
    scoring, in its order, canonical and over all tokenizations."""
    if options is ALL:  # every tokenization of each string: a shorter language
        check_ranking(gemma, "A (cat|dog)", "A", options, "prob", {"topk": 40})
        return
    prefix = "The capital of (France|Italy) is"
    # Ĳ and 🧌: characters Gemma spells with byte-fallback tokens (a chunk of their own)
    rows = check_ranking(gemma, prefix + " (Paris|Rome|Lyon|a city|\u0132 \U0001f9cc)\\.?", prefix, options, "prob",
                         {"topk": 40})
    if options is CANON:  # what the model knows
        assert [r.completion for r in rows if r.prefix == "The capital of France is"][0] == " Paris"
        assert [r.completion for r in rows if r.prefix == "The capital of Italy is"][0] == " Rome"


@pytest.mark.parametrize("rules", [{}, {"topk": 20000, "eos": True}])
@pytest.mark.parametrize("order", ["prob", "total_prob"])
def test_ranking_over_all_tokenizations(tiny, rules, order):
    check_ranking(tiny, "A (cat|dog) (sat|ran)", "A (cat|dog)", ALL, order, rules)


@pytest.mark.parametrize("order", ["prob", "total_prob"])
def test_ranking_with_prefixes_of_one_another(tiny, order):
    # the prefix language a|b|bb|bbb is not prefix-free: each string takes its longest prefix
    check_ranking(tiny, "(a|b|bb|bbb) (c|d)x?", "(a|b|bb|bbb)", CANON, order, {})


def test_ranking_without_prefix_and_with_edits(tiny):
    check_ranking(tiny, "It is (red|blue)", None, CompileOptions(edits=1, edit_alphabet="xy"), "prob", {})


@pytest.mark.parametrize("batch_size", [1, 8])
def test_ranking_with_edits_in_the_prefix_by_total_prob(tiny, batch_size):
    """Under total_prob a forced run of prefix tokens is read token by token while other nodes wait
    (an edit early in the prefix must not make the search read the rest of it first): the rows are
    still every edited string, in brute force's order."""
    check_ranking(tiny, "The cat sat", "The cat", CompileOptions(edits=1, edit_alphabet="xy"), "total_prob", {},
                  batch_size=batch_size)


@pytest.mark.parametrize("batch_size", [1, 3, 64])
def test_batch_size_does_not_change_the_rows(tiny, batch_size):
    ta = compile("The (man|woman) (ran|sat|is|was) (here|there)", tiny.vocabulary, "The (man|woman)")
    ref = [(r.tokens, r.logprob) for r in execute(ta, tiny, ShortestPath(batch_size=7))]
    got = [(r.tokens, r.logprob) for r in execute(ta, tiny, ShortestPath(batch_size=batch_size))]
    assert [t for t, _ in got] == [t for t, _ in ref]
    assert np.allclose([lp for _, lp in got], [lp for _, lp in ref], atol=1e-5)


@pytest.mark.parametrize("rules", [Decoding(), Decoding(topk=40)], ids=["all tokens", "top-k"])
def test_children_sorted_for_the_batch_or_node_by_node_give_the_same_rows(smol, monkeypatch, rules):
    """A batch's children are sorted in one go when they are few (a top-k search), node by node when
    there are many: both give the same rows, bit for bit."""
    from relmql.execute import shortest
    ta = compile("The (cat|dog) (sat|ran) on [a-z ]{1,12}", smol.vocabulary, "The (cat|dog)")
    opts = ShortestPath(limit=20, batch_size=8)
    ref = [(r.tokens, r.logprob) for r in execute(ta, smol, opts, rules)]
    monkeypatch.setattr(shortest, "ONE_SORT", 0)
    assert [(r.tokens, r.logprob) for r in execute(ta, smol, opts, rules)] == ref
    monkeypatch.setattr(shortest, "ONE_SORT", 1 << 40)
    assert [(r.tokens, r.logprob) for r in execute(ta, smol, opts, rules)] == ref
    assert len(ref) == 20


def test_a_nodes_first_children_are_those_of_a_whole_stable_sort():
    """``first_sorted`` (a partition, tier by tier, then a sort of the few kept) against a stable
    sort of every child: the same positions, in the same order, ties and infinities included."""
    from relmql.execute.expansion import first_sorted
    rng = np.random.default_rng(7)
    for trial in range(400):
        m = int(rng.integers(0, 4000))
        tier = rng.integers(0, 2, m).astype(np.int8) if trial % 3 else np.zeros(m, np.int8)
        val = rng.integers(0, int(rng.integers(1, 40)), m).astype(np.float64)  # many ties
        val[rng.random(m) < 0.05] = math.inf
        n = int(rng.integers(1, 700))
        assert np.array_equal(first_sorted(tier, val, n), np.lexsort((val, tier))[:n]), (trial, m, n)


MONTHS = "(January|February|March|April|May|June|July|August|September|October|November|December)"


def test_the_default_rows_are_the_same_at_any_batch_size_and_thread_count(smol):
    """The README's date query and a top-k 5 query (70 of its 1,320 dates survive top-k) on SmolLM2
    in the default float32: the same rows in the same order at batch sizes 1, 7 and 32 and with 1
    or 2 threads, and probabilities within float32's rounding of each other (in bfloat16 padding
    alone moved one by 20%)."""
    queries = [("George Washington was born on " + MONTHS + " [0-9]{1,2}, [0-9]{4}", "George Washington was born on",
                Decoding(topk=40), 10),
               ("George Washington was born on " + MONTHS + " [0-9]{1,2}", "George Washington was born on",
                Decoding(topk=5), None)]
    threads = torch.get_num_threads()
    try:
        for pattern, prefix, rules, limit in queries:
            ta = compile(pattern, smol.vocabulary, prefix)
            runs = {}
            for batch, n in ((32, threads), (7, threads), (1, threads), (32, 1), (7, 2)):
                torch.set_num_threads(n)
                runs[batch, n] = [(r.text, r.logprob, len(r.tokens)) for r in
                                  execute(ta, smol, ShortestPath(limit=limit, batch_size=batch), rules)]
            ref = runs[32, threads]
            assert ref and all([t for t, _, _ in run] == [t for t, _, _ in ref] for run in runs.values()), runs
            for run in runs.values():
                for (_, lp, n), (_, want, _) in zip(run, ref):
                    assert abs(lp - want) <= 2 * tolerance(smol, n)
    finally:
        torch.set_num_threads(threads)


def test_eviction_and_recomputation_give_the_same_rows(tiny, monkeypatch):
    ta = compile("The (man|woman) (ran|sat|is|was) (here|there|now)", tiny.vocabulary, "The (man|woman)")
    ref = [(r.tokens, r.logprob) for r in execute(ta, tiny, ShortestPath(batch_size=4))]
    seen = []
    # the query's share of max_memory for keys and values is 1 byte: every block is dropped as
    # soon as it is made
    monkeypatch.setattr(tiny, "set_cache_budget", lambda n: seen.append(n) or setattr(tiny.store, "budget", 1))
    before = tiny.stats.recomputed
    got = [(r.tokens, r.logprob) for r in execute(ta, tiny, ShortestPath(batch_size=4))]
    assert tiny.stats.recomputed > before and seen == [ShortestPath().max_memory // 2]
    monkeypatch.undo()
    tiny.set_cache_budget(ShortestPath().max_memory // 2)
    assert [t for t, _ in got] == [t for t, _ in ref]
    assert np.allclose([lp for _, lp in got], [lp for _, lp in ref], atol=1e-5)


def call_sizes(model, monkeypatch) -> list:
    """The number of sequences in each of the model's calls from now on."""
    sizes, extend = [], model.extend
    monkeypatch.setattr(model, "extend", lambda parents, tokens: sizes.append(len(parents)) or extend(parents, tokens))
    return sizes


def test_the_batch_grows_while_rows_are_far_apart_and_the_rows_stay(tiny, monkeypatch):
    """Every edit of a prefix: hundreds of nodes between rows. With max_batch_size the calls grow
    past batch_size (up to max_batch_size, never past max_nodes nor a share of max_memory) and
    there are far fewer of them; the rows are those of fixed batches (probabilities within
    float32 rounding, as between any two batch sizes)."""
    ta = compile("The (cat|dog) sat", tiny.vocabulary, "The (cat|dog)", CompileOptions(edits=1))
    sizes = call_sizes(tiny, monkeypatch)
    runs = {}
    for grow in (None, 64):
        sizes.clear()
        opts = ShortestPath(order="total_prob", limit=3, batch_size=4, max_batch_size=grow)
        runs[grow] = ([(r.tokens, r.logprob) for r in execute(ta, tiny, opts)], list(sizes))
    (fixed, fixed_calls), (grown, grown_calls) = runs[None], runs[64]
    assert len(fixed) == 3 and [t for t, _ in grown] == [t for t, _ in fixed]
    assert np.allclose([lp for _, lp in grown], [lp for _, lp in fixed], rtol=0, atol=1e-5)  # float32 rounding
    assert max(fixed_calls) == 4 and max(grown_calls) == 64 and len(grown_calls) < len(fixed_calls) / 4
    stats = SearchStats()
    opts = ShortestPath(order="total_prob", limit=3, batch_size=4, max_batch_size=64, max_nodes=300)
    list(shortest_path(ta, tiny, Decoding(), opts, stats=stats))
    assert stats.stop is not None and stats.stop.bound == "max_nodes" and 300 <= stats.expanded < 300 + 4
    # with 64 MiB in all, a call's scores (8 bytes per token per node) keep within 4 MiB
    sizes.clear()
    list(execute(ta, tiny, ShortestPath(order="total_prob", limit=3, batch_size=4, max_batch_size=64,
                                        max_memory=64 * 2 ** 20)))
    assert 4 < max(sizes) and max(sizes) * 8 * len(tiny.vocabulary) <= 4 * 2 ** 20


def test_the_batch_stays_small_while_rows_come_often(tiny, monkeypatch):
    ta = compile("[a-h]+", tiny.vocabulary)
    sizes = call_sizes(tiny, monkeypatch)
    rows = list(execute(ta, tiny, ShortestPath(limit=200, batch_size=4, max_batch_size=64)))
    assert len(rows) == 200 and max(sizes) == 4


def test_max_batch_size_below_batch_size_is_refused():
    with pytest.raises(ExecutionError, match="max_batch_size must be a whole number of at least batch_size"):
        ShortestPath(batch_size=8, max_batch_size=4).check()


@pytest.mark.parametrize("batch_size", [1, 8])
def test_one_token_per_expanded_node(tiny, batch_size):
    """Each node read costs one token (the root reads the start-of-text token), but for a small
    prefix tree read in one call: its two chains, [start, The, man] and [start, The, woman],
    each read the start token and 'The' (a batch of one reads the tree level by level)."""
    ta = compile("The (man|woman) was (here|there|gone)", tiny.vocabulary, "The (man|woman)")
    before, calls = tiny.stats.tokens, tiny.stats.calls
    stats = SearchStats()
    rows = list(shortest_path(ta, tiny, Decoding(), ShortestPath(batch_size=batch_size), stats=stats))
    assert len(rows) == 6 and stats.expanded == 6 and stats.prefix == 4  # and ' was' after each
    assert tiny.stats.tokens - before == stats.expanded + (2 if batch_size > 1 else 0)
    assert tiny.stats.calls - calls == (2 if batch_size > 1 else 5)


def test_results_stream_before_the_search_ends(tiny):
    ta = compile("[a-z ]+", tiny.vocabulary)
    before = tiny.stats.calls
    rows = execute(ta, tiny, ShortestPath(batch_size=4, max_tokens=30))
    first = next(rows)
    assert tiny.stats.calls - before < 50
    assert first.rank == 1
    rows.close()


def test_max_tokens_bounds_infinite_languages(tiny):
    ta = compile("(ab|c)+", tiny.vocabulary, None, ALL)
    rows = list(execute(ta, tiny, ShortestPath(max_tokens=3)))
    assert rows and all(len(r.tokens) <= 3 for r in rows)
    assert len(rows) == len({r.tokens for r in rows})
    brute = ranking(tiny, [(t, 0) for t, _ in _paths_upto(ta, 3)])
    assert len(rows) == len(brute)


def test_a_prefix_longer_than_max_tokens_is_read_whole(tiny):
    # max_tokens bounds the completion only: a passage as long as LAMBADA's runs to hundreds of
    # prefix tokens (this once ended the search with no rows and no error)
    prefix = " ".join(["one two three four five six seven eight nine ten"] * 3)
    ta = compile(prefix + " (eleven|twelve)", tiny.vocabulary, prefix, CANON)
    assert len(tiny.vocabulary.encode(prefix)) > 20
    rows = list(execute(ta, tiny, ShortestPath(max_tokens=4)))
    assert sorted(r.completion for r in rows) == [" eleven", " twelve"]
    sampled = list(execute(ta, tiny, Sample(4, max_tokens=4)))
    assert len(sampled) == 4 and all(r.prefix == prefix for r in sampled)
    with pytest.raises(ExecutionError, match="at most 5 tokens") as err:
        list(execute(ta, tiny, Sample(1, max_prefix_tokens=5)))
    assert "max_prefix_tokens" in err.value.hint


def test_max_nodes_stops_the_search_with_exact_rows_so_far(tiny):
    ta = compile("(ab|c)+", tiny.vocabulary, None, ALL)
    full = list(execute(ta, tiny, ShortestPath(max_tokens=3, batch_size=4)))
    stats = SearchStats()
    cut = list(execute(ta, tiny, ShortestPath(max_tokens=3, batch_size=4, max_nodes=3), stats=stats))
    assert stats.stopped and stats.expanded <= 3 + 4 and len(cut) < len(full)
    assert [r.tokens for r in cut] == [r.tokens for r in full[:len(cut)]]
    stats = SearchStats()
    list(execute(ta, tiny, ShortestPath(max_tokens=3, max_nodes=10 ** 6), stats=stats))
    assert not stats.stopped


def _paths_upto(ta, n):
    out, stack = [], [(ta.start, ())]
    while stack:
        s, toks = stack.pop()
        if ta.is_final(s) and toks:
            out.append((toks, 0))
        if len(toks) < n:
            a = ta.arcs(s)
            stack.extend((int(t2), toks + (int(t1),)) for t1, t2 in zip(a.tokens, a.targets))
    return out


def test_relm_top1_check(smol):
    """ReLM's model-level check: a( b)? with top-k 1: without a prefix "a" itself must be the
    model's first choice; with prefix "a" it is given, and " b" must be the first choice after it."""
    enc = smol.vocabulary.encode
    lp0 = step_logprobs(smol, [])
    lp1 = step_logprobs(smol, enc("a"))
    a_top = int(np.argmax(lp0[0])) == enc("a")[0]
    b_top = int(np.argmax(lp1[-1])) == enc(" b")[0]
    ta = compile("a( b)?", smol.vocabulary)
    rows = list(execute(ta, smol, ShortestPath(), Decoding(topk=1)))
    assert len(rows) == (a_top + (a_top and b_top))
    ta = compile("a( b)?", smol.vocabulary, "a")
    rows = list(execute(ta, smol, ShortestPath(), Decoding(topk=1)))
    assert [r.text for r in rows][:1] == ["a"] and rows[0].prob == 1.0
    assert len(rows) == 1 + b_top


def test_cancellation_stops_between_model_calls(tiny):
    ta = compile("[a-z]+", tiny.vocabulary)
    cancel = threading.Event()
    rows = execute(ta, tiny, ShortestPath(batch_size=2, max_tokens=20), cancel=cancel)
    next(rows)
    cancel.set()
    with pytest.raises(Cancelled):
        next(rows)


def test_prob_order_with_an_explosive_prefix_is_a_clear_error(tiny):
    ta = compile("[ab]{1,12} c", tiny.vocabulary, "[ab]{1,12}", ALL)
    with pytest.raises(ExecutionError, match="every prefix") as info:
        next(execute(ta, tiny, ShortestPath(max_prefix_nodes=50)))
    assert "total_prob" in info.value.hint
    assert next(execute(ta, tiny, ShortestPath(order="total_prob"))).rank == 1
    # the prefix's token tree is counted level by level, and only until it passes the bound:
    # within n tokens, every sequence of the vocabulary's [ab]+ tokens of at most 12 bytes (by
    # brute force) where it fits, none past it; a tree of about 1e85 nodes is refused with the
    # bound, not its 86 digits
    import itertools
    import re
    sizes = [len(b) for b in tiny.vocabulary.tokens if b and re.fullmatch(rb"[ab]+", b)]
    for n in (2, 3):
        tree = sum(1 for j in range(n + 1) for seq in itertools.product(sizes, repeat=j) if sum(seq) <= 12)
        assert ta.prefix_nodes(n, tree) == tree and ta.prefix_nodes(n, tree - 1) is None
    huge = compile("a{300} c", tiny.vocabulary, "a{300}", ALL)
    with pytest.raises(ExecutionError, match="tokenizations of this prefix make more than 100,000 token sequences "
                                             "to read first") as info:
        next(execute(huge, tiny, ShortestPath()))
    assert "a canonical prefix tokenization" in info.value.hint
    # canonically, many strings (text pasted with its dots unescaped): the hint says how to escape
    dotted = compile("a.c.e x", tiny.vocabulary, "a.c.e")
    with pytest.raises(ExecutionError, match="strings of this prefix make more than 50 token sequences") as info:
        next(execute(dotted, tiny, ShortestPath(max_prefix_nodes=50)))
    assert "escape('...')" in info.value.hint and "canonical" not in info.value.hint


def test_too_many_prefix_paths_are_refused_before_any_model_call(tiny):
    """The prefix's token tree is counted first (until it passes the bound): one node over the
    bound (its size here from brute-force segmentations) is an error that names the bound, and
    no node is expanded; at that size the search runs and expands exactly it."""
    text = "abcabcabc"
    segs = segmentations(text.encode(), token_index(tiny.vocabulary))
    tree = len({seg[:i] for seg in segs for i in range(len(seg) + 1)})
    ta = compile(text + " x", tiny.vocabulary, text, ALL)
    stats = SearchStats()
    with pytest.raises(ExecutionError, match=f"make more than {tree - 1:,} token sequences"):
        next(execute(ta, tiny, ShortestPath(max_prefix_nodes=tree - 1), stats=stats))
    assert stats.expanded == 0
    stats = SearchStats()
    assert next(execute(ta, tiny, ShortestPath(max_prefix_nodes=tree), stats=stats)).text == text + " x"
    assert stats.prefix == tree


def test_bad_options_are_errors(tiny):
    ta = compile("a", tiny.vocabulary)
    for rules in [Decoding(topk=0), Decoding(topp=1.5), Decoding(temperature=0)]:
        with pytest.raises(ExecutionError):
            next(execute(ta, tiny, ShortestPath(), rules))
    with pytest.raises(ExecutionError):
        next(execute(ta, tiny, ShortestPath(order="prob DESC")))
    with pytest.raises(ExecutionError):
        next(execute(ta, tiny, Sample(3, mode="biased")))


# ---------------------------------------------------------------- sampling


def exact_conditional(model, paths, eos=False, **rules):
    """P(string | prefix, language) for a finite language with one prefix path."""
    scored = {t: math.exp(ranking(model, [(t, n)], "prob", eos, **rules)[0][0])
              for t, n in paths if ranking(model, [(t, n)], "prob", eos, **rules)}
    z = sum(scored.values())
    return {t: p / z for t, p in scored.items()}


def local_distribution(model, ta, paths, **rules):
    """The locally renormalized sampler's exact distribution, step by step."""
    out = {}
    for toks, n in paths:
        lp = step_logprobs(model, toks)
        state, prob = ta.start, 1.0
        for i, t in enumerate(toks):
            arcs = ta.arcs(state)
            if i >= n:
                allowed = arcs.tokens[~arcs.prefix]
                r = np.exp(rules_logprobs(lp[i], **rules))
                prob *= r[t] / r[allowed].sum()
            k = int(np.flatnonzero((arcs.tokens == t) & (arcs.prefix == (i < n)))[0])
            state = int(arcs.targets[k])
        out[toks] = prob
    return out


def chi_square_p(counts: Counter, probs: dict, n: int) -> float:
    keys = sorted(probs)
    obs = np.array([counts.get(k, 0) for k in keys], float)
    exp = np.array([probs[k] * n for k in keys])
    assert obs.sum() == n
    return sstats.chisquare(obs, exp).pvalue


COLOR = ("My favourite colour is", " (red|blue|green|black|white|yellow)")


def test_rejection_sampling_stops_on_cancel_between_model_calls(tiny):
    """Rejection draws again from the prefix's state without a model call (on tiny-gpt2, the
    first 5,000 draws of this language take no token of it: one step, a million draws in
    seconds), so a cancel is honoured, and progress reported, between draws, not only between
    model calls."""
    ta = compile("zq[0-9]{2}", tiny.vocabulary, "", CANON)
    cancel, seen = threading.Event(), []

    def watch(stats, opts):
        seen.append(stats.draws)
        if stats.draws >= 2000:
            cancel.set()

    drawn = SampleStats(watch=watch)
    with pytest.raises(Cancelled):
        list(execute(ta, tiny, Sample(3, mode="exact", max_draws=5000), cancel=cancel, stats=drawn))
    assert 2000 <= drawn.draws < 2000 + 1024 and seen[-1] == drawn.draws
    assert seen == sorted(seen) and len(set(seen)) >= 2


def test_sampling_takes_a_last_token_at_the_context_as_the_search_does(tiny):
    """The model reads at most its context (tiny-gpt2: 512 tokens, the start token among them),
    and scores the token after it: a string whose last token is that one is found by the search
    and drawn by the sampler, with the same probability; one a token longer is neither, and the
    sampler says that the context, not improbability, stopped it."""
    assert tiny.max_length == 512
    pre = "( a){509}"
    ta = compile(pre + "( b){3}", tiny.vocabulary, pre, CANON)  # 512 tokens, the last unread
    best = list(execute(ta, tiny, ShortestPath(limit=2)))
    assert len(best) == 1 and len(best[0].tokens) == 512
    rows = list(execute(ta, tiny, Sample(3, seed=1)))
    assert all(r.tokens == best[0].tokens for r in rows)
    assert all(r.logprob == pytest.approx(best[0].logprob, abs=1e-4) for r in rows)
    longer = compile(pre + "( b){4}", tiny.vocabulary, pre, CANON)
    assert list(execute(longer, tiny, ShortestPath(limit=1))) == []
    with pytest.raises(ExecutionError, match="reached the 512 tokens the model reads") as info:
        list(execute(longer, tiny, Sample(1, max_draws=3)))
    assert "shorter PREFIX" in info.value.hint


def test_local_sampling_follows_its_distribution(smol):
    prefix, rest = COLOR
    ta = compile(prefix + rest, smol.vocabulary, prefix)
    paths = enumerate_paths(ta)
    want = local_distribution(smol, ta, paths)
    rows = list(execute(ta, smol, Sample(600, seed=1)))
    assert [r.rank for r in rows] == list(range(1, 601))
    assert chi_square_p(Counter(r.tokens for r in rows), want, 600) > 0.001


def test_exact_sampling_follows_the_conditional_distribution(smol):
    prefix, rest = COLOR
    ta = compile(prefix + rest, smol.vocabulary, prefix)
    want = exact_conditional(smol, enumerate_paths(ta))
    rows = list(execute(ta, smol, Sample(400, seed=2, mode="exact", batch_size=64)))
    assert chi_square_p(Counter(r.tokens for r in rows), want, 400) > 0.001


def test_prefixes_are_drawn_uniformly(tiny):
    ta = compile("(a|b|bb|bbb)!", tiny.vocabulary, "a|b|bb|bbb")
    rows = list(execute(ta, tiny, Sample(800, seed=3)))
    counts = Counter(r.prefix for r in rows)
    assert set(counts) == {"a", "b", "bb", "bbb"}
    assert chi_square_p(counts, {k: 0.25 for k in counts}, 800) > 0.001


def test_unbiased_estimates_converge_where_local_renormalization_does_not(smol):
    # local renormalization takes " the" without looking ahead, so " the zoo" gets the mass of
    # " the" (and " xylophone" is no real rival): it is drawn far more often than the model
    # would produce it
    prefix = "Yesterday I went to"
    ta = compile(prefix + " (the zoo|the xylophone|school|church)", smol.vocabulary, prefix)
    paths = enumerate_paths(ta)
    exact = exact_conditional(smol, paths)
    local = local_distribution(smol, ta, paths)
    target = max(exact, key=lambda t: abs(exact[t] - local[t]))
    assert abs(exact[target] - local[target]) > 0.3, "the example must show the bias"
    n = 400
    naive = sum(r.tokens == target for r in execute(ta, smol, Sample(n, seed=4))) / n
    exact_freq = sum(r.tokens == target for r in execute(ta, smol, Sample(n, seed=4, mode="exact"))) / n
    tol = 4 * math.sqrt(exact[target] * (1 - exact[target]) / n)
    assert abs(exact_freq - exact[target]) < tol
    assert abs(naive - local[target]) < 0.05 and abs(naive - exact[target]) > 5 * tol


def test_importance_weights_estimate_the_language_probability(smol):
    prefix, rest = COLOR
    ta = compile(prefix + rest, smol.vocabulary, prefix)
    paths = enumerate_paths(ta)
    rows = list(execute(ta, smol, Sample(400, seed=6)))
    p_lang = sum(math.exp(ranking(smol, [(t, n)], "prob")[0][0]) for t, n in paths)
    assert abs(np.mean([r.weight for r in rows]) - p_lang) < 0.05 * p_lang
    exact = exact_conditional(smol, paths)
    total = sum(r.weight for r in rows)
    for toks, p in exact.items():
        est = sum(r.weight for r in rows if r.tokens == toks) / total
        assert abs(est - p) < 4 * math.sqrt(p * (1 - p) / 400) + 0.01


def test_samples_are_reproducible_and_independent_of_batching(tiny):
    ta = compile("The (man|woman) (ran|sat|is)( here)?", tiny.vocabulary, "The (man|woman)")
    a = [r.tokens for r in execute(ta, tiny, Sample(30, seed=9, batch_size=4))]
    b = [r.tokens for r in execute(ta, tiny, Sample(30, seed=9, batch_size=16))]
    c = [r.tokens for r in execute(ta, tiny, Sample(30, seed=10, batch_size=16))]
    assert a == b and a != c


def test_sample_rows_are_members(smol):
    prefix = "The (man|woman) was trained in"
    ta = compile(prefix + " (art|science|math|law|medicine)", smol.vocabulary, prefix,
                 CompileOptions(edits=1))
    for r in execute(ta, smol, Sample(40, seed=5), Decoding(topk=40)):
        assert ta.accepts(list(r.tokens), r.prefix_tokens)
        assert r.edits in (0, 1) and r.weight > 0
        assert r.text == r.prefix + r.completion


def test_local_sampling_at_a_tiny_temperature_takes_the_likeliest_allowed_token(smol):
    """At temperature 1e-3 every allowed token's rule probability underflows a float64 (the
    model's top token is not among them), yet a draw still picks among them in proportion:
    each step the allowed token the model scores highest. The weights underflow to 0."""
    prefix = "The"
    ta = compile(prefix + " (cat|dog|man) (sat|ran)", smol.vocabulary, prefix)
    paths = enumerate_paths(ta)
    rows = list(execute(ta, smol, Sample(4, seed=1), Decoding(temperature=1e-3)))
    assert len(rows) == 4 and len({r.tokens for r in rows}) == 1
    toks, n = rows[0].tokens, rows[0].prefix_tokens
    assert (toks, n) in paths and all(r.weight == 0 for r in rows)
    lp = step_logprobs(smol, toks)
    assert int(np.argmax(lp[n])) not in {t[n] for t, _ in paths}  # the model's own choice is ruled out
    for i in range(n, len(toks)):  # greedy among the tokens the language allows at each step
        allowed = {t[i] for t, m in paths if m == n and t[:i] == toks[:i]}
        assert toks[i] == max(allowed, key=lambda t: lp[i][t])


def test_exact_sampling_gives_up_on_improbable_languages(tiny):
    ta = compile("zq[0-9]{6}", tiny.vocabulary)
    with pytest.raises(ExecutionError, match="too improbable"):
        list(execute(ta, tiny, Sample(2, mode="exact", max_draws=50)))



@pytest.mark.parametrize("matching, using, hint", [
    ("zq[0-9]{6}", "sampling exact", "use the local sampling mode"),
    ("zq[0-9]{6}", "topk 1", "topk 1 kept none of the tokens the language allows"),  # 'zq' is never top one
    # canonically z iv g: longer than max_tokens, though two GPT-2 tokens spell it (so it is drawn)
    ("zivg", "max_tokens 2", "raise max_tokens"),
])
def test_a_sampler_that_gives_up_says_what_to_change(con, matching, using, hint):
    from relmql.errors import Error
    with pytest.raises(Error) as got:
        con.sql(f"SELECT text MATCHING '{matching}' USING {using}, max_draws 30 SAMPLE 2").fetchall()
    e = got.value
    assert e.kind == "execution error" and "gave up after 30 draws" in str(e)  # USING max_draws: the budget
    assert hint in e.hint and "max_draws" in e.hint
    assert ("local sampling mode" in e.hint) == (using == "sampling exact")


def test_a_search_that_the_rules_leave_without_a_row_says_so(tiny):
    """``no_row``: why a search found no row. The oracle for "rules": the two most probable first
    tokens, read from the model itself, begin no string."""
    ta = compile("zq(a|b)", tiny.vocabulary)
    stats = SearchStats()
    assert list(execute(ta, tiny, ShortestPath(), Decoding(topk=2), stats=stats)) == []
    first = torch.topk(tiny.extend([None], [[]])[0].logprobs, 2).indices.tolist()
    assert not any(tiny.vocabulary.tokens[t].startswith(b"z") for t in first)
    assert stats.no_row == ("rules",) and stats.stop is None
    # rules that keep every token, the strings cut by max_tokens instead (each needs two or more)
    every = Decoding(topk=len(tiny.vocabulary))
    assert min(len(p) for p, _ in enumerate_paths(ta)) >= 2
    for rules in (every, Decoding()):
        stats = SearchStats()
        assert list(execute(ta, tiny, ShortestPath(max_tokens=1), rules, stats=stats)) == []
        assert stats.no_row == ("max_tokens",)
    # a prefix longer than max_prefix_tokens
    ta = compile("The cat sat( down)?", tiny.vocabulary, "The cat sat")
    stats = SearchStats()
    assert list(execute(ta, tiny, ShortestPath(max_prefix_tokens=1), Decoding(), stats=stats)) == []
    assert stats.no_row == ("max_prefix_tokens",)
    stats = SearchStats()  # rows found: nothing to say
    assert len(list(execute(ta, tiny, ShortestPath(), every, stats=stats))) == 2 and stats.no_row == ()


def test_a_search_whose_rules_rule_out_the_end_of_text_says_so(smol, capsys):
    """Under eos, top-k may keep every token of the strings but not the end-of-text token after
    any of them (the oracle: its rank after each string, read from the model itself): no row,
    and the note names eos; with the end-of-text token kept, rows."""
    pattern, prefix = "The (cat|dog) (sat|ran)", "The"
    ta = compile(pattern, smol.vocabulary, prefix)
    paths = enumerate_paths(ta)
    ranks = []
    for toks, n in paths:
        lp = step_logprobs(smol, toks)
        ranks.append(int((lp[len(toks)] > lp[len(toks)][smol.eos_id]).sum()))  # tokens ahead of eos
        assert all((lp[i] > lp[i][toks[i]]).sum() < 2000 for i in range(n, len(toks)))  # top-k keeps the words
    k = 2000
    assert min(ranks) >= k
    stats = SearchStats()
    assert list(execute(ta, smol, ShortestPath(), Decoding(topk=k, eos=True), stats=stats)) == []
    assert stats.no_row == ("eos",)
    stats = SearchStats()
    assert len(list(execute(ta, smol, ShortestPath(), Decoding(topk=max(ranks) + 1, eos=True), stats=stats))) == 4
    assert stats.no_row == () and stats.cut == ()
    import relmql
    con = relmql.connect(dtype="float32")
    con.models.put("smollm2-135m", "cpu", "float32", smol)
    res = con.sql(f"SELECT text MATCHING '{pattern}' PREFIX '{prefix}' USING topk {k}, eos")
    assert res.fetchall() == []
    assert "note: no rows: topk 2000 ruled out the end-of-text token" in capsys.readouterr().err


def test_a_search_that_exhausts_its_language_within_the_bounds_says_which_cut_it_short(tiny):
    """``cut``: a search that ends with rows, every string within the bounds, names the bounds
    that left out strings of the language (the oracle: enumeration of its token paths, the long
    ones longer than max_tokens); the rules' cuts are what was asked for, and a language within
    the bounds, or one whose longer strings begin with a shorter one (first_match), has none."""
    ta = compile("The (cat|dog)( sat on the mat)?", tiny.vocabulary)
    lengths = sorted({len(p) for p, _ in enumerate_paths(ta)})
    short = max(n for n in lengths if n < lengths[-1])
    stats = SearchStats()
    got = list(execute(ta, tiny, ShortestPath(max_tokens=short), stats=stats))
    assert {r.text for r in got} == {"The cat", "The dog"} and stats.cut == ("max_tokens",) and stats.no_row == ()
    stats = SearchStats()
    assert len(list(execute(ta, tiny, ShortestPath(), stats=stats))) == 4 and stats.cut == ()
    stats = SearchStats()  # measuring: what follows "The cat" does not count, so nothing is cut
    assert len(list(execute(ta, tiny, ShortestPath(max_tokens=short, first_match=True), stats=stats))) == 2
    assert stats.cut == ()
    stats = SearchStats()  # top-2 cuts the first token short: with rows, that is what was asked for
    list(execute(compile("[a-z]{2}", tiny.vocabulary), tiny, ShortestPath(), Decoding(topk=2), stats=stats))
    assert stats.cut == () and stats.no_row in ((), ("rules",))


def test_strings_that_end_where_nothing_follows_do_not_hide_a_cut_one(tiny, monkeypatch):
    """Under ``eos`` a one-token word reaches max_tokens 1 as a finished string with nothing
    after it. The search remembers CUT cut nodes (1 here); the word, the model's most probable
    letters token, is read before the one string the bound really cut (oracle: its token paths,
    all longer than one token) and must not take its place."""
    import re as _re
    from relmql.execute import shortest
    monkeypatch.setattr(shortest, "CUT", 1)
    lp = tiny.extend([None], [[]])[0].logprobs
    letters = [t for t, b in enumerate(tiny.vocabulary.tokens) if b and _re.fullmatch(rb"[a-pr-z]+", b)]
    word = tiny.vocabulary.tokens[max(letters, key=lambda t: float(lp[t]))].decode()
    ta = compile(f"{word}|qqqqqqqq", tiny.vocabulary)
    assert any(len(p) == 1 for p, _ in enumerate_paths(ta))
    assert all(len(p) > 1 for p, _ in enumerate_paths(ta) if tiny.vocabulary.decode(list(p)) != word)
    stats = SearchStats()
    got = list(execute(ta, tiny, ShortestPath(max_tokens=1), Decoding(eos=True), stats=stats))
    assert [r.text for r in got] == [word] and stats.cut == ("max_tokens",)


@pytest.mark.parametrize("samples", [None, 30], ids=["exact", "estimate"])
def test_a_measurement_within_bounds_that_cut_the_language_says_so(tiny, samples):
    """probability() with ``eos`` of a language whose long strings max_tokens leaves out: the
    search (exact) or the draws (estimate) name max_tokens; within a wide enough bound, nothing."""
    from relmql.execute import Measure
    ta = compile("The (cat|dog)( sat on the mat)?", tiny.vocabulary)
    short = max(len(p) for p, _ in enumerate_paths(ta) if len(p) < max(len(q) for q, _ in enumerate_paths(ta)))
    limit = {} if samples is None else {"exact_limit": 0, "samples": samples}
    for bound, cut in ((short, ("max_tokens",)), (64, ())):
        stats = SearchStats()
        list(execute(ta, tiny, Measure(max_tokens=bound, **limit), Decoding(eos=True), stats=stats))
        assert stats.cut == cut


@pytest.mark.parametrize("vocab", [49152, 50257, 1000])
def test_blockwise_top_values_equal_torch_topk(vocab):
    """decoding.top: the k largest values of each row exactly, and indices that hold them, on
    random rows, rows with ties at the k-th value and rows with -inf (vocabularies that are and
    are not a multiple of the block size, and one too small for blocks), also where the rows
    are not adjacent in memory."""
    from relmql.execute.decoding import top
    gen = torch.Generator().manual_seed(0)
    x = torch.log_softmax(torch.randn(64, vocab, generator=gen) * 3, -1)
    x[1] = torch.round(x[1])  # many ties
    x[2, : vocab // 2] = -math.inf
    x[3, -5:] = 10.0  # the best tokens in the last, partial block
    wide = torch.cat([x[:, :1], x], 1)
    for k in (1, 41, 100):
        w_vals, w_idx = top(wide[:, 1:], k)  # rows apart in memory
        assert torch.equal(w_vals, torch.topk(x, k, dim=-1).values) and torch.equal(torch.gather(x, 1, w_idx), w_vals)
        vals, idx = top(x, k)
        ref = torch.topk(x, k, dim=-1)
        assert torch.equal(vals, ref.values)
        assert torch.equal(torch.gather(x, 1, idx), vals)
        assert all(len(set(r)) == k for r in idx.tolist())


@pytest.mark.parametrize("topp", [None, 0.9])
def test_rows_tied_at_the_topk_threshold_keep_every_tied_token(topp):
    """RuleScores on rows whose k-th value ties with the next ones (as bfloat16 logits often do):
    ``kept`` lists every token at or above the row's threshold (sorted) and the normalizer sums
    exactly those, against the whole row; a row tied over most of the vocabulary keeps None
    (its arcs are read whole)."""
    from relmql.execute.decoding import RuleScores
    gen = torch.Generator().manual_seed(1)
    vocab, k = 262144, 40
    x = torch.log_softmax((torch.randn(6, vocab, generator=gen) * 3).to(torch.bfloat16).float(), -1)
    x[1] = torch.round(x[1] * 2) / 2  # ties around the k-th value
    x[2] = x[2, 0]  # every token tied
    scores = RuleScores(x, Decoding(topk=k, topp=topp))
    ties = 0
    for b in range(len(x)):
        kth = torch.topk(x[b], k).values[-1]
        if topp is not None:  # the smallest most probable set reaching topp, within the top k
            v = torch.topk(x[b], k).values
            p = torch.exp(v - torch.logsumexp(v, 0))
            kth = v[int(((torch.cumsum(p, 0) - p) < topp).sum()) - 1]
        want = np.flatnonzero((x[b] >= kth).numpy())
        assert math.isclose(float(scores.lse[b]), float(torch.logsumexp(x[b][x[b] >= kth], 0)), abs_tol=1e-5)
        if len(want) > 4 * k + 1:
            assert scores.kept[b] is None
        elif topp is None:
            assert scores.kept[b] is not None and np.array_equal(scores.kept[b], want)
            ties += len(want) > k
        else:  # rows keep fewer: the search of ties may have looked among fewer
            assert scores.kept[b] is None or np.array_equal(scores.kept[b], want)
    assert topp is not None or ties >= 2  # the rows above are tied for real


@pytest.mark.parametrize("vocab", [49152, 50257, 262144])
def test_blockwise_top_on_a_cpu(vocab):
    """decoding.top's CPU path (a bound at most the k-th largest value from the maxima of groups
    of blocks, then a sort of the values at or above it): against torch.topk on random rows of
    float32 and float64, with equal values inside the chosen blocks, rows whose block maxima
    tie (bfloat16-like values), the best values in the last partial block, and rows apart in
    memory."""
    from relmql.execute.decoding import BLOCK, _top_cpu, top
    gen = torch.Generator().manual_seed(1)
    x = torch.log_softmax(torch.randn(48, vocab, generator=gen) * 3, -1)
    best = x.argmax(1)
    x[torch.arange(48), best ^ 1] = x[torch.arange(48), best]  # a tie inside a block, at the top
    x[5, -3:] = 5.0  # in the columns past the last whole block (none where vocab is a multiple)
    x[7:9] = torch.round(x[7:9] * 2) / 2  # block maxima tied across blocks, at the k-th value too
    wide = torch.cat([x[:, :1], x], 1)[:, 1:]
    for k in (1, 2, 41, 96):
        for rows in (x, wide, x.double()):
            assert _top_cpu(rows, k, BLOCK) is not None  # the path under test is taken
            vals, idx = top(rows, k)
            assert torch.equal(vals, torch.topk(rows, k, dim=-1).values)
            assert torch.equal(torch.gather(rows, 1, idx), vals)
            assert all(len(set(r)) == k for r in idx.tolist())
    # the chosen blocks are copied into a buffer each call reuses: no result is a view of it
    vals, idx = top(x, 41)
    kept = vals.clone(), idx.clone()
    top(x.flip(0) * 2, 41)
    assert torch.equal(vals, kept[0]) and torch.equal(idx, kept[1])
