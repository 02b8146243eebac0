"""Tokenizer families as classes: what differs between byte-level BPE and SentencePiece-style
tokenizers when relmql reproduces their segmentation (chunk rules, the symbols BPE starts from,
the added tokens cut out first). A new family is one class here, on its ``Spelling`` in
``models.vocab``. Design: docs/tokenizers.md."""

from __future__ import annotations

import functools
import json
from typing import Dict, List, Optional, Protocol, Tuple, Union

import numpy as np

from ...errors import ModelError
from ...models.vocab import ByteLevelSpelling, SentencePieceSpelling, Vocabulary, bytes_to_unicode
from ..charset import CodepointSet
from .rules import GPT2_PATTERN, ChunkRules, run_rules, whole_text_rules, with_words
from .split import split_rules

Runs = Tuple[Tuple[int, int], ...]  # ((code point, longest run), ...)


def added_runs(vocab: Vocabulary) -> Tuple[Runs, Tuple[str, ...]]:
    """The tokenizer's added (non-special) tokens that split text before BPE: runs of one
    character (``\\n``, ``\\n\\n``, ... as ``(code point, longest)``) and the other strings."""
    texts = {a["content"] for a in vocab.spec.get("added_tokens", []) if not a.get("special") and a["content"]}
    runs, other = [], set(texts)
    for c in sorted({t[0] for t in texts if len(set(t)) == 1}):
        k = 0
        while c * (k + 1) in texts:
            k += 1
        if k:
            runs.append((ord(c), k))
            other -= {c * j for j in range(1, k + 1)}
    return tuple(runs), tuple(sorted(other))


def added_words(vocab: Vocabulary) -> Tuple[Tuple[bytes, ...], Tuple[int, ...]]:
    """The texts (UTF-8) and ids of the added and special tokens the tokenizer cuts out of the
    text before it pre-tokenizes, but for the runs of one character its chunk rules model
    (``chunk_runs``)."""
    runs = {chr(c) * k for c, most in family_of(vocab).chunk_runs(vocab) for k in range(1, most + 1)}
    pairs = sorted((a["content"].encode("utf-8"), a["id"]) for a in vocab.spec.get("added_tokens", [])
                   if a["content"] and a["content"] not in runs)
    return tuple(w for w, _ in pairs), tuple(i for _, i in pairs)


class TokenizerFamily(Protocol):
    """What a tokenizer family offers beside its ``Spelling``: each family below is one class."""

    kind: str  # ``Vocabulary.kind`` of its vocabularies
    models_every_text: bool  # False: canonical tokenization leaves some texts out (``_canonical_part``)

    def chunk_rules(self, vocab: Vocabulary) -> ChunkRules:
        """Its pre-tokenizer as chunking rules (without the added words), or ModelError."""

    def chunk_runs(self, vocab: Vocabulary) -> Runs:
        """The runs of one character its chunk rules cut out as chunks (not words)."""

    def bpe_symbols(self, piece_id: Dict[str, int], model: dict) -> Union[ByteSymbols, CharSymbols]:
        """The symbols BPE starts from (``units(data)``), for ``bpe.PairTable``."""


class ByteSymbols:
    """BPE that starts from bytes: each byte is the piece of its byte-level symbol."""

    fallback = None  # no byte-fallback pieces

    def __init__(self, piece_id: Dict[str, int]):
        b2u = bytes_to_unicode()
        self.unit = np.array([piece_id.get(b2u[b], -1) for b in range(256)], np.int64)  # byte -> piece

    def units(self, data: bytes) -> Optional[List[int]]:
        """The symbols BPE starts from for ``data`` (-1 where a byte has none)."""
        return [int(self.unit[b]) for b in data]

    def edge_extras(self, merges: dict, piece_id: Dict[str, int]) -> Dict[str, np.ndarray]:
        """What the pair table's cached arrays hold for this kind of symbols besides the chains."""
        return {}


