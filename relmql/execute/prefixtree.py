"""A small prefix's whole token tree, read in one model call."""

from __future__ import annotations

from typing import Callable, List, Optional

import numpy as np

from ..automata.tokens import TokenAutomaton

TREE_TOKENS = 64  # tokens of the chains (the start token of each included) read in that call


def prefix_chains(automaton: TokenAutomaton, root, make: Callable, ends: Callable[[int], bool], max_tokens: int,
                  context: int, most: int) -> Optional[List[list]]:
    """The chains of nodes from ``root`` to each leaf of the prefix's token tree, to be read in one
    model call: under ``prob`` every prefix's distribution is needed before the first row, and
    level by level a tree takes a call per token of its longest prefix ('The (cat|dog)': 2 calls
    of about 0.1 s each on SmolLM2 on a CPU, where one call reads both chains). ``make(parent,
    token, state)`` makes a child node; ``ends(state)``: whether a string can end at a state.

    None where the level-by-level search is needed or as good: a tree of one chain (a forced
    chain reads it whole already), chains of more than ``TREE_TOKENS`` tokens or more than
    ``most`` of them, a node where the prefix both ends and goes on, or a string both ends and
    goes on (its children would be read twice), or a node past ``max_tokens`` prefix tokens or
    the model's ``context``."""
    chains: List[list] = []
    read = 0
    stack = [[root]]
    while stack:
        path = stack.pop()
        node = path[-1]
        arcs = automaton.arcs(node.state)
        on = np.flatnonzero(arcs.prefix)
        if not len(on):  # the prefix ends here
            read += len(path)
            if len(path) == 1 or read > TREE_TOKENS or len(chains) >= most:
                return None
            chains.append(path)
            continue
        if len(on) < len(arcs) or ends(node.state) or node.npre >= max_tokens or node.npre + 2 > context \
                or len(stack) + len(on) > TREE_TOKENS:
            return None
        for i in reversed(on.tolist()):
            stack.append(path + [make(node, int(arcs.tokens[i]), int(arcs.targets[i]))])
    return chains if len(chains) > 1 else None
