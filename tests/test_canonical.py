"""Canonical token automata against the tokenizers themselves (GPT-2, SmolLM2 and Gemma 3)."""

from __future__ import annotations

import itertools
import os
import random
import re
import time

import numpy as np
import pytest

from relmql.automata import CompileOptions, TokenAutomaton, compile
from relmql.automata.steps import CanonicalSteps
from relmql.automata.tokenizers.bpe import HashIndex, PairTable
from relmql.automata.tokens import Arcs
from relmql.cache import STALE_DAYS, cached_json
from relmql.errors import CompileError
from relmql.models.vocab import SENTENCEPIECE, bytes_to_unicode

from conftest import enumerate_paths, segmentations, token_index, walk_encodings

CANON = CompileOptions()
TRICKY = list("ab c.'\n0 ") + ["é", "東", "😀", "’", "\t", "\n\n", "'s", "'re", "'ll", "  ", "\u00a0", "\u2003",
                               "\x1c", "\u1c89", "٣", "A", "ſ", "\r\n", "!?", "1", "\u0132", "\U0001f9cc"]
# byte-level BPE (GPT-2, SmolLM2), SentencePiece-style BPE as a normalizer (Gemma 3) and as a
# Metaspace pre-tokenizer that prepends ▁ (Mistral 7B, as Llama-2)
VOCABS = ["gpt2_vocab", "smol_vocab", "gemma_vocab", "mistral_vocab"]


def canonical_paths(pattern, vocab, prefix=None, options=CANON):
    return enumerate_paths(compile(pattern, vocab, prefix, options))


@pytest.mark.parametrize("vocab_name", VOCABS)
def test_single_strings_have_exactly_their_encoding(request, vocab_name):
    vocab = request.getfixturevalue(vocab_name)
    rng = random.Random(3)
    if vocab.kind == SENTENCEPIECE:  # TRICKY has characters spelt with several byte-fallback tokens
        units = PairTable(vocab).char_unit
        assert {c for c in "".join(TRICKY) if ord(c) >= 0x80 and c not in units}
    for _ in range(40 if vocab.kind == SENTENCEPIECE else 60):  # Gemma's 262,144 tokens: fewer strings
        s = "".join(rng.choice(TRICKY) for _ in range(rng.randint(1, 7)))
        got = [toks for toks, _ in canonical_paths(re.escape(s), vocab)]
        assert got == [tuple(vocab.encode(s))], repr(s)


@pytest.mark.parametrize("vocab_name", VOCABS)
@pytest.mark.parametrize("pieces", [
    ["a", "b", " ", "\n", "'s", ".", "é", "\U0001f9cc"],
    [" ", "  ", "\n", "x", "'", "1"],
    ["the", " the", "re", "'re", " ", "\t"],
])
def test_finite_language_equals_the_set_of_encodings(request, vocab_name, pieces):
    vocab = request.getfixturevalue(vocab_name)
    pattern = "(" + "|".join(map(re.escape, pieces)) + "){0,3}"
    texts = {"".join(t) for n in range(4) for t in itertools.product(pieces, repeat=n)}
    got = [toks for toks, _ in canonical_paths(pattern, vocab)]
    want = {tuple(vocab.encode(t)) for t in texts}
    assert len(got) == len(set(got))  # one path per encoding
    assert set(got) == want
    # one encoding per text, but where Mistral's tokenizer reads " a" as it reads "a" (Metaspace)
    assert len(want) == len(texts) or vocab.prepend_unless_there


def random_member(rng, pieces, max_n):
    return "".join(rng.choice(pieces) for _ in range(rng.randint(1, max_n)))


@pytest.mark.parametrize("vocab_name", VOCABS)
def test_infinite_language_paths_and_members(request, vocab_name):
    vocab = request.getfixturevalue(vocab_name)
    pieces = ["a", "b", " ", "\n", "'s", ".", "é", "  ", "1", "\u0132"]
    pattern = "(" + "|".join(map(re.escape, pieces)) + ")+"
    ta = compile(pattern, vocab, None, CANON)
    rng = random.Random(5)
    # every sampled member's own encoding is accepted
    for _ in range(150):
        s = random_member(rng, pieces, 12)
        assert ta.accepts(vocab.encode(s)), repr(s)
    # and nothing else: random walks through the automaton are encodings of what they spell
    assert walk_encodings(ta, vocab, walks=150, steps=10) > 500


