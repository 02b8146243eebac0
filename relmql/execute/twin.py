"""A sampler's canonical twin: local draws over every tokenization that measure the canonical
tokenizations apart (design: docs/executor.md, "Inside the sampler")."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

from ..automata.tokens import TokenAutomaton


class Twin:
    """The same language's canonical automaton beside a local sampler's. The even draws follow it
    (their tokens drawn among those it allows, and with ``eos`` the end of text where its string
    may end) and measure the canonical tokenizations, the odd ones the others (``Mass.strata``).
    A draw's ``twin_node`` is the twin's state after the same tokens (None once it has left the
    twin) and its ``twin_weight`` the product of the twin's normalizers."""

    def __init__(self, automaton: TokenAutomaton):
        self.automaton = automaton
        self._starts: Dict[Tuple[int, ...], Optional[int]] = {}  # prefix path -> the twin's state after it

    def start(self, prefix: Tuple[int, ...]) -> Optional[int]:
        """The twin's state after a prefix path (None where it has none)."""
        if prefix not in self._starts:
            self._starts[prefix] = self.automaton.state_after(prefix, len(prefix))
        return self._starts[prefix]

    def ends(self, w) -> bool:
        """Whether the walker's string is a canonical tokenization (the twin followed it to a final state)."""
        return w.twin_node is not None and self.automaton.is_final(w.twin_node)

    def step(self, w, toks: np.ndarray, p: np.ndarray, scale: float) -> int:
        """A local step: the index of the token drawn among ``toks`` (probabilities ``p`` · ``scale``;
        ``p`` has one more entry, the end of text, where a string may end), from all of them or, for
        a canonical draw, from those the twin allows (the end of text where the twin's string may
        end); -1 where a canonical draw finds none. Moves the twin's state and its weight along."""
        allowed = np.zeros(len(p), bool)
        targets = np.full(len(p), -1, np.int64)
        if w.twin_node is not None:
            arcs = self.automaton.arcs(w.twin_node)
            ttoks, ttgts = arcs.tokens[arcs.n_prefix:], arcs.targets[arcs.n_prefix:]  # sorted by token
            if len(ttoks) and len(toks):
                at = np.minimum(np.searchsorted(ttoks, toks), len(ttoks) - 1)
                hit = ttoks[at] == toks
                allowed[:len(toks)] = hit
                targets[:len(toks)][hit] = ttgts[at][hit]
            if len(p) > len(toks):
                allowed[len(toks)] = self.automaton.is_final(w.twin_node)
        zc = float(p[allowed].sum())
        pick = np.where(allowed, p, 0.0) if w.canonical else p
        total = zc if w.canonical else float(p.sum())
        if not total > 0:
            return -1
        k = min(int(np.searchsorted(np.cumsum(pick), w.rng.random() * total, side="right")), len(p) - 1)
        if allowed[k]:  # (the end of text leaves the twin where its string ends)
            w.twin_node = int(targets[k]) if k < len(toks) else w.twin_node
            w.twin_weight *= zc * scale
        else:
            w.twin_node, w.twin_weight = None, 0.0
        return k
