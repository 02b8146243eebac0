"""Fitting a language's byte DFA to a vocabulary, when a token automaton is built: the text the
tokenizer puts in front, the strings no token sequence can spell, and the tables canonical
tokenization reads (design: docs/compiler.md, "Inside the token automaton")."""

from __future__ import annotations

import functools
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Tuple

import numpy as np

from ..errors import CompileError, ModelError
from ..models.vocab import Vocabulary
from .bytedfa import SPLIT_COL, ByteDFA, count_strings, format_count, restrict, to_dfa, trim
from .language import Language
from .tokenizers import Tracker, added_words, family_of, rules_for, tracker_for, word_scanner
from .trie import VocabTrie


def fit(language: Language, vocabulary: Vocabulary, trie: VocabTrie, canonical: Tuple[bool, bool],
        context: Tuple[int, ...], warnings: List[str]) -> ByteDFA:
    """The byte DFA a token automaton reads: the language's, with the text the tokenizer puts in
    front of a text (unless ``context`` comes before it), less the strings no token spells and,
    in canonical SentencePiece regions, those whose tokenization relmql does not model (each
    loss reported in ``warnings``; CompileError where nothing is left)."""
    dfa = language.dfa
    if vocabulary.prepend and not context:  # after a prompt, a text does not start
        if vocabulary.prepend_unless_there:
            dfa = _absorb_leading(dfa, vocabulary.prepend)
        dfa = _with_prepend(dfa, vocabulary.prepend)
    dfa = _producible(dfa, trie, warnings)
    if any(canonical) and not family_of(vocabulary).models_every_text:
        dfa = _canonical_part(dfa, vocabulary, language, canonical, warnings)
    return dfa


class CanonicalTables(NamedTuple):
    """What canonical tokenization reads beside the byte DFA."""
    pairs: object  # the vocabulary's PairTable: BPE's merges as a test of adjacent tokens
    tracker: Tracker  # the pre-tokenizer's chunking as an automaton over bytes
    bt: int  # the bits of a packed state that hold the tracker state
    fb_base: int  # the right-edge classes from here on mean: inside a character spelt with byte-fallback tokens
    fb: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]  # fallback_chars(vocabulary), where those are chunks


def canonical_tables(vocabulary: Vocabulary, num_states: int, bq: int) -> CanonicalTables:
    """The pair table, the tracker and the packing of a canonical automaton of ``num_states``
    byte states (``bq`` bits); CompileError where the tokenizer is not modelled or the states
    do not fit in 63 bits."""
    try:
        pairs = pair_table(vocabulary)
        tracker = tracker_for(rules_for(vocabulary))
    except ModelError as e:
        raise CompileError(e.message, hint="use tokenization all (every tokenization of each string)") from None
    bt = Tracker.MAX_STATES.bit_length()
    # lam past the pair classes: inside a character spelt with byte-fallback tokens
    fb_base = pairs.classes
    fb = fallback_chars(vocabulary) if getattr(pairs, "fallback_splits", False) else None
    lams = fb_base + (len(fb[1]) if fb is not None else 0)
    if bq + bt + lams.bit_length() > 63:
        raise CompileError(f"the automaton is too large for canonical tokenization "
                           f"({num_states:,} byte states)", hint="use tokenization all")
    return CanonicalTables(pairs, tracker, bt, fb_base, fb)


def _canonical_part(dfa: ByteDFA, vocabulary: Vocabulary, language: Language, canonical: Tuple[bool, bool],
                    warnings: List[str]) -> ByteDFA:
    """Leave out (and report) the strings whose canonical SentencePiece tokenization relmql
    does not model: characters spelt with several byte-fallback tokens where those are not
    chunks of their own, and added tokens where ``tag_tokens`` cannot read them."""
    try:
        allowed, what = _sentencepiece_allowed(vocabulary)
    except ModelError:
        return dfa  # not a BPE vocabulary: the pair table's own error follows
    kept = restrict(dfa, allowed, canonical)
    if kept.num_states == dfa.num_states and kept.num_arcs == dfa.num_arcs:
        return dfa
    lost = _lost(dfa, kept)
    if kept.is_empty():
        # the caret under the first ▁ written in MATCHING or PREFIX, else under MATCHING
        spec = language.spec
        role, text = next(((r, t) for r, t in (("MATCHING", spec.matching), ("PREFIX", spec.prefix or ""))
                           if "\u2581" in t), ("MATCHING", spec.matching))
        at = text.find("\u2581")
        err = CompileError(f"canonical tokenization of these strings is not supported: they contain {what}",
                           (at, at + 1) if at >= 0 else (0, len(text)), text,
                           hint="use tokenization all (and prefix_tokenization all)")
        err.role = role
        raise err
    one = lost == "1"
    warnings.append(f"{lost} string{'' if one else 's'} of this query left out of canonical "
                    f"tokenization: {'it contains' if one else 'they contain'} {what}; tokenization all "
                    f"includes {'it' if one else 'them'}")
    return kept