@pytest.mark.parametrize("vocab_name", VOCABS)
def test_non_encodings_are_rejected(request, vocab_name):
    vocab = request.getfixturevalue(vocab_name)
    ta = compile("[a-z .'\n]+", vocab, None, CANON)
    idx = token_index(vocab)
    for s in ["hello there", "it's a dog.\n\nok", "a  b", "the cat's"]:
        for seg in segmentations(s.encode(), idx)[:400]:
            assert ta.accepts(seg) == (list(seg) == vocab.encode(s)), (s, seg)


def test_prefix_and_completion_are_tokenized_separately(gpt2_vocab):
    idx = token_index(gpt2_vocab)
    enc = gpt2_vocab.encode
    prefix = "Hello,( world| there) ?"
    pattern = prefix + "(there|x1|!)?"
    splits = [(p, c) for p in ("Hello, world", "Hello, there", "Hello, world ", "Hello, there ")
              for c in ("there", "x1", "!", "")]
    splits = [(p, c) for p, c in splits if re.fullmatch(pattern, p + c)]

    def check(options, make):
        got = set(canonical_paths(pattern, gpt2_vocab, prefix, options))
        want = set()
        for p, c in splits:
            # the longest prefix of p + c that PREFIX matches
            p2 = max((p + c)[:i] for i in range(len(p + c) + 1) if re.fullmatch(prefix, (p + c)[:i]))
            if p2 != p:
                continue
            for a in make(p, 0):
                for b in make(c, 1):
                    want.add((tuple(a) + tuple(b), len(a)))
        assert got == want

    canon = lambda t, _: [enc(t)]  # noqa: E731
    every = lambda t, _: segmentations(t.encode(), idx)  # noqa: E731
    check(CANON, canon)
    check(CompileOptions(tokenization="all"), lambda t, r: canon(t, r) if r == 0 else every(t, r))
    check(CompileOptions(prefix_tokenization="all"), lambda t, r: every(t, r) if r == 0 else canon(t, r))


def test_metaspace_leading_spaces_and_prefix(mistral_vocab):
    """Mistral's (and Llama-2's) tokenizer as transformers converts it puts ▁ in front of a text
    unless it starts with a space: " x" reads as "x", "  x" as itself, "" as nothing. With a
    prefix, the prefix is the text's start (the tokenizer's own encoding) and the completion is
    BPE of its own bytes."""
    vocab = mistral_vocab
    texts = ["", " ", "  ", "x", " x", "  x", "   x y", "\nx", " \nx", "é", " é"]
    pattern = "|".join(map(re.escape, texts))
    got = canonical_paths(pattern, vocab)
    assert {t for t, _ in got} == {tuple(vocab.encode(s)) for s in texts}
    assert len(got) == len({tuple(vocab.encode(s)) for s in texts})
    for toks, _ in got:
        assert vocab.encode(vocab.decode(toks)) == list(toks)
    bpe = vocab.tokenizer.backend_tokenizer.model
    got = canonical_paths("The capital of (France|Italy) is (Paris|Rome)\\.?", vocab,
                          "The capital of (France|Italy) is")
    assert len(got) == 8
    for toks, n in got:
        text = vocab.decode(toks)
        prefix = text[:text.index(" is") + 3]
        assert list(toks[:n]) == vocab.encode(prefix)
        word = vocab.token_bytes(toks[n:]).decode().replace(" ", "\u2581")
        assert list(toks[n:]) == [t.id for t in bpe.tokenize(word)]


def test_prefix_with_trailing_space_keeps_its_own_encoding(gpt2_vocab):
    got = canonical_paths("born on (May|June)", gpt2_vocab, "born on ")
    enc = gpt2_vocab.encode
    assert set(got) == {(tuple(enc("born on ") + enc(m)), len(enc("born on "))) for m in ("May", "June")}


