"""The vocabulary of a model as exact byte strings, read from a Hugging Face tokenizer."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from ..errors import ModelError

BYTE_LEVEL = "byte-level"      # GPT-2, SmolLM2, Llama-3: every token is a string of byte-level symbols
SENTENCEPIECE = "sentencepiece"  # Llama-2 style: "▁" for space, "<0xNN>" byte-fallback tokens

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_U2B = {u: b for b, u in bytes_to_unicode().items()}


@dataclass
class Vocabulary:
    """Token ids ↔ the exact bytes each token stands for.

    ``tokens[i]`` is the byte string of token ``i``, or None for special tokens (end of text,
    chat markers) and ids the tokenizer does not define; such tokens never spell text.
    ``prepend`` is what the tokenizer puts in front of every text before splitting it into
    tokens (a space for SentencePiece-style tokenizers), so token sequences spell
    ``prepend + text``; with ``prepend_unless_there`` (a ``Metaspace`` pre-tokenizer) it does so
    only when the text does not start with it already.
    """

    tokens: List[Optional[bytes]]
    kind: str
    eos_id: Optional[int]
    bos_id: Optional[int]
    prepend: bytes = b""
    tokenizer: Any = field(default=None, repr=False, compare=False)
    spec: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    prepend_unless_there: bool = False

    def __len__(self) -> int:
        return len(self.tokens)

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __eq__(self, other) -> bool:
        return isinstance(other, Vocabulary) and self.fingerprint == other.fingerprint

    @property
    def fingerprint(self) -> str:
        """A stable hash of the vocabulary and tokenizer rules (for caches)."""
        fp = self.__dict__.get("_fingerprint")
        if fp is None:
            h = hashlib.sha256()
            h.update(self.kind.encode() + self.prepend + bytes([self.prepend_unless_there]))
            for t in self.tokens:
                h.update(b"\xff" if t is None else len(t).to_bytes(2, "little") + t)
            model = {k: v for k, v in self.spec.get("model", {}).items() if k != "vocab"}
            for part in (self.spec.get("pre_tokenizer"), self.spec.get("normalizer"), model):
                h.update(json.dumps(part, sort_keys=True).encode())
            fp = self.__dict__["_fingerprint"] = h.hexdigest()[:16]
        return fp

    def token_bytes(self, ids: Sequence[int]) -> bytes:
        """The bytes a token sequence spells (special tokens contribute nothing)."""
        return b"".join(self.tokens[i] or b"" for i in ids)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of a token sequence, without what the tokenizer prepends. Where it prepends
        only to a text that lacks it (``prepend_unless_there``), " x" and "x" are both read as
        " x": that decodes to "x", as the tokenizer's own decoder has it, while "  x" decodes to
        itself (no text that lacks the space becomes it)."""
        data = self.token_bytes(ids)
        k = len(self.prepend)
        if k and data.startswith(self.prepend) and not (
                self.prepend_unless_there and (len(data) == k or data[k:].startswith(self.prepend))):
            data = data[k:]
        return data.decode("utf-8", errors="replace")

    def encode(self, text: str) -> List[int]:
        """The tokenizer's own (canonical) tokenization of ``text``, without special tokens."""
        backend = self._direct_backend
        if backend is not None:
            return backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    @property
    def _direct_backend(self):
        """The tokenizer's Rust backend where transformers' ``encode`` would only hand it the text
        (a fast tokenizer whose class keeps transformers' own ``encode``, with no truncation or
        padding set and special tokens split or not as the tokenizer has them): the same ids in
        half the time or less. None otherwise."""
        if "_backend" not in self.__dict__:
            tok, backend = self.tokenizer, getattr(self.tokenizer, "backend_tokenizer", None)
            direct = backend is not None and all(
                getattr(next((c for c in type(tok).__mro__ if name in c.__dict__), None), "__module__", "") == home
                for name, home in (("encode", "transformers.tokenization_utils_base"),
                                   ("_encode_plus", "transformers.tokenization_utils_tokenizers")))
            direct = direct and backend.truncation is None and backend.padding is None and (
                backend.encode_special_tokens == bool(getattr(tok, "split_special_tokens", False)))
            self.__dict__["_backend"] = backend if direct else None
        return self.__dict__["_backend"]

    def describe(self, token_id: int) -> str:
        t = self.tokens[token_id] if 0 <= token_id < len(self.tokens) else None
        return f"{token_id}:{t!r}" if t is not None else f"{token_id}:<special>"


