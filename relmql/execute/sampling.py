"""Random samples of a token automaton on a model (design: docs/executor.md, "Sampling" and
"Inside the sampler")."""

from __future__ import annotations

import math
import random
import sys
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch

from ..automata.tokens import TokenAutomaton
from ..memory import shares
from ..models.base import LanguageModel, ModelState
from ..records import Cancelled, Decoding, ExecutionError, Sample
from .decoding import RuleScores, batch_limit
from .rows import Row, make_row
from .samplecache import StateCache
from .twin import Twin


@dataclass
class SampleStats:
    """What a sampler drew."""
    draws: int = 0  # completions started
    discarded: int = 0  # draws thrown away (dead ends, budget, rejection)
    cut: Tuple[str, ...] = ()  # the bounds (max_tokens, context) that ended a draw where the language went on
    too_long: int = 0  # the draws thrown away there (among discarded)
    watch: Optional[Callable[["SampleStats", Sample], None]] = field(
        default=None, repr=False, compare=False)  # called after each step of the batch (a progress display)

    @property
    def too_long_at(self) -> str:
        """The bound the ``too_long`` draws ran into: ``max_tokens`` (where it cut any), else ``context``."""
        return "max_tokens" if "max_tokens" in self.cut or not self.cut else "context"


@dataclass
class _Walker:
    """One sample being drawn."""
    index: int  # the sample's number (its row's rank less one)
    rng: random.Random  # its own random stream
    prefix: Tuple[int, ...]  # the prefix path drawn
    pre_raw: float  # the prefix's log-probability
    start_state: ModelState  # the model's state after the prefix
    start_node: int  # the automaton's state after the prefix
    state: ModelState = None  # the model's state after the tokens drawn
    node: int = 0  # the automaton's state after them
    tokens: List[int] = field(default_factory=list)  # the completion tokens drawn
    cond: float = 0.0  # their log-probability under the decoding rules
    weight: float = 1.0  # the product of the normalizers (local draws)
    dead_ends: int = 0  # in a row, from this prefix
    canonical: bool = False  # this draw follows the canonical tokenizations (``Twin``)
    twin_node: Optional[int] = None  # the twin's state after the same tokens (None: it has left the twin)
    twin_weight: float = 1.0  # the product of the twin's normalizers (0 once it has left the twin)


DEAD_ENDS = 64  # dead ends in a row after which local sampling gives up on a prefix
TOO_LONG = 64  # draws cut at max_tokens (or the context), with none ended yet, after which sampling gives up
WATCH_DRAWS = 1024  # draws between two calls of SampleStats.watch within one step (rejection redraws at once)
FINALS_KEPT = 1 << 18  # states whose _final_at a sampler remembers (a few MB; forgotten all at once past it)


def sample_rng(seed: int, index: int, stream: str = "") -> random.Random:
    """The random stream of sample ``index`` (independent of batching and of other samples, and
    of other ``stream``s of the seed)."""
    return random.Random(f"relmql sample {seed} {index}" + (f" {stream}" if stream else ""))


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
           cancel: Optional[threading.Event] = None, stats: Optional[SampleStats] = None,
           twin: Optional[TokenAutomaton] = None) -> Iterator[Row]:
    """``opts.n`` rows in sample order (row i is sample i), reproducible for ``opts.seed``.
    ``twin``: see ``Sampler``."""
    yield from Sampler(automaton, model, rules, opts, stats, twin).rows(cancel)