def check_special_texts(dfa: ByteDFA, vocabulary: Vocabulary, canonical: Tuple[bool, bool], phase: np.ndarray,
                        warnings: List[str]) -> None:
    """Report the strings that hold the text of a special token (``<eos>``): the tokenizer
    reads that text as the special token, which relmql never produces, so the tracker keeps
    them out of canonical tokenization; a query with no other string is an error."""
    words, ids = added_words(vocabulary)
    special = tuple(w for w, i in zip(words, ids) if vocabulary.tokens[i] is None)
    if not special:
        return
    found, other = _holds_word(dfa, word_scanner(special).delta, canonical, phase)
    if not found:
        return
    names = ", ".join(w.decode("utf-8", "replace") for w in special[:3]) + (", ..." if len(special) > 3 else "")
    why = (f"the text of a special token ({names}), which the tokenizer reads as that token and relmql "
           "never generates")
    if not other:
        raise CompileError(f"no string of this query has a canonical tokenization: each holds {why}",
                           hint="use tokenization all (and prefix_tokenization all) to spell such text "
                                "with ordinary tokens")
    warnings.append(f"strings of this query that hold {why} are left out of canonical tokenization; "
                    "tokenization all spells them with ordinary tokens")


def _producible(dfa: ByteDFA, trie: VocabTrie, warnings: List[str]) -> ByteDFA:
    """Drop (and report) strings that need a byte no token contains."""
    present = np.zeros(256, bool)
    present[np.unique(trie.node_byte[1:])] = True
    missing = np.flatnonzero(~present)
    used = [b for b in missing if (dfa.delta[:-1, b] != dfa.dead).any()]
    if not used:
        return dfa
    delta = dfa.delta.copy()
    delta[:, used] = dfa.dead
    kept = trim(ByteDFA(delta, dfa.final.copy()))
    shown = ", ".join(f"0x{b:02X}" for b in used[:8])
    msg = (f"{_lost(dfa, kept)} strings of this query cannot be produced by this model: its vocabulary has no "
           f"token containing byte(s) {shown}")
    if kept.is_empty():
        raise CompileError("no string of this query can be produced by this model: its vocabulary "
                           f"has no token containing byte(s) {shown}")
    warnings.append(msg)
    return kept


def _lost(dfa: ByteDFA, kept: ByteDFA) -> str:
    """How many strings of ``dfa`` ``kept`` lacks, for a message ("some" for big languages, where
    counting costs more than the message is worth)."""
    if dfa.num_states <= 1000:
        total, left = count_strings(dfa), count_strings(kept)
        if total is not None and left is not None:
            return format_count(total - left)
    return "some"


