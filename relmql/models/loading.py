"""Loading a transformers model: from a local folder or a Hugging Face hub id (``from_pretrained``:
the device and dtype chosen, the files checked), and wrapping a loaded one as a
``TransformersModel`` checked by the load-time probes (``wrap``)."""

from __future__ import annotations

import os
from typing import List, Optional

from ..errors import ModelError
from .device import resolve_device, resolve_dtype
from .hf import DEFAULT_KV_BUDGET, TransformersModel
from .probes import probe


def wrap(model, tokenizer, name: str, bos_id: Optional[int] = None, eos_id: Optional[int] = None,
         kv_budget: int = DEFAULT_KV_BUDGET) -> TransformersModel:
    """A transformers causal LM and its fast tokenizer as a ``TransformersModel``, its ways of
    reading checked (``probes.probe``)."""
    lm = TransformersModel(model, tokenizer, name, bos_id=bos_id, eos_id=eos_id, kv_budget=kv_budget)
    probe(lm)
    return lm


def from_pretrained(path: str, device: Optional[str] = None, dtype: Optional[str] = None,
                    name: Optional[str] = None, **kwargs) -> TransformersModel:
    """Load a model from a local directory or (where the user has network or a cache) the hub."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    local = os.path.isdir(path)
    if local:
        missing = missing_model_files(path)
        if missing:
            listed = ", no ".join(missing[:-1]) + (" and no " if len(missing) > 1 else "") + missing[-1]
            raise ModelError(f"could not load model {path!r}: the folder has no {listed}",
                             hint="a model folder is what transformers' save_pretrained writes "
                                  "(model and tokenizer)")
    elif not _hub_reachable():
        kwargs.setdefault("local_files_only", True)  # no network: only the local cache
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dt, **kwargs)
    except (OSError, ValueError, KeyError) as e:
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        if local:
            raise ModelError(f"could not load model {path!r}: transformers cannot read the folder "
                             f"({why})") from None
        raise ModelError(f"could not load model {path!r}: it is neither a local folder nor a model in the Hugging "
                         f"Face cache ({why})", hint="downloading from the hub needs network access") from None
    return wrap(model.to(dev), tokenizer, name or path)


def missing_model_files(path: str) -> List[str]:
    """What a transformers model folder lacks: its config, weights or tokenizer files."""
    names = set(os.listdir(path))
    missing = []
    if "config.json" not in names:
        missing.append("config.json")
    if not any(n.endswith((".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")) for n in names):
        missing.append("weights (model.safetensors or pytorch_model.bin)")
    if not names & {"tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tokenizer_config.json"}:
        missing.append("tokenizer (tokenizer.json or tokenizer.model)")
    return missing


def _hub_reachable(timeout: float = 2.0) -> bool:
    """Whether the Hugging Face hub answers at all (so a missing model fails fast offline)."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    import socket
    from urllib.parse import urlparse
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False