class CharSymbols:
    """BPE that starts from characters: a character is a unit when the vocabulary has it (▁ for
    space); one it lacks is its bytes' byte-fallback pieces ``<0xNN>``."""

    def __init__(self, piece_id: Dict[str, int], model: dict):
        self.char_unit: Dict[str, int] = {k: v for k, v in piece_id.items() if len(k) == 1 and k != " "}
        if "\u2581" in self.char_unit:
            self.char_unit[" "] = self.char_unit.pop("\u2581")
        fallback = model.get("byte_fallback")
        self.fallback = np.array([piece_id.get(f"<0x{b:02X}>", -1) if fallback else -1 for b in range(256)],
                                 np.int64)  # byte -> its byte-fallback piece (-1: none)

    def units(self, data: bytes) -> Optional[List[int]]:
        """The symbols BPE starts from for ``data`` (None where it is not UTF-8, -1 where a byte
        has no fallback piece)."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        syms = []
        for c in text:
            u = self.char_unit.get(c)
            if u is not None:
                syms.append(u)
            else:
                syms.extend(int(self.fallback[b]) for b in c.encode("utf-8"))
        return syms

    def edge_extras(self, merges: dict, piece_id: Dict[str, int]) -> Dict[str, np.ndarray]:
        """``fallback_splits`` (``PairTable.fallback_splits``), kept with the pair table's arrays."""
        return {"fallback_splits": np.array(self._fallback_splits(merges, piece_id))}

    def _fallback_splits(self, merges: dict, piece_id: Dict[str, int]) -> bool:
        """Whether a character the vocabulary lacks (above ASCII) is a hard boundary spelt only by
        its bytes' fallback tokens: every byte has one, no merge involves one (so BPE never merges
        across it), and no token holds a character that is not a unit (so no other token spells
        it)."""
        high = set(self.fallback[0x80:].tolist())
        if -1 in high:
            return False
        if any(ia in high or ib in high for ia, ib in merges):
            return False
        return all(len(k) == 1 or all(c in self.char_unit or c == "\u2581" for c in k)
                   for k, v in piece_id.items() if v not in high)

    def known(self) -> CodepointSet:
        """The characters the vocabulary has as units, and every ASCII character (the rest are
        spelt with several byte-fallback tokens)."""
        cps = {ord(c) for c in self.char_unit} | set(range(0x80))
        return CodepointSet((c, c) for c in sorted(cps))


class ByteLevelFamily(ByteLevelSpelling):
    """Byte-level BPE (GPT-2, SmolLM2, Llama 3, Qwen2): a split regex cuts the text into chunks,
    BPE starts from bytes."""

    models_every_text = True  # canonical tokenization models every text of the vocabulary

    def chunk_rules(self, vocab: Vocabulary) -> ChunkRules:
        """The split regex of its pre-tokenizer (``ByteLevel``'s own is GPT-2's), or ModelError."""
        if vocab.spec.get("normalizer"):
            raise ModelError("canonical tokenization is not supported for tokenizers with a normalizer "
                             f"({json.dumps(vocab.spec['normalizer'])[:80]})")
        pre = vocab.spec.get("pre_tokenizer")
        steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else ([pre] if pre else [])
        splits = []
        for step in steps:
            kind = step.get("type")
            if kind == "ByteLevel":
                if step.get("add_prefix_space"):
                    raise ModelError("canonical tokenization does not support ByteLevel(add_prefix_space=True)")
                if step.get("use_regex", True):
                    splits.append((step, GPT2_PATTERN))  # ByteLevel's own regex is GPT-2's
            elif kind == "Split" and "Regex" in step.get("pattern", {}) \
                    and step.get("behavior") == "Isolated" and not step.get("invert"):
                splits.append((step, step["pattern"]["Regex"]))
            else:
                raise ModelError(f"canonical tokenization does not support the pre-tokenizer {json.dumps(step)[:120]}")
        if not splits:
            return whole_text_rules()
        if len(splits) > 1:
            raise ModelError("canonical tokenization does not support several splitting pre-tokenizers "
                             f"({', '.join(json.dumps(step)[:80] for step, _ in splits)})")
        step, pattern = splits[0]
        try:
            return split_rules(pattern)
        except ModelError as e:
            raise ModelError(f"{e.message} (the pre-tokenizer {json.dumps(step)[:160]})") from None

    def chunk_runs(self, vocab: Vocabulary) -> Runs:
        """The runs of one character its chunk rules cut out as chunks: none."""
        return ()

    def bpe_symbols(self, piece_id: Dict[str, int], model: dict) -> ByteSymbols:
        """The symbols BPE starts from: bytes."""
        return ByteSymbols(piece_id)