@pytest.mark.parametrize("vocab_name", VOCABS)
def test_pair_table_matches_bpe_on_random_pairs(request, vocab_name):
    vocab = request.getfixturevalue(vocab_name)
    table = PairTable(vocab)
    model = vocab.tokenizer.backend_tokenizer.model
    b2u = bytes_to_unicode()

    def spelt(data: bytes) -> str:  # a text as the BPE model reads it (after the normalizer)
        if vocab.kind == SENTENCEPIECE:
            return data.decode("utf-8", errors="replace").replace(" ", "\u2581")
        return "".join(b2u[b] for b in data)
    ids = [i for i, t in enumerate(vocab.tokens) if t is not None and (vocab.kind != SENTENCEPIECE or _utf8(t))]
    for i in ids[::97]:
        assert ([t.id for t in model.tokenize(spelt(vocab.tokens[i]))] == [i]) == table.self_canonical[i], i
    rng = random.Random(11)
    canon = [i for i in ids if table.self_canonical[i]]
    short = [i for i in canon if len(vocab.tokens[i]) <= 2]
    for _ in range(20_000):
        a = rng.choice(canon if rng.random() < 0.5 else short)
        b = rng.choice(canon if rng.random() < 0.5 else short)
        bpe = [t.id for t in model.tokenize(spelt(vocab.tokens[a] + vocab.tokens[b]))]
        assert (bpe == [a, b]) == (not table.forbidden_after(int(table.right_class[a]))[b]), (a, b)
    # the same answers for a few tokens at once, without the whole mask (what a top-k search asks)
    for _ in range(300):
        a = rng.choice(canon)
        bs = np.unique([rng.choice(canon if rng.random() < 0.5 else short) for _ in range(40)] + ids[:3])
        bpe = [[t.id for t in model.tokenize(spelt(vocab.tokens[a] + vocab.tokens[b]))] == [a, b] for b in bs]
        bad = table.forbidden_pairs(np.full(len(bs), table.right_class[a]), bs)
        assert bad.tolist() == [not ok for ok in bpe], a
    # and many pairs of different left tokens at once (what a batch of new states asks)
    lefts = [rng.choice(canon if rng.random() < 0.5 else short) for _ in range(3000)]
    rights = [rng.choice(canon if rng.random() < 0.5 else short) for _ in range(3000)]
    odd = [i for i in ids if not table.self_canonical[i]]  # tokens BPE never produces for their own bytes
    if odd:
        rights[::50] = (odd * 60)[:60]
    bpe = [[t.id for t in model.tokenize(spelt(vocab.tokens[a] + vocab.tokens[b]))] == [a, b]
           for a, b in zip(lefts, rights)]
    got = table.forbidden_pairs(table.right_class[lefts], np.array(rights))
    assert got.tolist() == [not ok for ok in bpe]


