"""The tokenizer's own split regex (a ``Split`` pre-tokenizer's, GPT-2's, Llama 3's, Qwen2's ...)
compiled into chunking rules whose DFAs follow the backtracking engine's leftmost-first choice of
match. Design: docs/tokenizers.md."""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from ...errors import ModelError
from .classes import ENCODABLE, _atom_codepoints, _multi_char_folds
from .rules import GPT2_PATTERN, Alternative, ChunkRules

_MAX_REPEAT = 64  # {m,n} with larger bounds is not expanded
_CHAR, _SPLIT, _MATCH, _LOOK = range(4)


class _Unsupported(Exception):
    """A construct of a split regex that relmql does not model (the message says which)."""


class _SplitParser:
    """Parses the supported subset of Oniguruma's (Ruby) syntax into a small tree:
    ``("atom", k)`` (``k`` indexes ``atoms``: one-character patterns as the engine reads them),
    ``("cat", items)``, ``("alt", branches)``, ``("rep", node, lo, hi, greedy)`` (``hi`` None:
    unbounded) and, last in a top-level alternative only, ``("look", k)`` for ``(?!C)``."""

    def __init__(self, pattern: str):
        self.p = pattern
        self.i = 0
        self.atoms: List[str] = []
        self.literal: Dict[int, str] = {}  # atom -> its character, for literals

    def fail(self, what: str):
        raise _Unsupported(f"{what} (at offset {self.i})")

    def peek(self, s: str) -> bool:
        return self.p.startswith(s, self.i)

    def closing(self, j: int) -> int:
        """Just past the '}' of the escape ``\\p{..}`` or ``\\x{..}`` at ``j``."""
        end = self.p.find("}", j)
        if end < 0:
            self.fail("an unclosed escape")
        return end + 1

    def branches(self) -> List[Tuple[tuple, Optional[int]]]:
        """The top-level alternatives, each with the atom of its trailing look-ahead (or None)."""
        ci = False
        if self.peek("(?i)"):  # only at the start: elsewhere Oniguruma applies it up to the end of the group
            ci, self.i = True, 4
        out = []
        while True:
            items = self.seq(ci, top=True)
            look = items.pop()[1] if items and items[-1][0] == "look" else None
            out.append((("cat", items), look))
            if self.i == len(self.p):
                return out
            if self.p[self.i] == ")":
                self.fail("an unmatched ')'")
            self.i += 1  # '|'

    def alt(self, ci: bool) -> tuple:
        branches = [("cat", self.seq(ci, top=False))]
        while self.peek("|"):
            self.i += 1
            branches.append(("cat", self.seq(ci, top=False)))
        if not self.peek(")"):
            self.fail("an unclosed group")
        self.i += 1
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def seq(self, ci: bool, top: bool) -> list:
        items: list = []
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            if items and items[-1][0] == "look":
                self.fail("a look-ahead that does not end its alternative")
            item = self.item(ci)
            if item[0] == "look" and not top:
                self.fail("a look-ahead inside a group")
            items.append(item)
        return items

    def item(self, ci: bool) -> tuple:
        node = self.atom(ci)
        if self.i == len(self.p) or self.p[self.i] not in "?*+{":
            return node
        if node[0] == "look":
            self.fail("a repeated look-ahead")
        if ci:
            self.fail("a repetition under (?i)")
        greedy = True
        if self.p[self.i] == "{":
            m = re.compile(r"\{(\d*)(,?)(\d*)\}").match(self.p, self.i)
            if not m or not (m.group(1) or m.group(2) and m.group(3)):
                self.fail("a '{' that is not a repetition")
            lo = int(m.group(1) or 0)
            hi = lo if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
            self.i = m.end()
            if self.peek("?") and m.group(2):
                greedy = False
                self.i += 1
            elif self.i < len(self.p) and self.p[self.i] in "?+":  # {n}? and {m,n}+: not lazy, possessive
                self.fail("a quantifier after {m,n}")
        else:
            lo, hi = {"?": (0, 1), "*": (0, None), "+": (1, None)}[self.p[self.i]]
            self.i += 1
            if self.peek("?"):
                greedy = False
                self.i += 1
            elif self.peek("+"):
                self.fail("a possessive quantifier")
        if self.i < len(self.p) and self.p[self.i] in "?*+{":
            self.fail("a repeated quantifier")
        if (hi is not None and (hi < lo or hi == 0)) or lo > _MAX_REPEAT or (hi or 0) > _MAX_REPEAT:
            self.fail(f"the repetition {{{lo},{'' if hi is None else hi}}}")
        if (hi is None or hi > 1) and _nullable(node):
            self.fail("a repetition of something that can match nothing")
        return ("rep", node, lo, hi, greedy)

    def atom(self, ci: bool) -> tuple:
        c = self.p[self.i]
        if c == "(":
            return self.group(ci)
        start = self.i
        literal = None
        if c == "[":
            self.i = self.class_end()
        elif c == "\\":
            literal = self.escape()
        elif c in "^$":
            self.fail("an anchor")
        elif c in "?*+{":
            self.fail("a quantifier with nothing to repeat")
        else:
            self.i += 1
            literal = c if c != "." else None
        source = self.p[start:self.i]
        if ci:
            if literal is None:
                self.fail("a class or an escape under (?i)")
            if max(len(literal.casefold()), len(literal.lower()), len(literal.upper())) > 1:
                self.fail(f"{literal!r} under (?i), whose case folding has several characters")
            source = f"(?i:{source})"
        if source not in self.atoms:
            self.atoms.append(source)
        k = self.atoms.index(source)
        if literal is not None:
            self.literal[k] = literal
        return ("atom", k)

    def group(self, ci: bool) -> tuple:
        """The group at ``(``: ``(?:..)``, ``(?i:..)``, ``(?-i:..)``, a capturing group, or a
        look-ahead ``(?!C)`` of one character."""
        for opener, flag in (("(?:", ci), ("(?i:", True), ("(?-i:", False)):
            if self.peek(opener):
                self.i += len(opener)
                return self.alt(flag)
        if self.peek("(?!"):
            self.i += 3
            inner = self.alt(ci)
            while inner[0] == "cat" and len(inner[1]) == 1:
                inner = inner[1][0]
            if inner[0] != "atom":
                self.fail("a look-ahead of more than one character")
            return ("look", inner[1])
        if self.peek("(?"):
            self.fail(f"the group {self.p[self.i:self.i + 4]!r}")
        self.i += 1  # a capturing group: the same match
        return self.alt(ci)

    def class_end(self) -> int:
        """Just past the ``]`` that closes the character class at ``[``."""
        p = self.p
        j = self.i + 1 + self.peek("[^")
        j += p.startswith("]", j)
        depth = 1
        while j < len(p):
            if p[j] == "\\":
                j = self.closing(j) if p[j + 1:j + 2] in ("p", "P", "x") and p[j + 2:j + 3] == "{" else j + 2
                continue
            depth += {"[": 1, "]": -1}.get(p[j], 0)
            j += 1
            if depth == 0:
                break
        if depth:
            self.fail("an unclosed character class")
        return j

    def escape(self) -> Optional[str]:
        """Step over the escape at ``\\``; the character it stands for where it is a literal."""
        p = self.p
        e = p[self.i + 1:self.i + 2]
        if e in ("p", "P", "x") and p[self.i + 2:self.i + 3] == "{":
            self.i = self.closing(self.i)
        elif e == "x":
            self.i += 4
        elif e == "u":
            self.i += 6
        elif e and e in "sSdDwWhHtnrfvae":
            self.i += 2
        elif e and e.isascii() and not e.isalnum():
            self.i += 2
            return e
        else:
            self.fail(f"the escape \\{e}")
        return None