class Sampler:
    """One sampling run and its state: the walkers ``active`` (drawing a completion token by
    token) and ``waiting`` (for their prefix's model state), the finished rows ``done`` until
    their turn (``next_out``), and the model states cached for ``prefixes`` and for the
    completions already ``seen`` (at most ``cached_states`` each). ``twin`` (local draws over
    every tokenization): the same language's canonical automaton, which half the draws follow
    (``Twin``); a draw still ends where the whole automaton's language does (first_match), and
    one that the twin cannot go on from misses."""

    def __init__(self, automaton: TokenAutomaton, model: LanguageModel, rules: Decoding, opts: Sample,
                 stats: Optional[SampleStats] = None, twin: Optional[TokenAutomaton] = None):
        self.automaton, self.model = automaton, model
        self.twin = Twin(twin) if twin is not None and opts.mode == "local" else None
        self.context = getattr(model, "max_length", None) or sys.maxsize  # tokens the model reads at most
        # a state's tokens begin with the start token, or a prompt's (which max_length counts as one)
        self.start_extra = len(model.start_tokens) - 1
        self.rules, self.opts = rules.check(), opts.check()
        cap = batch_limit(self.rules, len(model.vocabulary), self.opts.max_memory)
        self.opts = opts = replace(self.opts, batch_size=min(self.opts.batch_size, cap))
        self.stats = stats if stats is not None else SampleStats()
        self.exact = opts.mode == "exact"
        self.max_draws = opts.draw_budget
        memory = shares(opts.max_memory)
        model.set_cache_budget(memory.kv)
        automaton.set_cache_budget(memory.automaton)
        # a cached state holds its next-token log-probabilities (float32) and, for rejection, their
        # cumulative sums (float64); half the share for prefixes, half for completions
        per_state = len(model.vocabulary) * (12 if self.exact else 4)
        self.cached_states = max(opts.batch_size, memory.traversal // 2 // per_state)
        self.states = StateCache(model, self.cached_states, opts.batch_size, self.context)
        self.done: Dict[int, Row] = {}
        self.active: List[_Walker] = []
        self.waiting: List[_Walker] = []
        self.next_out = 0  # the next row to release
        self.started = 0   # samples begun
        self.finished = 0  # samples drawn (strings of the language ended)
        self.cancel: Optional[threading.Event] = None
        self._finals: Dict[int, bool] = {}  # state -> _final_at(state)

    @property
    def prefixes(self):
        """The cached prefix states (``StateCache.prefixes``)."""
        return self.states.prefixes

    @property
    def seen(self):
        """The cached completion states (``StateCache.seen``)."""
        return self.states.seen

    def check_cancel(self) -> None:
        """Raise ``Cancelled`` once the query's cancel event is set."""
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled("the query was cancelled")

    def rows(self, cancel: Optional[threading.Event] = None) -> Iterator[Row]:
        """The rows in sample order; a batch of walkers advances one token per model call."""
        self.cancel = cancel
        need = self.automaton.too_long(self.opts.max_tokens) if self.opts.n else None
        if need is not None:  # every draw would be cut at max_tokens (too_long's error, without the draws)
            raise ExecutionError(
                f"sampling cannot draw a string: each string of the language takes at least {need:,} tokens, "
                f"and max_tokens is {self.opts.max_tokens:,}", hint=f"raise max_tokens to {need:,} or more")
        while self.next_out < self.opts.n:
            self.check_cancel()
            self.start_walkers()
            step = [w for w in self.active if self.walk(w)]
            self.advance(step)
            self.active = step
            if self.stats.watch is not None:
                self.stats.watch(self.stats, self.opts)
            while self.next_out in self.done:
                yield self.done.pop(self.next_out)
                self.next_out += 1

    def start_walkers(self) -> None:
        """Begin new samples while the batch has room, and start the waiting walkers at their
        prefix's state."""
        opts = self.opts
        while self.started < opts.n and len(self.active) + len(self.waiting) < opts.batch_size:
            rng = sample_rng(opts.seed, self.started, opts.stream)
            path, node = draw_prefix(self.automaton, rng, opts.max_prefix_tokens)
            self.waiting.append(_Walker(self.started, rng, path, 0.0, None, node))
            self.started += 1
        if self.waiting:
            self.prefix_states(self.waiting)
            self.active.extend(self.waiting)
            self.waiting = []

    def prefix_states(self, walkers: List[_Walker]) -> None:
        """Give each walker its prefix's model state and probability (read, or from the cache),
        and restart it there."""
        for w, got in zip(walkers, self.states.prefix_states([w.prefix for w in walkers])):
            w.start_state, w.pre_raw = got
            self.restart(w)

    def restart(self, w: _Walker) -> None:
        """Start a walker's completion again, after its prefix (a new draw)."""
        w.state, w.node, w.tokens, w.cond, w.weight = w.start_state, w.start_node, [], 0.0, 1.0
        if self.twin is not None:
            w.canonical = w.index % 2 == 0
            w.twin_node, w.twin_weight = self.twin.start(w.prefix), 1.0
        self.stats.draws += 1

    def walk(self, w: _Walker) -> bool:
        """Draw until the walker takes a token (True), or its sample ends, misses, or waits for
        another prefix (False); a rejection draws again at once (the prefix's state is at hand)."""
        opts, stats = self.opts, self.stats
        while True:
            # rejection draws again from the prefix's state without a model call, a million
            # draws in seconds: the loop stops on cancel and reports its progress as it goes
            if stats.watch is not None and stats.draws % WATCH_DRAWS == 0:
                stats.watch(stats, opts)
            self.check_cancel()
            if stats.draws > self.max_draws:
                raise self.gave_up()
            what, arg = self.draw(w)
            if what == "token":
                return True
            if what == "end":
                return False
            stats.discarded += 1
            if opts.misses:  # one draw per sample: this one missed
                self.done[w.index] = make_row(self.model.vocabulary, list(w.prefix) + w.tokens, len(w.prefix),
                                              -math.inf, -math.inf, 0, w.index + 1, 0.0, miss=True,
                                              context=self.model.context)
                return False
            if len(w.tokens) >= opts.max_tokens or len(w.state.tokens) - self.start_extra >= self.context:
                stats.too_long += 1
                if stats.too_long >= TOO_LONG and not self.finished:
                    raise self.too_long()
            w.dead_ends += bool(arg)
            if arg and (not w.tokens or w.dead_ends >= DEAD_ENDS):
                # the rules leave nothing of the language after this prefix (certainly, when the
                # first token is a dead end; most likely, after DEAD_ENDS dead ends in a row):
                # draw another prefix
                w.dead_ends = 0
                w.prefix, w.start_node = draw_prefix(self.automaton, w.rng, opts.max_prefix_tokens)
                self.waiting.append(w)
                return False
            self.restart(w)

    def gave_up(self) -> ExecutionError:
        """The error when the draws run out, and what to change: rejection redraws whenever the
        model leaves the language; a local draw fails only where the decoding rules keep none of
        the tokens the language allows, or where the completion reaches max_tokens or the model's
        context (which the message then names: a local draw that reaches it ends there only with
        a last token that ends a string of the language)."""
        got = f"{self.next_out:,} sample" + ("" if self.next_out == 1 else "s")
        why, hint = "the language is too improbable for this sampler", None
        reached = f"draws reached the {self.context:,} tokens the model reads before a string of the language ended"
        fit = "a shorter PREFIX or pattern, or a model that reads more tokens"
        if "context" in self.stats.cut and not self.exact:
            why, hint = reached, fit
        elif "context" in self.stats.cut:
            hint = (f"some {reached}: {fit}; or the local sampling mode (the default), or a larger draw budget "
                    "(max_draws)")
        elif self.exact:
            hint = "use the local sampling mode (the default), or raise the draw budget (max_draws)"
        elif not (rules := self.rules.truncation()):  # "topk 40 and topp 0.9"
            hint = "raise max_tokens (a longer completion fails) or the draw budget (max_draws)"
        else:
            it = "them" if " and " in rules else "it"
            hint = (f"{rules} kept none of the tokens the language allows at some step of most draws: raise {it} "
                    f"or drop {it}; or raise max_tokens or the draw budget (max_draws)")
        return ExecutionError(f"sampling gave up after {self.max_draws:,} draws with {got} drawn: {why}", hint=hint)

    def too_long(self) -> ExecutionError:
        """The error when the first ``TOO_LONG`` draws were all cut by ``max_tokens`` or the
        model's context before a string of the language ended: the draw budget would be spent
        the same way (an hour of draws of max_tokens tokens each, for one sample), and the
        strings drawn at last would be the few short enough, not a sample of the model's."""
        if self.stats.too_long_at == "max_tokens":
            where, hint = (f"max_tokens ({self.opts.max_tokens:,} tokens)",
                           "raise max_tokens: the strings of this language take more tokens than that, as the "
                           "model draws them")
        else:
            where, hint = (f"the {self.context:,} tokens the model reads",
                           "a shorter PREFIX or pattern, or a model that reads more tokens")
        return ExecutionError(f"sampling gave up: its first {self.stats.too_long:,} draws were all cut at {where} "
                              "before a string of the language ended", hint=hint)

    def advance(self, step: List[_Walker]) -> None:
        """Give every walker that drew a token its new model state: from the cache when already
        seen, the others from one model call."""
        keys = [(w.prefix, tuple(w.tokens)) for w in step]
        for w, st in zip(step, self.states.advance(keys, [w.state for w in step])):
            w.state = st

    def finish(self, w: _Walker, edits: int, eos_lp: float = 0.0) -> None:
        """The walker's sample is a string of the language: its row waits in ``done``."""
        self.finished += 1
        cond = w.cond + (eos_lp if self.rules.eos else 0.0)
        toks = list(w.prefix) + w.tokens
        weight, miss = w.weight, False
        if self.twin is not None:  # a canonical draw measures the canonical tokenizations, the others the rest
            canonical = self.twin.ends(w)
            weight, miss = (w.twin_weight if w.canonical else weight), canonical != w.canonical
        self.done[w.index] = make_row(self.model.vocabulary, toks, len(w.prefix), cond, w.pre_raw + cond, edits,
                                      w.index + 1, 1.0 if self.exact else weight, miss=miss,
                                      context=self.model.context)

    def draw(self, w: _Walker):
        """One step of a walker: ("end", None), ("token", t) or ("reject", zero_mass)."""
        automaton, opts = self.automaton, self.opts
        arcs = automaton.arcs(w.node)
        comp = ~arcs.prefix
        toks, tgts = arcs.tokens[comp], arcs.targets[comp]
        edits = automaton.final_edits(w.node)
        final = edits >= 0
        if final and (len(toks) == 0 or opts.first_match) and not self.rules.eos:
            self.finish(w, edits)
            return "end", None
        last = len(w.tokens) < opts.max_tokens and len(w.state.tokens) - self.start_extra >= self.context
        if len(w.tokens) >= opts.max_tokens or last:
            toks, tgts = self.at_bound(w, toks, tgts, last)
        can_end = final and self.model.eos_id is not None
        what, got = (self.draw_exact if self.exact else self.draw_local)(w, toks, edits, can_end)
        if what != "take":
            return what, got
        k, t, lp = got
        w.tokens.append(int(t))
        w.cond += lp
        w.node = int(tgts[k])
        if last:  # a string's last token, past what the model reads: it ends here, unread
            self.finish(w, automaton.final_edits(w.node))
            return "end", None
        return "token", int(t)

    def at_bound(self, w: _Walker, toks: np.ndarray, tgts: np.ndarray, last: bool):
        """The tokens (and their targets) a walker at ``max_tokens`` or, ``last``, at the model's
        context may still take, the bound noted where it cut a way on."""
        cause = "max_tokens" if len(w.tokens) >= self.opts.max_tokens else "context"
        if last and not self.rules.eos:
            # the model reads no more tokens, but the one it scores next may still end a string
            # of the language (cut there, as max_tokens cuts one, and as the search takes it)
            targets, back = np.unique(tgts, return_inverse=True)
            ends = self._final_at(targets)[back.reshape(-1)]
            toks, tgts, cut = toks[ends], tgts[ends], not ends.all()
        else:
            toks, tgts, cut = toks[:0], tgts[:0], len(toks) > 0  # only the end of text remains
        if cut and cause not in self.stats.cut:
            self.stats.cut += (cause,)
        return toks, tgts

    def draw_exact(self, w: _Walker, toks: np.ndarray, edits: int, can_end: bool):
        """A rejection step from the model's whole distribution: ("take", (place in ``toks``, token,
        rule log-probability)), ("end", None) or ("reject", False)."""
        eos = self.model.eos_id
        t = _draw_full(w.rng, w.state, rule_scores(w.state, self.rules))
        if t == eos and can_end:
            self.finish(w, edits, float(rule_at(w.state, self.rules, [eos])[0]))
            return "end", None
        hit = np.flatnonzero(toks == t) if t != eos else []
        if not len(hit):
            return "reject", False
        return "take", (int(hit[0]), t, float(rule_at(w.state, self.rules, [t])[0]))

    def draw_local(self, w: _Walker, toks: np.ndarray, edits: int, can_end: bool):
        """A local step among the tokens the language allows, renormalized: ("take", (place in
        ``toks``, token, rule log-probability)), ("end", None) or ("reject", True) at a dead end."""
        eos = self.model.eos_id
        options = rule_at(w.state, self.rules, np.concatenate([toks, [eos]]) if can_end else toks) \
            if len(toks) or can_end else np.zeros(0)
        lps = options[:len(toks)]
        p = np.exp(options)
        z = p.sum()
        scale = 1.0
        if not z > 0:  # every allowed token ruled out, or each too improbable for a float (a tiny
            top = options.max() if len(options) else -math.inf  # temperature): drawn in proportion all the same
            if top == -math.inf:
                return "reject", True  # a dead end
            p = np.exp(options - top)
            z, scale = p.sum(), math.exp(top)
        if self.twin is not None:
            k = self.twin.step(w, toks, p, scale)
            if k < 0:
                return "reject", True  # the twin cannot go on from here: this canonical draw misses
        else:
            k = min(int(np.searchsorted(np.cumsum(p), w.rng.random() * z, side="right")), len(p) - 1)
        w.weight *= z * scale
        if can_end and k == len(lps):
            self.finish(w, edits, float(options[-1]))
            return "end", None
        return "take", (k, int(toks[k]), float(lps[k]))

    def _final_at(self, states: np.ndarray) -> np.ndarray:
        """Whether a string of the language may end at each of ``states`` (remembered: a draw at
        the context asks this of every state its tokens lead to, tens of thousands for an open
        language, and the next draw there of most of them again)."""
        if len(self._finals) + len(states) > FINALS_KEPT:
            self._finals.clear()
        got = np.zeros(len(states), bool)
        for i, s in enumerate(states.tolist()):
            known = self._finals.get(s)
            if known is None:
                known = self._finals[s] = self.automaton.final_edits(s) >= 0
            got[i] = known
        return got


def rule_scores(st: ModelState, rules: Decoding) -> RuleScores:
    """The decoding rules on a state's distribution (cached on the state)."""
    got = getattr(st, "_rules", None)
    if got is None:
        got = st._rules = RuleScores(st.logprobs[None], rules)
    return got


def rule_at(st: ModelState, rules: Decoding, toks) -> np.ndarray:
    """The rule-adjusted log-probabilities of ``toks`` after a state."""
    scores = rule_scores(st, rules)
    t = torch.from_numpy(np.asarray(toks, np.int64)).to(scores.x.device)
    return scores.at(torch.zeros_like(t), t).double().cpu().numpy()


def _draw_full(rng: random.Random, state: ModelState, scores: RuleScores) -> int:
    """One token from a whole (rule-adjusted) next-token distribution (its cumulative sums are
    cached on the state, which rejection sampling draws from again and again)."""
    c = getattr(state, "_cdf", None)
    if c is None:
        c = state._cdf = np.cumsum(torch.exp(scores.full()[0].double()).cpu().numpy())
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(c) - 1))