@functools.lru_cache(maxsize=4)
def fallback_chars(vocab: Vocabulary) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The characters (above ASCII) a SentencePiece vocabulary lacks, as a small DFA over their
    UTF-8 bytes: ``delta[f, byte]`` (-1: none), ``final[f]``, and the byte-fallback token of each
    byte."""
    from .charset import MAX_CP, CodepointSet
    from .primitives import chars_fst, optimize
    pairs = pair_table(vocab)
    lacking = pairs.known().complement().intersection(CodepointSet([(0x80, MAX_CP)]))
    dfa = to_dfa(optimize(chars_fst(lacking), 1_000_000))
    delta = dfa.delta[:-1, :256].astype(np.int64)
    delta[delta == dfa.dead] = -1
    return delta, dfa.final[:-1] >= 0, pairs.fallback.copy()


SPACE_MARK = "\u2581".encode()  # ▁: a SentencePiece tokenizer writes it for a space, and reads it as one


@functools.lru_cache(maxsize=4)
def _sentencepiece_allowed(vocab: Vocabulary) -> Tuple[ByteDFA, str]:
    """For a SentencePiece vocabulary, the texts whose canonical tokenization relmql models:
    every character a unit of the vocabulary or ASCII (unless the others are byte-fallback chunks
    of their own, ``PairTable.fallback_splits``), no ▁ (the tokenizer reads it as a space: no
    token sequence is the tokenizer's own encoding of a text that holds it), and no added token
    that ``tag_tokens`` cannot read (special tokens are left to the tracker); and what the others
    contain, for a message."""
    from .charset import ALL
    from .primitives import bytes_fst, chars_fst, difference, optimize, sigma_star
    pairs = pair_table(vocab)
    known = chars_fst(ALL if pairs.fallback_splits else pairs.known()).closure()
    parts = [] if pairs.fallback_splits else ["characters this tokenizer spells with byte-fallback tokens"]
    words, ids = added_words(vocab)
    other = [w for w, i in zip(words, ids) if vocab.tokens[i] is not None]
    banned = [SPACE_MARK]
    if other and tag_tokens(vocab) is None:
        banned += other
        parts.append(f"its added tokens ({', '.join(w.decode('utf-8', 'replace') for w in other[:3])}, ...)")
    parts.append("the character \u2581 (U+2581), which the tokenizer reads as a space")
    inner = bytes_fst(banned[0])
    for t in banned[1:]:
        inner = inner.union(bytes_fst(t))
    bad = optimize(sigma_star().concat(inner).concat(sigma_star()), 1_000_000)
    known = difference(optimize(known, 1_000_000), bad)
    return to_dfa(optimize(known, 1_000_000)), " or ".join(parts)


@functools.lru_cache(maxsize=4)
def tag_tokens(vocab: Vocabulary) -> Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The added tokens (not special) that the tokenizer cuts out of the text before it
    pre-tokenizes and relmql reads as tokens of their own: their ids, their bytes as rows of a
    matrix, and their lengths. None where there are none, or where they are not modelled: their
    occurrences could overlap (``WordScanner.overlap``), they strip spaces or match only whole
    words, or a normalizer puts ▁ in front of the text (it does so again after each one)."""
    words, ids = added_words(vocab)
    spec = {a["id"]: a for a in vocab.spec.get("added_tokens", [])}
    tags = [(w, i) for w, i in zip(words, ids) if vocab.tokens[i] is not None]
    if not tags:
        return None
    runs = tuple(chr(c).encode("utf-8") for c, _ in family_of(vocab).chunk_runs(vocab))
    if (vocab.prepend or word_scanner(words + runs).overlap is not None
            or any(spec[i].get(k) for _, i in tags for k in ("lstrip", "rstrip", "single_word"))):
        return None
    width = max(len(w) for w, _ in tags)
    data = np.zeros((len(tags), width), np.int64)
    for k, (w, _) in enumerate(tags):
        data[k, :len(w)] = np.frombuffer(w, np.uint8)
    return (np.array([i for _, i in tags], np.int64), data, np.array([len(w) for w, _ in tags], np.int64))


def _holds_word(dfa: ByteDFA, scanner: np.ndarray, canonical: Tuple[bool, bool], phase: np.ndarray,
                budget: int = 2_000_000) -> Tuple[bool, bool]:
    """Whether some string of ``dfa`` holds a word of ``scanner`` (a ``WordScanner`` table,
    restarted at the split) inside a canonical region, and whether some string holds none there:
    breadth first over pairs (byte state, scanner state), until both are known (beyond
    ``budget`` pairs, a string with no word is assumed)."""
    nh = len(scanner)
    seen = {0}  # pair q * nh + h
    frontier = np.zeros(1, np.int64)
    found = other = False
    while len(frontier) and not (found and other):
        q, h = np.divmod(frontier, nh)
        other = other or bool((dfa.final[q] >= 0).any())
        nxt = []
        for lo in range(0, len(q), 4096):
            qs, hs = q[lo:lo + 4096], h[lo:lo + 4096]
            watch = np.array(canonical)[phase[qs]]
            q2 = dfa.delta[qs, :256].astype(np.int64)
            h2 = np.where(watch[:, None], scanner[hs], 0)
            live = q2 != dfa.dead
            found = found or bool((live & (h2 < 0)).any())
            ok = live & (h2 >= 0)
            nxt.append(q2[ok] * nh + h2[ok])
            split = dfa.delta[qs, SPLIT_COL].astype(np.int64)
            nxt.append(split[split != dfa.dead] * nh)
        cand = np.unique(np.concatenate(nxt))
        cand = cand[[c not in seen for c in cand.tolist()]]
        seen.update(cand.tolist())
        frontier = cand
        if len(seen) > budget:
            return found, True
    return found, other


@functools.lru_cache(maxsize=8)
def pair_table(vocab: Vocabulary):
    from .tokenizers.bpe import PairTable
    return PairTable(vocab)


def phases(dfa: ByteDFA) -> np.ndarray:
    """0 for states before the split, 1 after."""
    n = dfa.num_states
    phase = np.ones(n + 1, np.int8)
    seen = np.zeros(n + 1, bool)
    seen[0] = True
    frontier = np.array([0])
    while len(frontier):
        phase[frontier] = 0
        nxt = np.unique(dfa.delta[frontier, :256])
        nxt = nxt[(nxt != dfa.dead) & ~seen[nxt]]
        seen[nxt] = True
        frontier = nxt
    return phase


def _absorb_leading(dfa: ByteDFA, prepend: bytes) -> ByteDFA:
    """For a tokenizer that puts ``prepend`` (one byte) in front of a text unless the text starts
    with it (``Metaspace``): the texts that, after ``_with_prepend``, spell what the tokenizer
    reads. A text that starts with ``prepend`` loses it (the tokenizer reads " Hello" as it reads
    "Hello"); a text starts before the prefix, or after the split when the prefix is empty (a
    prefix that is ``prepend`` alone becomes an empty one).

    A subset construction over items: an old state q, or ~q, q at a text's start, which does
    not read ``prepend`` (an item beside it reads the text after it). Sets of one old state are
    that state; the few others are new states."""
    if len(prepend) != 1:
        raise ModelError("relmql models a prepended text of one byte only")
    p, n, dead, cols = prepend[0], dfa.num_states, dfa.dead, dfa.delta.shape[1]
    old = dfa.delta.astype(np.int64)
    s1 = int(old[0, SPLIT_COL])
    ids: Dict[FrozenSet[int], int] = {}
    sets: List[FrozenSet[int]] = []

    def state(items) -> int:
        items = frozenset(i for i in items if i != dead and i != ~dead)
        if not items:
            return dead
        if len(items) == 1 and min(items) >= 0:
            return min(items)
        if items not in ids:
            if len(sets) > n:
                raise CompileError("the automaton is too large for this tokenizer's leading space",
                                   hint="use a narrower pattern, or raise max_states")
            ids[items] = n + 1 + len(sets)
            sets.append(items)
        return ids[items]

    def after(item: int, c: int) -> Tuple[int, ...]:
        if item >= 0:
            return (int(old[item, c]),)
        q = ~item
        if c == p:
            return ()
        if c == SPLIT_COL and q == 0 and s1 != dead:
            return (~s1, int(old[s1, p]))
        return (int(old[q, c]),)

    start = state([~0, int(old[0, p])])
    rows = []
    while len(rows) < len(sets):
        items = sets[len(rows)]
        rows.append([state(x for i in items for x in after(i, c)) for c in range(cols)])
    total = n + 1 + len(sets)  # old states, the old dead row, the new states; a new dead row last
    delta = np.vstack([old, np.array(rows, np.int64).reshape(len(sets), cols), np.full((1, cols), dead)])
    delta[delta == dead] = total
    ends = [[int(dfa.final[i if i >= 0 else ~i]) for i in items] for items in sets]
    fewest = [min([e for e in es if e >= 0], default=-1) for es in ends]  # the fewest edits
    final = np.concatenate([dfa.final, np.array(fewest, np.int16), [np.int16(-1)]]).astype(np.int16)
    order = np.array([start] + [i for i in range(total) if i != start], np.int64)
    remap = np.empty(total + 1, np.int64)
    remap[order] = np.arange(total)
    remap[total] = total
    return trim(ByteDFA(remap[delta[np.append(order, total)]].astype(np.int32), final[np.append(order, total)]))


def _with_prepend(dfa: ByteDFA, prepend: bytes) -> ByteDFA:
    """The language with ``prepend`` in front of the text, inside whichever region the text
    starts in: before the prefix, or right after the split when the prefix is empty; the empty
    text stays empty (tokenizers put nothing in front of it)."""
    n, k = dfa.num_states, len(prepend)
    cols = dfa.delta.shape[1]
    # layout: new start 0; old states 1..n; a copy of the old start without its split (n+1);
    # chains for the prepend before the prefix (A) and after the split (B); dead last
    start_copy = n + 1
    chain_a = list(range(n + 2, n + 2 + k - 1))
    chain_b = list(range(n + 1 + k, n + 1 + 2 * k))
    total = n + 1 + 2 * k
    dead = total
    delta = np.full((total + 1, cols), dead, np.int32)
    old = dfa.delta[:n].astype(np.int64)
    delta[1:n + 1] = np.where(old == dfa.dead, dead, old + 1)
    delta[start_copy] = delta[1]
    delta[start_copy, SPLIT_COL] = dead
    a_path = [0] + chain_a + [start_copy]
    for i, b in enumerate(prepend):
        delta[a_path[i], b] = a_path[i + 1]
    after_split = int(dfa.delta[0, SPLIT_COL])
    if after_split != dfa.dead:
        delta[0, SPLIT_COL] = chain_b[0]
        b_path = chain_b + [after_split + 1]
        for i, b in enumerate(prepend):
            delta[b_path[i], b] = b_path[i + 1]
    final = np.full(total + 1, -1, np.int16)
    final[1:n + 1] = dfa.final[:n]
    if after_split != dfa.dead:
        final[chain_b[0]] = dfa.final[after_split]  # the empty text: nothing is put in front of it
    return trim(ByteDFA(delta, final))