def _nullable(node: tuple) -> bool:
    kind = node[0]
    if kind == "atom":
        return False
    if kind == "cat":
        return all(_nullable(x) for x in node[1])
    if kind == "alt":
        return any(_nullable(x) for x in node[1])
    return node[2] == 0 or _nullable(node[1])  # rep


class _PriorityNfa:
    """An NFA whose epsilon moves are ordered by priority (a backtracking engine's order)."""

    def __init__(self):
        self.kind: List[int] = []
        self.arg: List[int] = []
        self.next: List[List[int]] = []

    def add(self, kind: int, nxt: List[int], arg: int = -1) -> int:
        self.kind.append(kind)
        self.arg.append(arg)
        self.next.append(nxt)
        return len(self.kind) - 1

    def build(self, node: tuple, nxt: int) -> int:
        """The start of ``node``, continuing to ``nxt``."""
        kind = node[0]
        if kind == "atom":
            return self.add(_CHAR, [nxt], node[1])
        if kind == "cat":
            for item in reversed(node[1]):
                nxt = self.build(item, nxt)
            return nxt
        if kind == "alt":
            return self.add(_SPLIT, [self.build(b, nxt) for b in node[1]])
        _, body, lo, hi, greedy = node
        tail = nxt
        if hi is None:
            tail = self.add(_SPLIT, [])
            again = self.build(body, tail)
            self.next[tail] = [again, nxt] if greedy else [nxt, again]
        else:
            for _ in range(hi - lo):  # X{0,2} = (X(X)?)?
                again = self.build(body, tail)
                tail = self.add(_SPLIT, [again, nxt] if greedy else [nxt, again])
        for _ in range(lo):
            tail = self.build(body, tail)
        return tail

    def closure(self, starts: Sequence[int]) -> Tuple[Tuple[int, ...], bool]:
        """The threads reached from ``starts`` in priority order (character and look-ahead
        states), and whether a match was reached (which drops the threads after it)."""
        out: List[int] = []
        seen = set()
        matched = False
        stack = list(reversed(starts))
        while stack and not matched:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            k = self.kind[s]
            if k == _SPLIT:
                stack.extend(reversed(self.next[s]))
            elif k == _MATCH:
                matched = True
            else:
                out.append(s)
        return tuple(out), matched

    def case_folded_runs(self, literal: Dict[int, str]) -> List[str]:
        """Strings of 2 or 3 case-insensitive literal characters that may match one after another."""
        def after(s):  # the character states right after state s
            out, stack, seen = [], list(self.next[s]), set()
            while stack:
                t = stack.pop()
                if t not in seen:
                    seen.add(t)
                    if self.kind[t] == _SPLIT:
                        stack.extend(self.next[t])
                    elif self.kind[t] == _CHAR:
                        out.append(t)
            return out
        runs = set()
        for s in range(len(self.kind)):
            if self.kind[s] == _CHAR and self.arg[s] in literal:
                for t in after(s):
                    if self.arg[t] in literal:
                        two = literal[self.arg[s]] + literal[self.arg[t]]
                        runs.add(two)
                        runs.update(two + literal[self.arg[u]] for u in after(t) if self.arg[u] in literal)
        return sorted(runs)