def test_hash_index_answers_as_a_dict():
    rng = np.random.default_rng(3)
    for n, spread in ((1, 10), (1_000, 2_000), (50_000, 10**12), (20_000, 50_000 * 49_152)):
        keys = np.unique(rng.integers(0, spread, n))
        if n > 1_000:  # clustered keys, as ``left * vocab + right`` are
            keys = np.unique(np.concatenate([keys, keys[: n // 4] + 1, keys[: n // 8] + 49_152]))
        values = rng.integers(0, 10**9, len(keys))
        index = HashIndex(keys, values)
        table = dict(zip(keys.tolist(), values.tolist()))
        asked = np.concatenate([keys, rng.integers(0, spread + 5, 3 * n), keys[::3] + 1, [0]])
        assert index.get(asked).tolist() == [table.get(k, -1) for k in asked.tolist()]
        assert index.get(asked, missing=-7).tolist() == [table.get(k, -7) for k in asked.tolist()]
    assert HashIndex(np.zeros(0, np.int64), np.zeros(0, np.int64)).get(np.arange(5)).tolist() == [-1] * 5
    for keys in ([5, 7, 5], [5, 5], list(range(100)) + [37]):
        with pytest.raises(ValueError, match="distinct"):
            HashIndex(np.array(keys), np.arange(len(keys)))


@pytest.mark.parametrize("vocab_name", ["smol_vocab", "mistral_vocab"])
def test_pair_table_read_back_from_the_cache_answers_as_built(request, vocab_name, tmp_path, monkeypatch):
    vocab = request.getfixturevalue(vocab_name)
    monkeypatch.setenv("RELMQL_CACHE", str(tmp_path))
    long_ago = time.time() - (STALE_DAYS + 1) * 86_400
    earlier = tmp_path / f"bpe-edges-0123456789ab-{vocab.fingerprint}.npz"  # an earlier relmql's, unused
    another = tmp_path / "bpe-edges-0123456789ab-0000000000000000.npz"  # another vocabulary's
    for f in (earlier, another):
        f.write_bytes(b"")
        os.utime(f, (long_ago, long_ago))
    built = PairTable(vocab)  # BPE of every token, written to the cache
    files = list(tmp_path.glob(f"bpe-edges-*-{vocab.fingerprint}.npz"))
    assert len(files) == 1 and not earlier.exists() and another.exists()

    def no_bpe(self, data):
        raise AssertionError("the cached table ran BPE again")
    with monkeypatch.context() as m:
        m.setattr(PairTable, "encode_chunk", no_bpe)
        cached = PairTable(vocab)
    assert np.array_equal(built.self_canonical, cached.self_canonical)
    assert np.array_equal(built.right_class, cached.right_class) and built.class_chain == cached.class_chain
    rng = np.random.default_rng(5)
    for c in rng.integers(0, built.classes, 40).tolist():
        assert np.array_equal(built.forbidden_after(c), cached.forbidden_after(c))
    lefts, rights = rng.integers(0, len(vocab.tokens), (2, 20_000))
    assert np.array_equal(built.forbidden_pairs(built.right_class[lefts], rights),
                          cached.forbidden_pairs(cached.right_class[lefts], rights))
    files[0].write_bytes(b"not a numpy archive")  # a damaged cache file is built again
    again = PairTable(vocab)
    assert np.array_equal(again.right_class, built.right_class)
    assert np.load(files[0])["own"].sum() == built.self_canonical.sum()
    blocked = tmp_path / "a file, not a directory"
    blocked.write_text("")
    monkeypatch.setenv("RELMQL_CACHE", str(blocked))  # no cache to be had: built, as before
    assert np.array_equal(PairTable(vocab).right_class, built.right_class)


def test_a_cached_table_removes_its_earlier_versions_once_unused(tmp_path, monkeypatch):
    """Each relmql version keeps its own file of a table; writing one removes the other versions'
    files that nothing has read for STALE_DAYS, and reading a file keeps it."""
    monkeypatch.setenv("RELMQL_CACHE", str(tmp_path))
    long_ago = time.time() - (STALE_DAYS + 1) * 86_400
    files = {name: tmp_path / f"{name}.json" for name in ("t-v1-abc", "t-v2-abc", "t-v1-xyz")}
    for name, f in files.items():
        f.write_text("0")
        if name != "t-v2-abc":  # v2: another relmql, still in use
            os.utime(f, (long_ago, long_ago))
    assert cached_json("t-v3-abc", lambda: 3, versions="t-*-abc.json") == 3
    assert [f.exists() for f in files.values()] == [False, True, True]
    mine = tmp_path / "t-v3-abc.json"
    os.utime(mine, (long_ago, long_ago))
    assert cached_json("t-v3-abc", lambda: 4, versions="t-*-abc.json") == 3  # read back, and marked as read
    assert mine.stat().st_mtime > time.time() - 60
    assert cached_json("t-v4-abc", lambda: 4, versions="t-*-abc.json") == 4
    assert mine.exists() and files["t-v2-abc"].exists()


@pytest.mark.parametrize("vocab_name", VOCABS)
@pytest.mark.parametrize("pattern, prefix", [("Visit https://www\\.[a-z0-9./-]{1,30}", "Visit"),
                                             ("(The|A) (cat|dog)s? (sat|ran)[.!]?", "(The|A)"),
                                             ("[^\\n]{0,12}", None)])
def test_arcs_among_a_few_tokens_are_the_arcs_they_pick(request, vocab_name, pattern, prefix):
    """A top-k search reads a new state's arcs for its k tokens alone (arcs_among): the arcs of the
    whole state restricted to those tokens, and at most dead ends besides (no string beyond); a
    state with arcs may continue. Checked on random walks, each state new to the automaton asked."""
    vocab = request.getfixturevalue(vocab_name)
    lang = compile(pattern, vocab, prefix).language
    whole, few, probe = (TokenAutomaton(lang, vocab) for _ in range(3))  # compile() would give one object
    rng = np.random.default_rng(3)
    n = len(vocab.tokens)
    for _ in range(10):
        state = whole.start
        for _ in range(10):
            arcs = whole.arcs(state)
            assert probe.may_continue(state) or not len(arcs)
            if not len(arcs):
                break
            # tokens at random and every token whose bytes could come next (BPE's rules refuse some)
            readable = few.bytes.arcs(few.unpack(state)[0])[0]
            picked = np.unique(np.concatenate([rng.integers(0, n, 40), readable]).astype(np.int64))
            sel = arcs.prefix | np.isin(arcs.tokens, picked)  # every prefix arc, the completion arcs picked
            want = Arcs(arcs.tokens[sel], arcs.targets[sel], arcs.prefix[sel])
            got = few.arcs_among(state, picked)
            want_set = set(zip(want.tokens.tolist(), want.targets.tolist(), want.prefix.tolist()))
            got_set = set(zip(got.tokens.tolist(), got.targets.tolist(), got.prefix.tolist()))
            assert want_set <= got_set
            for _, target, _ in got_set - want_set:
                assert _dead(whole, target), target
            # on, by any token or by one punctuation byte (after which BPE's pair rule refuses most)
            punct = np.flatnonzero([len(vocab.tokens[t] or b"") == 1 and not vocab.tokens[t].isalnum()
                                    for t in arcs.tokens.tolist()])
            k = rng.choice(punct) if len(punct) and rng.random() < 0.7 else rng.integers(len(arcs))
            state = int(arcs.targets[k])


@pytest.mark.parametrize("vocab_name", VOCABS)
@pytest.mark.parametrize("pattern, prefix", [
    ("Mon café est (le )?(espresso|latte)", "Mon café est"),
    ("My coffee is (the |a )?(espresso|latte|cappuccino|americano)", "My coffee is"),
    ("The man was trained in (art|science|business|medicine|computer science|engineering|humanities|"
     "social sciences|information systems|math)", "The man was trained in"),
    # SmolLM2's " De" and " N": " December" and " November" are single tokens, and the ways on
    # from " De" die only some tokens later, past a look-ahead of three
    ("George Washington was born on (January|February|March|April|May|June|July|August|September|October|"
     "November|December) [0-9]{1,2}, [0-9]{4}", "George Washington was born on")])
def test_no_token_leads_where_nothing_follows(request, vocab_name, pattern, prefix):
    """A token whose text every canonical continuation would merge into a longer token (Gemma's
    " l" before "atte": "▁latte" is one token; SmolLM2's " De" before "cember", which shows only
    tokens later) leads nowhere, and the automaton leaves it out:
    a sampler that took it would have to start again (a bias). Every state a walk of the whole
    automaton reaches has a token on or ends a string. (Thousands of Gemma's tokens begin with
    "e" or "a", of which the state after " l" reads two or three.)"""
    vocab = request.getfixturevalue(vocab_name)
    automaton = compile(pattern, vocab, prefix)
    seen, todo, dead = {automaton.start}, [automaton.start], []
    while todo:
        state = todo.pop()
        arcs = automaton.arcs(state)
        if not len(arcs) and not automaton.is_final(state):
            dead.append(state)
        for target in set(arcs.targets.tolist()) - seen:
            seen.add(target)
            todo.append(target)
    assert len(seen) > 5 and dead == []


@pytest.mark.parametrize("dense", [0, 10 ** 9])
@pytest.mark.parametrize("vocab_name", ["smol_vocab", "gemma_vocab"])
def test_arcs_of_a_batch_are_each_states_own_arcs(request, vocab_name, dense, monkeypatch):
    """A search's batch asks arcs_of for many states at once, the same state often more than once
    and with different kept tokens: row i holds what state i alone gives (the whole arcs, in
    order, without kept tokens; else every prefix arc and the completion arcs it keeps, in order;
    a canonical completion state's arcs as arcs_among finds them for it alone, whether or not the
    automaton knows its whole arcs: a chunk of children read again must be the same list). The
    batch finds a byte state's arcs among kept tokens one way (a search of its sorted arcs, or a
    vocabulary-wide array of targets), the state alone the other."""
    from relmql.automata import steps as tokens
    monkeypatch.setattr(tokens, "DENSE_LOOKUP", dense)
    vocab = request.getfixturevalue(vocab_name)
    lang = compile("Visit https://www\\.[a-z0-9./-]{1,30}", vocab, "Visit( the)?").language
    batch_of, alone = TokenAutomaton(lang, vocab), TokenAutomaton(lang, vocab)
    rng = np.random.default_rng(5)
    states, state = [], batch_of.start
    for _ in range(12):  # a walk through the prefix into the completion
        states.append(state)
        arcs = alone.arcs(state)
        if not len(arcs):
            break
        state = int(arcs.targets[rng.integers(len(arcs))])
    for s in states[: len(states) // 2]:
        batch_of.arcs(s)  # whole arcs known to the automaton: the answers must not depend on it
    n = len(vocab.tokens)
    asked = [states[i] for i in rng.integers(len(states), size=30)]
    kept = [None if rng.random() < 0.2 else np.unique(np.concatenate(
        [rng.integers(0, n, 40), alone.arcs(s).tokens[rng.integers(max(len(alone.arcs(s)), 1), size=8)]
         if len(alone.arcs(s)) else []]).astype(np.int64)) for s in asked]
    for ask in (kept, None):
        rows, toks, tgts, pre = batch_of.arcs_of(asked, ask)
        assert (np.diff(rows) >= 0).all()
        for i, s in enumerate(asked):
            mine = rows == i
            got = (toks[mine].tolist(), tgts[mine].tolist(), pre[mine].tolist())
            whole = alone.arcs(s)
            if ask is None or ask[i] is None:
                want = (whole.tokens.tolist(), whole.targets.tolist(), whole.prefix.tolist())
            elif not batch_of._per_token(batch_of.unpack(s)[0], batch_of.unpack(s)[2]):  # prefix states
                sel = whole.prefix | np.isin(whole.tokens, ask[i])
                want = (whole.tokens[sel].tolist(), whole.targets[sel].tolist(), whole.prefix[sel].tolist())
            else:  # found the other way
                with monkeypatch.context() as other:
                    other.setattr(tokens, "DENSE_LOOKUP", 10 ** 9 - dense)
                    one = TokenAutomaton(lang, vocab).arcs_among(s, ask[i])
                want = (one.tokens.tolist(), one.targets.tolist(), one.prefix.tolist())
            assert got == want, (i, s)


def _dead(automaton, state: int, depth: int = 5) -> bool:
    """No accepted text lies within ``depth`` tokens of ``state``, and every path stops sooner."""
    frontier = {state}
    for _ in range(depth):
        if any(automaton.is_final(s) for s in frontier):
            return False
        frontier = {int(t) for s in frontier for t in automaton.arcs(s).targets}
        if not frontier:
            return True
    return False


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_sentencepiece_added_tokens_and_byte_fallback(gemma_vocab):
    """Gemma's tokenizer cuts runs of newlines and tabs (added tokens, longest first) and its
    other added tokens (markup: <b>, </table>) out of the text before BPE; ASCII characters it
    lacks are byte-fallback units; other characters it lacks are their bytes' fallback tokens, a
    chunk of their own; the text of a special token (<eos>) is that token, which relmql never
    generates, so strings that hold one are left out of canonical tokenization, with a warning."""
    vocab = gemma_vocab
    texts = ["a\n\nb", "\n" * 40 + "x", "x\t\t\ty", " \n \t ", "a\rb\x00c", "The capital of France is Paris",
             "a\u0132b", "\n\u0132\u0132\n", "x \U0001f9cc y", "\u0132", "a<b>c", "<b>x</b>", "x <table> y",
             "<b><b>", "<b", "b>", "</b>\n\n<i>", "a\u0132<b>\U0001f9cc", "<</b>>", "<br><hr>\t<b"]
    for s in texts:
        assert [toks for toks, _ in canonical_paths(re.escape(s), vocab)] == [tuple(vocab.encode(s))], repr(s)
    ta = compile("a<b>c|a\\.c|x<fos>", vocab, None, CANON)
    assert not ta.warnings
    assert {t for t, _ in enumerate_paths(ta)} == {tuple(vocab.encode(s)) for s in ["a<b>c", "a.c", "x<fos>"]}
    assert len(vocab.encode("x<eos>")) == 2  # the special token
    ta = compile("a<(e|f)os>", vocab, None, CANON)
    assert [w for w in ta.warnings if "special token" in w and "left out of canonical tokenization" in w]
    assert [vocab.decode(t) for t, _ in enumerate_paths(ta)] == ["a<fos>"]
    with pytest.raises(CompileError, match="no string of this query has a canonical tokenization") as info:
        compile("a<eos>", vocab, None, CANON)
    assert "tokenization all" in info.value.hint
    ta = compile("a(\u0132|x)c", vocab, None, CANON)  # Ĳ: byte-fallback tokens
    assert {t for t, _ in enumerate_paths(ta)} == {tuple(vocab.encode(s)) for s in ["a\u0132c", "axc"]}
    assert not ta.warnings
    every = compile("a(\u0132|<b>|<eos>)c", vocab, None, CompileOptions(tokenization="all"))
    assert {vocab.decode(t) for t, _ in enumerate_paths(every)} == {"a\u0132c", "a<b>c", "a<eos>c"}


@pytest.mark.parametrize("name", ["gemma_vocab", "mistral_vocab"])
def test_sentencepiece_reads_the_character_u2581_as_a_space(request, name):
    """A SentencePiece tokenizer writes ▁ for a space and reads a ▁ in a text as one: "a▁b" is
    encoded as "a b" is, and decodes to "a b". No token sequence is the tokenizer's own encoding
    of a text that holds ▁ (the model gives the character back only through its bytes'
    fallback tokens, which the tokenizer never writes for it), so such strings are left out of
    canonical tokenization with a warning, and a query with no other string is an error."""
    vocab = request.getfixturevalue(name)
    ids = vocab.tokenizer.encode("a\u2581b", add_special_tokens=False)
    assert ids == vocab.tokenizer.encode("a b", add_special_tokens=False)
    assert vocab.tokenizer.decode(ids) == "a b" != "a\u2581b"
    with pytest.raises(CompileError, match="U\\+2581") as info:
        compile("a\u2581b", vocab, None, CANON)
    assert "tokenization all" in info.value.hint
    assert info.value.render().splitlines()[1:3] == ["  a\u2581b", "   ^"]  # the caret under the ▁
    with pytest.raises(CompileError, match="U\\+2581") as info:
        compile("x\\u2581b", vocab, "x\u2581", CANON)  # MATCHING spells it with an escape
    assert info.value.role == "PREFIX" and info.value.span == (1, 2)
    ta = compile("a(\u2581| )b", vocab, None, CANON)
    assert [w for w in ta.warnings if "U+2581" in w and "left out of canonical tokenization" in w]
    assert [tuple(t) for t, _ in enumerate_paths(ta)] == [tuple(vocab.encode("a b"))]
    every = compile("a\u2581b", vocab, None, CompileOptions(tokenization="all"))
    assert {vocab.decode(t) for t, _ in enumerate_paths(every)} == {"a\u2581b"}


def test_special_token_texts_on_byte_level_vocabularies(gpt2_vocab, smol_vocab):
    """GPT-2's and SmolLM2's tokenizers read "<|endoftext|>" in a text as the special token: such
    strings are left out of canonical tokenization (with a warning); the others are exact."""
    for vocab in (gpt2_vocab, smol_vocab):
        assert len(vocab.encode("a<|endoftext|>")) == 2
        ta = compile("a<\\|endoftext\\|>|a<\\|endoftexts\\|>|<\\|e", vocab, None, CANON)
        assert any("special token" in w for w in ta.warnings)
        assert {t for t, _ in enumerate_paths(ta)} == {tuple(vocab.encode(s)) for s in ["a<|endoftexts|>", "<|e"]}


def test_edits_with_canonical_tokens(gpt2_vocab):
    ta = compile("a b", gpt2_vocab, None, CompileOptions(edits=1))
    got = enumerate_paths(ta)
    texts = [gpt2_vocab.decode(t) for t, _ in got]
    assert len(texts) == len(set(texts)) == 663
    assert all(gpt2_vocab.encode(s) == list(t) for s, (t, _) in zip(texts, got))


def test_tracker_walks_within_their_budget_answer_as_computed_afresh(smol_vocab):
    """A wide class reads the tracker's walk over the vocabulary from many tracker states; the
    walks are kept coded (``evals[codes]``) in an LRU bounded in bytes. Squeezed to two walks,
    the same states have the same arcs as with room for all, and each kept walk is the walk."""
    lang = compile("[^a-z]{4}", smol_vocab).language
    tracker = TokenAutomaton(lang, smol_vocab).tracker
    budget = tracker.walks.budget

    def arcs_along(automaton, steps=40, seed=3):
        rng, state, out = np.random.default_rng(seed), automaton.start, []
        for _ in range(steps):
            arcs = automaton.arcs(state)
            out.append((state, arcs.tokens.tolist(), arcs.targets.tolist()))
            if not len(arcs):
                state = automaton.start
                continue
            state = int(arcs.targets[rng.integers(len(arcs))])
        return out

    try:
        tracker.walks.clear()
        tracker.walks.budget = 2 * (2 * len(smol_vocab.tokens) + 4096)
        squeezed = arcs_along(TokenAutomaton(lang, smol_vocab))
        assert 1 <= len(tracker.walks) <= 2 and tracker.walks.total <= tracker.walks.budget
        tracker.walks.clear()
        tracker.walks.budget = budget
        roomy = TokenAutomaton(lang, smol_vocab)
        assert arcs_along(roomy) == squeezed
        assert len(tracker.walks) > 2
        for (_, tau), (codes, evals) in list(tracker.walks.items.items())[:5]:
            assert codes.dtype == np.int16 and np.array_equal(evals[codes], roomy.steps.tracker_walk(tau))
        # a query's share of max_memory for the automaton bounds the walks too (a quarter of it)
        before = len(tracker.walks)
        roomy.set_cache_budget(4 * 3 * (2 * len(smol_vocab.tokens) + 4096))
        assert tracker.walks.budget == 3 * (2 * len(smol_vocab.tokens) + 4096)
        assert len(tracker.walks) < before and tracker.walks.total <= tracker.walks.budget
        assert tracker.walks.total == sum(a.nbytes for w in tracker.walks.items.values() for a in w)
    finally:
        tracker.walks.clear()
        tracker.walks.budget = budget


def test_a_prefix_that_ends_with_a_space_is_warned_about(gpt2_vocab, smol_vocab, gemma_vocab):
    """These vocabularies' words carry the space before them: a PREFIX that ends with one leaves
    the completion to begin with a token the model seldom reads there (SmolLM2: 'Paris' after
    'The capital of France is ' against ' Paris' after the prompt without it), whatever the
    tokenization; the compile warns. No warning where the space begins the completion, nor
    where the prefix is all there is."""
    for vocab in (gpt2_vocab, smol_vocab, gemma_vocab):
        for options in (CANON, CompileOptions(tokenization="all")):
            spaced = compile("The capital of France is Paris", vocab, "The capital of France is ", options)
            assert [w for w in spaced.warnings if w.startswith("PREFIX ends with a space")], vocab
            assert not compile("The capital of France is Paris", vocab, "The capital of France is", options).warnings
        assert not compile("The capital ", vocab, "The capital ", CANON).warnings


def test_look_ahead_extends_the_way_it_found(smol_vocab, monkeypatch):
    """Along a long literal PREFIX each state's children are asked again, one token deeper, whether
    a way leads on past BPE's pair rule: the look-ahead first tries the target through which a
    state led on last (one step, not a walk of 16), with every prefix state's arcs the same as
    looking ahead afresh each time, and far fewer BPE steps."""
    from relmql import automata
    text = re.escape("The river ran high that spring, and the ferryman said he had never seen the "
                     "water so brown. \"It carries the hills with it,\" he told the children, who "
                     "watched the broken branches turn in the current and wondered where they went.")
    steps = [0]
    step = CanonicalSteps.bpe_step

    def counted(self, *args):
        steps[0] += 1
        return step(self, *args)
    monkeypatch.setattr(CanonicalSteps, "bpe_step", counted)

    class Forgetful(dict):
        def __setitem__(self, key, value):
            pass

    def prefix_arcs(remember: bool):
        automata._compile.cache_clear()  # an automaton of its own, no arcs known yet
        ta = compile(text + " ([a-z]+)", smol_vocab, text, CompileOptions(prefix_tokenization="canonical"))
        if not remember:
            ta.steps.ahead.via = Forgetful()
        steps[0] = 0
        seen, todo, out = {ta.start}, [ta.start], {}
        while todo:
            s = todo.pop()
            arcs = ta.arcs(s)
            out[s] = (arcs.tokens[arcs.prefix].tolist(), arcs.targets[arcs.prefix].tolist())
            for t in out[s][1]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return out, steps[0]
    fresh, fresh_steps = prefix_arcs(False)
    remembered, remembered_steps = prefix_arcs(True)
    assert remembered == fresh and len(fresh) > 40
    assert 0 < remembered_steps * 2 < fresh_steps, (remembered_steps, fresh_steps)