def from_tokenizer(tokenizer, model_vocab_size: Optional[int] = None, eos_id: Optional[int] = None,
                   bos_id: Optional[int] = None) -> Vocabulary:
    """Read a ``Vocabulary`` from a transformers tokenizer backed by a ``tokenizers`` model.

    Handles byte-level BPE (GPT-2 style) and SentencePiece-style vocabularies with ``▁`` for
    space and ``<0xNN>`` byte-fallback tokens. ``model_vocab_size`` pads the table to the
    model's logit width (ids past the tokenizer's vocabulary are never text).
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ModelError(f"tokenizer {type(tokenizer).__name__} has no fast (tokenizers) backend; "
                         "relmql needs it to read the exact bytes of every token")
    spec = json.loads(backend.to_str())
    model = spec["model"]
    if model.get("type") not in ("BPE", "Unigram", "WordLevel"):
        raise ModelError(f"unsupported tokenizer model type {model.get('type')!r} "
                         "(relmql reads BPE and Unigram vocabularies)")
    if model["type"] == "Unigram":
        pieces = {p[0]: i for i, p in enumerate(model["vocab"])}
    else:
        pieces = dict(model["vocab"])
    special = {a["id"] for a in spec.get("added_tokens", []) if a.get("special")}
    added = {a["id"]: a["content"] for a in spec.get("added_tokens", []) if not a.get("special")}
    spelling = spelling_of(spec)
    size = max([*pieces.values(), *special, *added, -1]) + 1
    if model_vocab_size is not None:
        size = max(size, model_vocab_size)
    tokens: List[Optional[bytes]] = [None] * size
    for piece, i in pieces.items():
        if i in special:
            continue
        tokens[i] = spelling.piece_bytes(piece, model) or None  # an empty token spells nothing
    for i, content in added.items():
        tokens[i] = content.encode("utf-8") or None
    prepend = spelling.prepend(spec)
    # Prepend (a normalizer) always puts it in front; Metaspace only where the text lacks it
    unless_there = bool(prepend) and '"Prepend"' not in json.dumps(spec.get("normalizer"))
    if eos_id is None:
        eos_id = tokenizer.eos_token_id
    if bos_id is None:
        bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos_id
    return Vocabulary(tokens, spelling.kind, eos_id, bos_id, prepend, tokenizer, spec, unless_there)


class Spelling:
    """How a family of tokenizers spells text: which tokenizers it holds, the bytes each piece of
    its vocabulary stands for, and what it puts in front of a text. The vocabulary's half of a
    tokenizer family; ``automata.tokenizers.families`` extends each with how the family segments
    text (docs/tokenizers.md)."""

    kind = ""  # ``Vocabulary.kind`` of the family's vocabularies

    def holds(self, spec: dict) -> bool:
        """Whether the tokenizer of this ``tokenizer.json`` is of the family."""
        raise NotImplementedError

    def piece_bytes(self, piece: str, model: dict) -> Optional[bytes]:
        """The bytes a piece of the tokenizer's model vocabulary stands for."""
        raise NotImplementedError

    def prepend(self, spec: dict) -> bytes:
        """What the tokenizer puts in front of every text (``Vocabulary.prepend``)."""
        return b""


class ByteLevelSpelling(Spelling):
    """Byte-level BPE (GPT-2, SmolLM2, Llama 3): every piece is a string of byte-level symbols."""

    kind = BYTE_LEVEL

    def holds(self, spec: dict) -> bool:
        return '"ByteLevel"' in json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])

    def piece_bytes(self, piece: str, model: dict) -> Optional[bytes]:
        try:
            return bytes(_U2B[c] for c in piece)
        except KeyError:
            return piece.encode("utf-8")


class SentencePieceSpelling(Spelling):
    """SentencePiece-style (Llama 2, Mistral, Gemma): ▁ for space, ``<0xNN>`` byte-fallback pieces,
    and often a space in front of the text."""

    kind = SENTENCEPIECE

    def holds(self, spec: dict) -> bool:
        text = json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
        if "\u2581" in text or "Metaspace" in text or "ByteFallback" in text or spec["model"].get("byte_fallback"):
            return True
        return spec["model"]["type"] == "Unigram"

    def piece_bytes(self, piece: str, model: dict) -> Optional[bytes]:
        m = _BYTE_FALLBACK.match(piece)
        if m and (model.get("byte_fallback") or model["type"] == "Unigram"):
            return bytes([int(m.group(1), 16)])
        return piece.replace("\u2581", " ").encode("utf-8")

    def prepend(self, spec: dict) -> bytes:
        text = json.dumps([spec.get("normalizer"), spec.get("pre_tokenizer")])
        if '"Prepend"' in text:
            return b" "
        if "Metaspace" in text and '"prepend_scheme": "never"' not in text and '"add_prefix_space": false' not in text:
            return b" "
        return b""


SPELLINGS = (ByteLevelSpelling(), SentencePieceSpelling())  # in the order they are asked ``holds``


def spelling_of(spec: dict) -> Spelling:
    """The family of the tokenizer of this ``tokenizer.json``: the first that holds it."""
    for spelling in SPELLINGS:
        if spelling.holds(spec):
            return spelling
    raise ModelError("unsupported tokenizer: relmql reads byte-level BPE (GPT-2 style) and "
                     "SentencePiece-style vocabularies")
