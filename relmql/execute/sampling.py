"""Random samples of a token automaton on a model.

Each sample first draws a prefix uniformly over the prefix's token paths: at every prefix
state, an arc is taken in proportion to the number of complete prefix paths below it (cycles
unrolled to ``max_tokens``), so that, for instance, the prefixes a, b, bb and bbb are each drawn
a quarter of the time. The completion is then drawn from the model under the decoding rules.

A sample's string ends where the language lets it end: at a final state with no way on, or, at
a final state that can go on, when the model produces its end-of-text token (always with
``eos``). The model's distribution restricted to the language is therefore
P(s) ∝ P(completion tokens) · P(end of text)^[it ended by end of text].

``local`` mode draws each step from the model's distribution renormalized over the tokens the
language allows; the product of the normalizers is the row's importance weight (so the mean
weight estimates P(language | prefix)). ``exact`` mode draws from the model's own distribution
and starts the completion again whenever it leaves the language (rejection).

Every sample has its own random stream (seed, sample number), so results do not depend on
batching. Walkers are batched: up to ``batch_size`` completions advance together, one token per
model call, each reusing its own keys and values; walkers that reach a completion another
walker has already read take its state from a cache instead of the model. The states cached
for prefixes and for completions stay within the traversal's share of ``max_memory``.
"""

from __future__ import annotations

import math
import random
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from ..automata.tokens import TokenAutomaton
from ..memory import shares
from ..models.base import LanguageModel, ModelState
from .decoding import RuleScores
from .options import Cancelled, Decoding, ExecutionError, Sample
from .rows import Row, make_row



@dataclass
class SampleStats:
    """Draws made: completions started, and those thrown away (dead ends, budget, rejection)."""
    draws: int = 0
    discarded: int = 0


@dataclass
class _Walker:
    index: int
    rng: random.Random
    prefix: Tuple[int, ...]
    pre_raw: float
    start_state: ModelState
    start_node: int
    state: ModelState = None
    node: int = 0
    tokens: List[int] = field(default_factory=list)
    cond: float = 0.0
    weight: float = 1.0
    dead_ends: int = 0  # in a row, from this prefix


DEAD_ENDS = 64  # dead ends in a row after which local sampling gives up on a prefix


def sample_rng(seed: int, index: int) -> random.Random:
    """The random stream of sample ``index`` (independent of batching and of other samples)."""
    return random.Random(f"relmql sample {seed} {index}")


def draw_prefix(automaton: TokenAutomaton, rng: random.Random, max_tokens: int) -> Tuple[Tuple[int, ...], int]:
    """A prefix token path drawn uniformly among those of at most ``max_tokens`` tokens, and the
    automaton state at its end."""
    state, path = automaton.start, []
    total = automaton.count_paths(state, max_tokens, prefix_only=True)
    if total == 0:
        raise ExecutionError(f"the prefix has no token path of at most {max_tokens} tokens",
                             hint="raise max_prefix_tokens")
    budget = max_tokens
    while True:
        here = automaton._ends_here(state, True)
        arcs = automaton.arcs(state)
        pre = np.flatnonzero(arcs.prefix) if budget > 0 else np.zeros(0, np.int64)
        weights = [automaton.count_paths(int(arcs.targets[i]), budget - 1, prefix_only=True) for i in pre]
        total = here + sum(weights)
        pick = rng.randrange(total)  # exact for counts of any size
        if pick < here:
            return tuple(path), state
        pick -= here
        for i, w in zip(pre, weights):
            if pick < w:
                state = int(arcs.targets[i])
                path.append(int(arcs.tokens[i]))
                budget -= 1
                break
            pick -= w