def _leftmost_first(nfa: _PriorityNfa, start: int, char_classes: Dict[int, FrozenSet[int]],
                    look: Optional[FrozenSet[int]], nclasses: int) -> Alternative:
    """The DFA of one alternative over class ids: a state is (ordered threads, matched); its
    accepting states are those with a match, or, with a look-ahead, those with the look-ahead
    thread (confirmed by the next character, which then drops the threads after it)."""
    first = nfa.closure([start])
    ids = {first: 0}
    todo = [first]
    delta: List[Dict[int, int]] = [{}]
    while todo:
        cur = todo.pop()
        threads, _ = cur
        for k in range(nclasses):
            moved = []
            for t in threads:
                if nfa.kind[t] == _LOOK:
                    if k not in look:
                        break  # the match before k is confirmed: the threads after it are dropped
                    continue
                if k in char_classes[nfa.arg[t]]:
                    moved.append(nfa.next[t][0])
            nxt = nfa.closure(moved)
            if not nxt[0] and not nxt[1]:
                continue
            if nxt not in ids:
                ids[nxt] = len(ids)
                delta.append({})
                todo.append(nxt)
            delta[ids[cur]][k] = ids[nxt]
    if look is None:
        accepting = frozenset(i for (_, matched), i in ids.items() if matched)
    else:
        accepting = frozenset(i for (threads, _), i in ids.items() if any(nfa.kind[t] == _LOOK for t in threads))
    return Alternative(tuple(delta), accepting, look)



