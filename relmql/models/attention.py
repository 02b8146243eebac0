"""What the transformers backend hands a model's attention layers: caches whose keys and values are
laid out ahead of a call (``preloaded_cache``), the staging buffer they are laid out in (``Stage``),
the masks of each kind of layer, and on CPU grouped-query attention over shared key/value heads
(``use_grouped_attention``) (docs/models.md, *Inside the model backend*)."""

from __future__ import annotations

import weakref
from typing import List, Optional, Sequence

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer

ATTENTION_NAME = "relmql_sdpa"


class _Preloaded(DynamicLayer):
    """One layer's past keys and values in buffers ``[batch, kv_heads, filled + new, head_dim]``
    whose first ``filled`` positions are set: ``update`` writes the call's new keys and values
    after them and returns views of the whole (one forward pass; a second update concatenates)."""

    is_croppable = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int):
        super().__init__()
        self._k, self._v, self._filled = keys, values, filled
        self.keys, self.values = keys[:, :, :filled], values[:, :, :filled]
        self.device = keys.device
        self.is_initialized = True
        self.in_place = False  # whether the last update wrote into the buffers

    def update(self, key_states, value_states, *args, **kwargs):
        end = self._filled + key_states.shape[-2]
        if end > self._k.shape[-2] or self.keys.shape[-2] != self._filled:
            self.keys = torch.cat([self.keys, key_states], dim=-2)
            self.values = torch.cat([self.values, value_states], dim=-2)
            self.in_place = False
        else:
            self._k[:, :, self._filled:end] = key_states
            self._v[:, :, self._filled:end] = value_states
            self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
            self.in_place = True
        return self.keys, self.values


def wrote_in_place(cache) -> bool:
    """Whether a forward pass over ``preloaded_cache`` left every layer's new keys and values in
    the buffers it was given (then they are read there, not copied out layer by layer)."""
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(isinstance(layer, _Preloaded) and layer.in_place for layer in layers)


def preloaded_cache(layers: Sequence[tuple], filled: int):
    """A transformers cache over ``layers`` ((keys, values) buffers per layer, the first
    ``filled`` positions set); the new tokens' keys and values land in the rest."""
    from transformers import DynamicCache
    cache = DynamicCache()
    cache.layer_class_to_replicate = None
    cache.layers = [_Preloaded(k, v, filled) for k, v in layers]
    return cache


def full_cache(layers=None):
    """A transformers ``DynamicCache`` holding ``layers`` ((keys, values) per layer), built
    without the model's config: every layer then keeps all its keys (Gemma 3's sliding-window
    layers would drop those outside the window, and the new tokens' keys would be misread); the
    attention mask keeps each layer's window."""
    from transformers import DynamicCache
    return DynamicCache(ddp_cache_data=layers) if layers else DynamicCache()


def cache_tensors(cache):
    """[(keys, values)] per layer from a transformers cache object."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return [(k, v) for k, v in cache]  # pragma: no cover - legacy tuple caches


def mask_kinds(config) -> List[tuple]:
    """The attention masks a model's layers take, as (name, sliding window or None): one mask
    (name None) for most models; Gemma 3's full and sliding-window layers take one each."""
    window = getattr(config, "sliding_window", None)
    types = set(getattr(config, "layer_types", None) or ())
    if "sliding_attention" in types:
        return [("full_attention", None), ("sliding_attention", window)]
    return [(None, window if window and getattr(config, "use_sliding_window", True) else None)]


class Stage:
    """One buffer ``[2 * layers, kv_heads, capacity, head_dim]`` into which a call's pasts are
    gathered from the pool: a tree pass's ancestor blocks in order, where blocks that begin the
    next call's list in the same places are not gathered again (a LAMBADA passage or a long
    PREFIX is copied once, not once per call), or a padded pass's rows (``gather``). Kept from
    call to call: a fresh buffer of that size each call is fresh pages from the kernel."""

    def __init__(self):
        self.buffer: Optional[torch.Tensor] = None
        self._placed: List[weakref.ref] = []  # the blocks now at the buffer's start, in order
        self.copied = 0  # positions the last lay_out copied

    @property
    def nbytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel() * self.buffer.element_size()

    def clear(self) -> None:
        self.buffer, self._placed = None, []

    def _fit(self, pool, need: int) -> None:
        """A buffer shaped for ``pool`` with room for ``need`` positions (what it held is lost
        when it is replaced)."""
        ref = pool.data
        if self.buffer is None or self.buffer.shape[2] < need or self.buffer.shape[:2] != ref.shape[:2] \
                or self.buffer.dtype != ref.dtype or self.buffer.device != ref.device:
            capacity = max(need + need // 4, 256)
            self.buffer = ref.new_empty(ref.shape[:2] + (capacity,) + ref.shape[3:])
            self._placed = []

    def lay_out(self, blocks: Sequence, room: int, pool) -> torch.Tensor:
        """The buffer with ``blocks``' keys and values at its start, one after another, and at
        least ``room`` free positions after them."""
        total = sum(b.n for b in blocks)
        self._fit(pool, total + room)
        kept = 0
        for old, blk in zip(self._placed, blocks):
            if old() is not blk:
                break
            kept += 1
        at = sum(b.n for b in blocks[:kept])
        self._placed = self._placed[:kept]  # what an interrupted copy leaves is not trusted
        self.copied = total - at
        if kept < len(blocks):
            self.buffer[:, :, at:total] = pool.read(np.concatenate([b.slots for b in blocks[kept:]]))
        self._placed = [weakref.ref(b) for b in blocks]
        return self.buffer

    def gather(self, slots: np.ndarray, pool) -> torch.Tensor:
        """The keys and values at ``slots``, one after another, as ``[2 * layers, kv_heads,
        len(slots), head_dim]`` in the buffer's memory (what was laid out there is forgotten)."""
        d = pool.data
        self._fit(pool, len(slots))
        self._placed = []
        n = d.shape[0] * d.shape[1] * len(slots) * d.shape[3]
        flat = self.buffer.view(-1)[:n].view(d.shape[0], d.shape[1], len(slots), d.shape[3])
        return pool.read(slots, out=flat)


def _grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, except that with a mask on CPU grouped-query heads share
    their keys and values (``enable_gqa``) instead of copies of them for every query head."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or groups <= 1 or query.device.type != "cpu" or kwargs.get("softcap") is not None
            or kwargs.get("position_bias") is not None or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def use_grouped_attention(model) -> bool:
    """Switch a CPU model that attends with SDPA and groups its key/value heads to
    ``_grouped_sdpa`` (registered with transformers' attention and mask interfaces); whether it
    was switched."""
    config = model.config
    if getattr(config, "_attn_implementation", None) == ATTENTION_NAME:
        return True  # a model wrapped before
    if getattr(config, "_attn_implementation", None) != "sdpa" or next(model.parameters()).device.type != "cpu":
        return False
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if not heads or kv_heads == heads:
        return False
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask
    AttentionInterface.register(ATTENTION_NAME, _grouped_sdpa)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    try:
        model.set_attn_implementation(ATTENTION_NAME)
    except (ValueError, AttributeError, TypeError):
        return False
    return config._attn_implementation == ATTENTION_NAME