def sample(automaton: TokenAutomaton, model: LanguageModel, rules: Decoding, opts: Sample,
           cancel: Optional[threading.Event] = None, stats: Optional[SampleStats] = None) -> Iterator[Row]:
    """``opts.n`` rows in sample order (row i is sample i), reproducible for ``opts.seed``."""
    rules, opts = rules.check(), opts.check()
    stats = stats if stats is not None else SampleStats()
    vocab = model.vocabulary
    eos = model.eos_id
    exact = opts.mode == "exact"
    budget = opts.max_draws if opts.max_draws is not None else max(1000, 1000 * opts.n)
    memory = shares(opts.max_memory)
    model.set_cache_budget(memory.kv)
    automaton.set_cache_budget(memory.automaton)
    # a cached state holds its next-token log-probabilities (float32) and, for rejection, their
    # cumulative sums (float64); half the share for prefixes, half for completions
    per_state = len(vocab) * (12 if exact else 4)
    cached_states = max(opts.batch_size, memory.traversal // 2 // per_state)
    prefixes: "OrderedDict[Tuple[int, ...], Tuple[ModelState, float]]" = OrderedDict()
    done: Dict[int, Row] = {}
    waiting: List[_Walker] = []
    next_out = 0
    started = 0

    def prefix_states(walkers: List[_Walker]):
        todo = sorted({w.prefix for w in walkers if w.prefix not in prefixes})
        got = {}
        for k in range(0, len(todo), opts.batch_size):
            part = todo[k:k + opts.batch_size]
            for path, st in zip(part, model.extend([None] * len(part), [list(p) for p in part])):
                got[path] = (st, float(np.nansum(st.token_logprobs)))
        for w in walkers:
            w.start_state, w.pre_raw = got.get(w.prefix) or prefixes[w.prefix]
            restart(w)
        for path, value in got.items():
            prefixes[path] = value
        while len(prefixes) > cached_states:
            prefixes.popitem(last=False)

    def restart(w: _Walker):
        w.state, w.node, w.tokens, w.cond, w.weight = w.start_state, w.start_node, [], 0.0, 1.0
        stats.draws += 1

    def new_walker(i: int) -> _Walker:
        rng = sample_rng(opts.seed, i)
        path, node = draw_prefix(automaton, rng, opts.max_prefix_tokens)
        return _Walker(i, rng, path, 0.0, None, node)

    def finish(w: _Walker, edits: int, eos_lp: float = 0.0):
        cond = w.cond + (eos_lp if rules.eos else 0.0)
        toks = list(w.prefix) + w.tokens
        done[w.index] = make_row(vocab, toks, len(w.prefix), cond, w.pre_raw + cond, edits, w.index + 1,
                                 1.0 if exact else w.weight)

    def rule_scores(st: ModelState) -> RuleScores:
        """The decoding rules on a state's distribution (cached on the state)."""
        got = getattr(st, "_rules", None)
        if got is None:
            got = st._rules = RuleScores(st.logprobs[None], rules)
        return got

    def rule_at(st: ModelState, toks: np.ndarray) -> np.ndarray:
        scores = rule_scores(st)
        t = torch.from_numpy(np.asarray(toks, np.int64)).to(scores.x.device)
        return scores.at(torch.zeros_like(t), t).double().cpu().numpy()

    def draw(w: _Walker):
        """One step of a walker: ("end", None), ("token", t) or ("reject", zero_mass)."""
        arcs = automaton.arcs(w.node)
        comp = ~arcs.prefix
        toks, tgts = arcs.tokens[comp], arcs.targets[comp]
        edits = automaton.final_edits(w.node)
        final = edits >= 0
        if final and (len(toks) == 0 or opts.first_match) and not rules.eos:
            finish(w, edits)
            return "end", None
        if len(w.tokens) >= opts.max_tokens:
            toks = toks[:0]  # no room for more tokens: only the end of text remains
        can_end = final and eos is not None
        if exact:
            t = _draw_full(w.rng, w.state, rule_scores(w.state))
            if t == eos and can_end:
                finish(w, edits, float(rule_at(w.state, [eos])[0]))
                return "end", None
            hit = np.flatnonzero(toks == t) if t != eos else []
            if not len(hit):
                return "reject", False
            k = int(hit[0])
            lp = float(rule_at(w.state, [t])[0])
        else:
            options = rule_at(w.state, np.concatenate([toks, [eos]]) if can_end else toks) \
                if len(toks) or can_end else np.zeros(0)
            lps = options[:len(toks)]
            p = np.exp(options)
            z = p.sum()
            if not z > 0:
                return "reject", True  # a dead end: every allowed token was ruled out
            k = min(int(np.searchsorted(np.cumsum(p), w.rng.random() * z, side="right")), len(p) - 1)
            w.weight *= z
            if can_end and k == len(lps):
                finish(w, edits, float(options[-1]))
                return "end", None
            t, lp = int(toks[k]), float(lps[k])
        w.tokens.append(int(t))
        w.cond += lp
        w.node = int(tgts[k])
        return "token", int(t)

    seen: "OrderedDict[tuple, ModelState]" = OrderedDict()  # (prefix, completion tokens) -> state
    active: List[_Walker] = []
    while next_out < opts.n:
        if cancel is not None and cancel.is_set():
            raise Cancelled("the query was cancelled")
        while started < opts.n and len(active) + len(waiting) < opts.batch_size:
            waiting.append(new_walker(started))
            started += 1
        if waiting:
            prefix_states(waiting)
            active.extend(waiting)
            waiting = []
        step = []
        for w in active:
            while True:  # redraw at once after a rejection: the prefix's distribution is at hand
                if stats.draws > budget:
                    raise ExecutionError(f"sampling gave up after {stats.draws:,} draws for {next_out:,} samples: "
                                         "the language is too improbable for this sampler",
                                         hint="use the local sampling mode, lower top-k/top-p, "
                                              "or raise the draw budget (max_draws)")
                what, arg = draw(w)
                if what == "token":
                    step.append((w, arg))
                    break
                if what == "end":
                    break
                stats.discarded += 1
                if opts.misses:  # one draw per sample: this one missed
                    done[w.index] = make_row(vocab, list(w.prefix) + w.tokens, len(w.prefix), -math.inf, -math.inf,
                                             0, w.index + 1, 0.0, miss=True)
                    break
                w.dead_ends += bool(arg)
                if arg and (not w.tokens or w.dead_ends >= DEAD_ENDS):
                    # the rules leave nothing of the language after this prefix (certainly, when the
                    # first token is a dead end; most likely, after DEAD_ENDS dead ends in a row):
                    # draw another prefix
                    w.dead_ends = 0
                    w.prefix, w.start_node = draw_prefix(automaton, w.rng, opts.max_prefix_tokens)
                    waiting.append(w)
                    break
                restart(w)
        # advance every walker that drew a token: states already seen come from the cache, the
        # others from one model call
        todo = {}
        for w, _ in step:
            key = (w.prefix, tuple(w.tokens))
            got = seen.get(key)
            if got is not None:
                seen.move_to_end(key)
                w.state = got
            else:
                todo.setdefault(key, []).append(w)
        if todo:
            keys = list(todo)
            parents = [todo[k][0].state for k in keys]
            outs = model.extend(parents, [[k[1][-1]] for k in keys])
            for key, st in zip(keys, outs):
                for w in todo[key]:
                    w.state = st
                seen[key] = st
            while len(seen) > cached_states:
                seen.popitem(last=False)
        active = [w for w, _ in step]
        while next_out in done:
            yield done.pop(next_out)
            next_out += 1


def _draw_full(rng: random.Random, state: ModelState, scores: RuleScores) -> int:
    """One token from a whole (rule-adjusted) next-token distribution (its cumulative sums are
    cached on the state, which rejection sampling draws from again and again)."""
    c = getattr(state, "_cdf", None)
    if c is None:
        c = state._cdf = np.cumsum(torch.exp(scores.full()[0].double()).cpu().numpy())
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(c) - 1))