@functools.lru_cache(maxsize=None)
def split_rules(pattern: str) -> ChunkRules:
    """The chunking rules of a Split pre-tokenizer (behavior Isolated) with this regex.

    Raises ModelError for what relmql does not model: constructs outside the subset (top-level
    alternatives, groups ``(?:)`` ``(?i:)`` ``()``, nested alternatives, one-character atoms —
    literals, ``[...]`` classes, ``\\p{..}``, ``\\s``, ``\\S``, ``\\d``, ``.`` and the like —,
    the quantifiers ``? * + {m,n}`` greedy or lazy, and one ``(?!C)`` ending a top-level
    alternative), an alternative that can match nothing, and text no alternative matches
    (the engine would leave it between matches, as a chunk of its own)."""
    try:
        parser = _SplitParser(pattern)
        branches = parser.branches()
        # consecutive alternatives without a look-ahead are one leftmost-first DFA (the first
        # that matches wins either way); one with a look-ahead is an alternative of its own
        groups: List[Tuple[List[tuple], Optional[int]]] = []
        for node, look in branches:
            if _nullable(node):
                raise _Unsupported("an alternative that matches the empty string")
            if look is None and groups and groups[-1][1] is None:
                groups[-1][0].append(node)
            else:
                groups.append(([node], look))
        nfa = _PriorityNfa()
        starts = []
        for nodes, look in groups:
            end = nfa.add(_MATCH, [])
            if look is not None:
                end = nfa.add(_LOOK, [end], look)
            starts.append(nfa.build(("alt", nodes), end))
        case_insensitive = {k: c for k, c in parser.literal.items() if parser.atoms[k].startswith("(?i:")}
        folds = _multi_char_folds(nfa.case_folded_runs(case_insensitive))
        if folds:
            raise _Unsupported("(?i) matches {!r} to the one character {!r}".format(*folds[0]))
        sets = _atom_codepoints(parser.atoms, parser.literal)
        classes = [ENCODABLE]
        for cs in sets:
            classes = [part for c in classes for part in (c.intersection(cs), c.difference(cs)) if part]
        member = [frozenset(k for k, c in enumerate(classes) if c.intersection(cs)) for cs in sets]
        char_classes = dict(enumerate(member))
        alts = tuple(_leftmost_first(nfa, st, char_classes, None if look is None else member[look], len(classes))
                     for st, (_, look) in zip(starts, groups))
        for k in range(len(classes)):
            if not any(a.not_before is None and a.delta[0].get(k, -1) in a.accepting for a in alts):
                raise _Unsupported(f"no alternative matches the character {chr(next(classes[k].codepoints()))!r} "
                                   "alone (text between matches is not modelled)")
    except _Unsupported as e:
        raise ModelError(f"canonical tokenization does not support the split regex {pattern!r}: {e}") from None
    name = "gpt2" if pattern == GPT2_PATTERN else "split-" + hashlib.sha1(pattern.encode()).hexdigest()[:12]
    return ChunkRules(name, tuple(classes), alts)


@functools.lru_cache(maxsize=None)
def gpt2_rules() -> ChunkRules:
    """GPT-2's split regex, with its classes as the tokenizers library defines them."""
    return split_rules(GPT2_PATTERN)

