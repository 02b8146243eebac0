"""How an EXPECT query runs: its first round at the level that keeps the stated error rate over
every round, the later rounds' plans, and the record of what the verdict was judged on."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from pathlib import Path
from typing import Any, Callable, Dict, Tuple

from ..plan.plans import QueryPlan
from ..syntax import ast as A
from ..records import Measure, Sample
from ..version import __version__
from .judge import judge, round_level

BUDGET_TIMES = 16  # an estimated verdict's draws at most, over its rounds, in times its first round's


def first_round(plan, make_result: Callable[..., Any]) -> Tuple[Any, Callable[[Any], Any]]:
    """``plan`` as its first round runs (an estimate's interval at 1 - α/2; for probability(), the
    search's bound alone where it may decide), and the function that judges its result (drawing
    more rounds through ``make_result(plan)`` where that is undecided: of probability(), or of
    SAMPLE n's counts under a TEST, whose Cramér's V has an interval)."""
    t = getattr(plan, "traversal", None)
    if isinstance(t, Sample) and plan.test is not None:  # Cramér's V of counts drawn: more draws narrow it
        def redraw(k: int):
            return make_result(dataclasses.replace(plan, traversal=dataclasses.replace(
                t, n=t.n * 2 ** k, stream=f"{t.stream} round {k}".strip())))
        return plan, lambda result: _judged(plan, judge(plan.expect, result, redraw, plan.expect.confidence, t.n,
                                                        BUDGET_TIMES * t.n, drawn=True))
    if not isinstance(t, Measure):
        return plan, lambda result: _judged(plan, judge(plan.expect, result))
    stated = t.confidence
    first = dataclasses.replace(plan, traversal=dataclasses.replace(t, confidence=round_level(stated, 0)))
    budget = t.max_draws if t.max_draws is not None else BUDGET_TIMES * t.samples

    def rerun(k: int):
        more = dataclasses.replace(t, samples=t.samples * 2 ** k, confidence=round_level(stated, k),
                                   stream=f"{t.stream} round {k}".strip())
        return make_result(dataclasses.replace(plan, traversal=more))

    def estimated(result):  # only an estimate leaves a verdict undecided: a sum never calls rerun
        return _judged(plan, judge(plan.expect, result, rerun, stated, t.samples, budget))
    if not bounds_first(plan):
        return first, estimated

    def bounded(result):  # the search's certain bound first; draws only where it does not decide
        verdict = judge(plan.expect, result)
        if verdict.status != "inconclusive":
            return _judged(plan, verdict)
        if verdict.kind == "estimate":  # no bound applied (several prefix paths): these draws are round 0
            return estimated(result)
        drawn = estimated(make_result(first))
        drawn.seconds += verdict.seconds
        return drawn
    return dataclasses.replace(first, traversal=dataclasses.replace(first.traversal, bound_only=True)), bounded


def bounds_first(plan) -> bool:
    """Whether a verdict on probability() looks at the search's bound before any draw: a query whose
    columns are all probability() and whose plan bounds it (the planner sets ``bound_nodes`` 0 for
    GROUP BY, WHERE and several models, where the value is not the whole language's); the bound's
    round has no draws for count(*) and the like to read."""
    return (isinstance(plan, QueryPlan) and plan.traversal.bound_nodes > 0 and plan.traversal.exact_limit > 0
            and all(isinstance(o.expr, A.Call) and o.expr.name == "probability" for o in plan.outputs))


def _judged(plan, verdict):
    verdict.judged_on = judged_on(plan)
    return verdict


def judged_on(plan) -> Dict[str, Any]:
    """What a verdict rests on: the models (name, a hash of their weights' files), dtype, device,
    decoding rules, seed, relmql's version."""
    models = (plan.models or (plan.model,)) if hasattr(plan, "model") else ()  # a dataset's: in its rows
    t = getattr(plan, "traversal", None)
    decoding = getattr(plan, "decoding", None)
    return {"models": [{"name": m.name, "weights": weights_hash(m.name)} for m in models],
            "dtype": models[0].dtype if models else None, "device": models[0].device if models else None,
            "decoding": ", ".join(decoding.describe()) if decoding is not None and decoding.describe() else "none",
            "seed": getattr(t, "seed", None), "relmql": __version__}


def weights_hash(name: str) -> str:
    """sha256 of the model's weight files, for a model whose files are here (a built-in model's
    converted folder, a local directory); its name otherwise (a hub id not downloaded)."""
    folder = _folder(name)
    if folder is None:
        return ""
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf"))
    return _hash_files(tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files))


def _folder(name: str):
    if os.path.isdir(name):
        return Path(name)
    from ..cache import cache_dir
    models = Path(cache_dir()) / "models"
    if models.is_dir():  # a built-in model, converted once: its newest float32 folder
        found = sorted((p for p in models.iterdir() if p.is_dir() and p.name.startswith(f"{name}-")),
                       key=lambda p: p.stat().st_mtime)
        if found:
            return found[-1]
    return None


@functools.lru_cache(maxsize=16)
def _hash_files(files: Tuple[Tuple[str, int, int], ...]) -> str:
    h = hashlib.sha256()
    for path, _, _ in files:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:16]


__all__ = ["first_round", "judged_on", "weights_hash", "BUDGET_TIMES"]
