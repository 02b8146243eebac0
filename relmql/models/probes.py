"""The checks a transformers model passes when it is loaded (``probe``, run by the loader): each
way the backend departs from transformers' own forward pass is kept only where it gives the same
numbers, and the model's ``attention`` says what was chosen and why (docs/models.md, *Inside the
model backend*)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, List, Sequence, Tuple

from .attention import ATTENTION_NAME
from .base import ModelState, ModelStats
from .graphs import PADDED, TREE, Graphs

if TYPE_CHECKING:
    from .hf import TransformersModel

PROBE_TOLERANCE = 1e-3  # the most a checked way of reading may differ from transformers' own, at load


def probe(model: "TransformersModel") -> None:
    """Every load-time check of ``model``: tree attention and its companions, then (on a GPU)
    CUDA graphs."""
    probe_tree_attention(model)
    if model.device.type == "cuda":
        probe_graphs(model)


def _tree(model: "TransformersModel") -> Tuple[List[int], List[List[int]]]:
    """The small tree the checks read: a root's tokens, then the new tokens of its two children
    and of a new root."""
    return [model.eos_id, model.bos_id], [[model.bos_id], [model.eos_id, model.bos_id], [model.eos_id]]


def probe_tree_attention(model: "TransformersModel") -> None:
    """Check, on a small tree, each way the backend departs from transformers' own cached
    forward pass (padded copies, transformers' attention): the grouped-query attention
    function, keys and values laid out ahead of the call, and tree attention (twice, the
    second call reusing the staged beginning), where the model takes a custom 4D mask. Each
    must give the same log-probabilities, else it is switched off and EXPLAIN says why."""
    kind, passes = type(model.model).__name__, model.passes
    start, new = _tree(model)
    notes = []
    try:
        passes.tree_attention = False
        passes.preload = False
        with original_attention(model):
            root = model.extend([None], [start])[0]
            parents = [root, root, None]
            reference = model.extend(parents, new)
        if model.grouped_attention and not _agrees(reference, lambda: model.extend(parents, new)):
            model.model.set_attn_implementation("sdpa")
            model.grouped_attention = False
            notes.append(f"{kind} gave other numbers with shared key/value heads")
        passes.preload = True
        if not _agrees(reference, lambda: model.extend(parents, new)):
            passes.preload = False
            notes.append(f"keys and values copied once more by the cache: {kind} did not write new keys where "
                         f"laid out")
        passes.tree_attention = True
        worst = _worst(reference, model.extend(parents, new))
        worst = max(worst, _worst(reference, model.extend(parents, new)))  # the staged beginning kept
    except Exception as e:  # a model family that cannot take the mask
        passes.tree_attention = False
        model.attention = (f"padded copies of each sequence's keys and values ({kind} did not take a tree "
                           f"attention mask: {type(e).__name__})")
        worst = None
    finally:
        model.stats = ModelStats()
        passes.stage.clear()
    if worst is not None and worst > PROBE_TOLERANCE:
        passes.tree_attention = False
        model.attention = (f"padded copies of each sequence's keys and values ({kind} gave other numbers under a "
                           f"tree attention mask: {worst:.1e})")
    elif worst is not None:
        model.attention = ("tree attention: keys and values in one pool, from which each call gathers its nodes' "
                           "ancestors' once, a shared beginning kept in place from call to call")
    if model.grouped_attention:
        notes.append("grouped-query heads share their keys and values")
    model.attention += "".join(f"; {n}" for n in notes)


def probe_graphs(model: "TransformersModel", capture: bool = True) -> None:
    """Check that passes replayed as CUDA graphs (``capture`` False: the same padded shapes
    run eagerly) give the eager passes' log-probabilities, padded and (where the model takes
    it) under tree attention, and keys and values from which the next pass reads the same;
    if so they are used from then on, else EXPLAIN says why not."""
    passes = model.passes
    start, new = _tree(model)
    tree = passes.tree_attention
    why, graphs, ok = None, Graphs(model, capture), False
    try:
        root = model.extend([None], [start])[0]
        parents = [root, root, None]
        for passes.tree_attention in sorted({False, tree}):
            passes.graphs = None
            reference = model.extend(parents, new)
            after = model.extend(reference, [[model.bos_id]] * 3)
            for _ in range(2):  # a shape is captured when it is met again
                passes.graphs = graphs
                got = model.extend(parents, new)
                passes.graphs = None  # the keys and values the graph wrote, read by an eager pass
                if _worst(reference, got) > PROBE_TOLERANCE or not _agrees(
                        after, lambda: model.extend(got, [[model.bos_id]] * 3)):
                    why = "they gave other numbers"
        ok = why is None and {k[0] for k in graphs.passes} == ({PADDED, TREE} if tree else {PADDED})
    except Exception as e:  # the model's code could not be captured
        why = f"{type(e).__name__}"
    finally:
        passes.tree_attention = tree
        passes.graphs = graphs if ok else None
        model.stats = ModelStats()
        passes.stage.clear()
    if ok:
        model.attention += ("; forward passes replayed as CUDA graphs" if capture else
                            "; forward passes in the shapes of CUDA graphs, run eagerly")
    else:
        why = why or graphs.failure or "no shape fits"
        model.attention += f"; forward passes run eagerly (CUDA graphs: {why})"


@contextlib.contextmanager
def original_attention(model: "TransformersModel"):
    """A context in which the model attends as transformers has it (not ``relmql_sdpa``)."""
    if not model.grouped_attention:
        yield
        return
    model.model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.model.set_attn_implementation(ATTENTION_NAME)


def _worst(a: Sequence[ModelState], b: Sequence[ModelState]) -> float:
    """The largest difference between two lists of states' next-token log-probabilities."""
    return max(float((x.logprobs - y.logprobs).abs().max()) for x, y in zip(a, b))


def _agrees(reference: Sequence[ModelState], read) -> bool:
    """Whether ``read()`` gives ``reference``'s log-probabilities (False when it raises)."""
    try:
        return _worst(reference, read()) <= PROBE_TOLERANCE
    except Exception:
        return False
