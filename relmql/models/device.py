"""Where a model runs and in which dtype: the names of the ``device`` and ``dtype`` options → torch's,
and whether a model so loaded computes exact probabilities. Every backend loads through these."""

from __future__ import annotations

from typing import Optional

import torch

from ..errors import ModelError

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# how far the reduced dtypes move a log-probability, measured by benchmarks/precision_bench.py
PRECISION = {"bfloat16": "log-probabilities off by 0.03 per token typically, up to 1.8",
             "float16": "log-probabilities off by 0.003 per token typically, up to 0.04"}


def resolve_device(device: Optional[str]) -> torch.device:
    """``None``/"auto" → cuda when available, else cpu; anything else as given."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ModelError(f"unknown device {device!r} (use cpu, cuda or cuda:N)") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device {device!r}: torch sees no CUDA GPU on this machine")
    return dev


def resolve_dtype(dtype: Optional[str], device: torch.device) -> torch.dtype:
    """``None``/"float32" → float32, the exact default; "auto" → the fastest dtype the hardware
    runs natively (bfloat16 on CUDA or on a CPU with native bf16 support, else float32), an
    explicit opt-in whose numbers are approximate."""
    if dtype is None:
        return torch.float32
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16
        cap = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else ""
        return torch.bfloat16 if cap in ("AVX512", "AVX512_BF16", "AMX", "SVE256") else torch.float32
    if dtype not in TORCH_DTYPES:
        raise ModelError(f"unknown dtype {dtype!r} (use {', '.join(TORCH_DTYPES)} or auto)")
    return TORCH_DTYPES[dtype]


def approximate(dtype: Optional[str], device: Optional[str]) -> Optional[str]:
    """Why a model loaded with these settings gives approximate probabilities, or None when it
    computes them as direct float32 scoring with transformers does."""
    if dtype in (None, "float32"):
        dt = torch.float32
    elif dtype == "auto":
        cuda = device not in (None, "cpu") and str(device).startswith(("cuda", "auto")) and torch.cuda.is_available()
        dt = resolve_dtype("auto", torch.device("cuda" if cuda else "cpu"))
    else:
        dt = TORCH_DTYPES.get(dtype, torch.float32)
    if dt != torch.float32:
        name = str(dt).replace("torch.", "")
        return (f"approximate: the model computes in {name} ({PRECISION[name]} of float32 "
                f"scoring; see docs/models.md); dtype float32 gives exact numbers")
    if str(device or "cpu").startswith(("cuda", "auto")) and torch.get_float32_matmul_precision() != "highest":
        return ("approximate: float32 matrix products run in TF32 on this GPU "
                "(torch.set_float32_matmul_precision('highest') gives exact numbers)")
    return None
