"""How relmql reproduces a tokenizer's own segmentation exactly, for canonical tokenization: the
split-regex parser (``split``), chunk rules (``rules``), character classes (``classes``), the
streaming tracker (``tracker``), BPE's pair rule (``bpe``) and the tokenizer families as classes
(``families``). Design: docs/tokenizers.md."""

from __future__ import annotations

from .bpe import PairTable
from .classes import WordScanner, word_scanner
from .families import FAMILIES, ByteLevelFamily, SentencePieceFamily, added_runs, added_words, family_of, rules_for
from .rules import GPT2_PATTERN, ChunkRules
from .split import gpt2_rules, split_rules
from .tracker import REJECT, Tracker, tracker_for

__all__ = ["FAMILIES", "GPT2_PATTERN", "REJECT", "ByteLevelFamily", "ChunkRules", "PairTable", "SentencePieceFamily",
           "Tracker", "WordScanner", "added_runs", "added_words", "family_of", "gpt2_rules", "rules_for",
           "split_rules", "tracker_for", "word_scanner"]