_SP_NORMALIZERS = (  # what a SentencePiece-style tokenizer's normalizer may do: space → ▁, a ▁ in front
    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"},
    {"type": "Prepend", "prepend": "\u2581"},
)


class SentencePieceFamily(SentencePieceSpelling):
    """SentencePiece-style BPE (Gemma, Llama 2, Mistral): the whole text is one chunk but for the
    added tokens, BPE starts from characters with byte fallback."""

    models_every_text = False  # canonical tokenization leaves some texts out (fitting._canonical_part)

    def chunk_rules(self, vocab: Vocabulary) -> ChunkRules:
        """The normalizer or a ``Metaspace`` pre-tokenizer turns spaces into ▁ (and may put one
        in front, ``Vocabulary.prepend``); the whole text is one BPE chunk but for the added
        tokens, which are cut out first. ModelError for other normalizers and pre-tokenizers."""
        norm = vocab.spec.get("normalizer")
        steps = norm.get("normalizers", []) if norm and norm.get("type") == "Sequence" else ([norm] if norm else [])
        for step in steps:
            if step not in _SP_NORMALIZERS:
                raise ModelError(f"canonical tokenization does not support the normalizer {json.dumps(step)[:120]}")
        pre = vocab.spec.get("pre_tokenizer")
        # Gemma's Split on " " runs after the normalizer has turned every space into ▁: it never splits
        noop_split = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False}
        # Llama-2 and Mistral as transformers converts them: Metaspace turns spaces into ▁ and puts
        # one in front of the text unless it starts with one (Vocabulary.prepend_unless_there)
        metaspace = (pre or {}).get("type") == "Metaspace" and pre.get("replacement") == "\u2581" \
            and not pre.get("split", True) and not steps
        if pre and not (pre == noop_split and _SP_NORMALIZERS[0] in steps) and not metaspace:
            raise ModelError(f"canonical tokenization does not support the pre-tokenizer {json.dumps(pre)[:120]}")
        return run_rules(self.chunk_runs(vocab))

    def chunk_runs(self, vocab: Vocabulary) -> Runs:
        """The runs of one character its chunk rules cut out as chunks: its added tokens ``c``,
        ``cc``, ... (``added_runs``)."""
        return added_runs(vocab)[0]

    def bpe_symbols(self, piece_id: Dict[str, int], model: dict) -> CharSymbols:
        """The symbols BPE starts from: characters, with byte fallback."""
        return CharSymbols(piece_id, model)


FAMILIES = {f.kind: f for f in (ByteLevelFamily(), SentencePieceFamily())}  # by ``Vocabulary.kind``


def family_of(vocab: Vocabulary) -> TokenizerFamily:
    """The tokenizer family of ``vocab`` (by ``Vocabulary.kind``); ModelError for a kind with none."""
    family = FAMILIES.get(vocab.kind)
    if family is None:
        raise ModelError(f"relmql has no tokenizer family {vocab.kind!r}")
    return family


@functools.lru_cache(maxsize=8)
def rules_for(vocab: Vocabulary) -> ChunkRules:
    """The chunking rules of ``vocab``'s tokenizer, or ModelError when relmql cannot model them:
    its pre-tokenizer, and the texts of its added and special tokens as ``words`` (cut out of the
    text first, so never inside a chunk)."""
    return with_words(family_of(vocab).chunk_rules(vocab), added_words(vocab)[0])
