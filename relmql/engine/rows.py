"""Result rows as expressions see them: columns, capture groups, parameters, scores under other models."""

from __future__ import annotations

import functools
import re
from typing import Optional

from ..automata.language import levenshtein, nearest, unedited, viable_length
from ..errors import Error
from ..execute import Mass, Row
from ..plan import QueryPlan, evaluate
from ..plan.expr import Env, truth
from ..plan.models import under_name
from ..plan.options import PlanError, shown
from ..records import COLUMNS, COMPUTED_COLUMNS
from ..rowcontext import RowContext
from ..syntax import ast as A
from ..syntax.regexes import compiled


class RowEnv(Env):
    """A result row as expressions see it: its columns, the capture groups of MATCHING in its
    text (an edited text's from the nearest unedited string), the query's parameters, and, for
    probability(), how the language was measured (``mass``). ``beyond`` is set when an
    expression reads more of the row than its prefix: a column other than ``prefix``, or a
    capture group that ends after the prefix (probability() tells by it which GROUP BY keys the
    prefix fixes)."""

    beyond = False

    def __init__(self, plan: QueryPlan, row: Optional[Row], rank: Optional[int], regex, mass: Optional[Mass] = None,
                 context: Optional[RowContext] = None):
        self.plan, self.row, self.rank, self._regex, self.mass = plan, row, rank, regex, mass
        self.context = context
        self._match = False

    def column(self, node: A.Column):
        name = node.name
        row = self.row
        if name == "model" and name not in self.plan.group_names:  # a capture group of that name comes first
            return self.plan.model.name
        if name == "prompt" and name not in self.plan.group_names:
            if self.context is not None and self.context.prompt is not None:
                return self.context.prompt
            return None if self.plan.prompt is None else self.plan.prompt.text
        if name in COLUMNS or name in COMPUTED_COLUMNS:
            self.beyond = self.beyond or name != "prefix"
        if name == "rank":
            return self.rank
        if name == "edit_position":
            return None if row is None or not row.edits else edit_position(self.plan.matching, row.text)
        if name in COLUMNS:
            if row is None:
                return None
            value = getattr(row, name)
            return list(value) if name == "tokens" else value
        return self.group(name, node)

    def under(self, node: A.Call):
        self.beyond = True
        name = under_name(node, self.plan.param_dict(), self.plan.source)
        if self.row is None or self.context is None:
            return None
        return self.context.score(name, self.row, node.span)

    def param(self, node: A.Param):
        params = self.plan.param_dict()
        if node.name not in params:
            raise PlanError(f"parameter :{node.name} has no value", node.span, self.plan.source)
        return params[node.name]

    def group(self, key, node):
        if self._match is False:
            self._match = None
            if self.row is not None and self._regex is not None:
                self._match = self._regex.fullmatch(self.row.text)
                if self._match is None and self.row.edits:
                    self._match = unedited_match(self.plan.matching, self.row.text, self.row.edits)
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise PlanError(f"group() takes a group number or name, not {shown(key)}", node.span, self.plan.source)
        if isinstance(key, int) and not 0 <= key <= (self._regex.groups if self._regex else 0):
            n = self._regex.groups if self._regex else 0
            raise PlanError(f"MATCHING has {n} group{'' if n == 1 else 's'}; there is no group {key}", node.span,
                            self.plan.source)
        if isinstance(key, str) and (self._regex is None or key not in self._regex.groupindex):
            raise PlanError(f"MATCHING has no group named {key!r}", node.span, self.plan.source)
        if self._match is None:
            return None
        if not self.beyond and self._match.end(key) > self._prefix_end():
            self.beyond = True
        return self._match.group(key)

    def _prefix_end(self) -> int:
        """Where the prefix ends in the text the capture groups come from: the row's own text,
        or the unedited string nearest to it (split, as the language is, after its longest
        beginning that PREFIX matches)."""
        row, text = self.row, self._match.string
        if text == row.text and text.startswith(row.prefix):
            return len(row.prefix)
        return prefix_end(self.plan.prefix, text)


def edit_position(pattern: str, text: str) -> int:
    """Where the first edit falls in an edited ``text``: the length, in characters, of its
    longest beginning that some string of the unedited ``pattern`` begins with."""
    dfa, start = unedited(pattern)
    data = text.encode("utf-8")
    return len(data[:viable_length(dfa, start, data)].decode("utf-8", errors="ignore"))


@functools.lru_cache(maxsize=1 << 16)
def prefix_end(prefix: Optional[str], text: str) -> int:
    """The length of the longest beginning of ``text`` that the regex ``prefix`` matches (0
    when there is no prefix, or none matches; -1 when ``re`` cannot read it, so that no
    capture group counts as the prefix's)."""
    if not prefix:
        return 0
    try:
        pattern = compiled(prefix)
    except (re.error, RecursionError, OverflowError, ValueError):
        return -1
    return next((k for k in range(len(text), -1, -1) if pattern.fullmatch(text, 0, k)), 0)


@functools.lru_cache(maxsize=1 << 16)  # samples repeat
def unedited_match(pattern: str, text: str, edits: int):
    """The ``re`` match of the string of ``pattern`` nearest to an edited ``text`` (at most
    ``edits`` character edits away), so that an edited string keeps the capture groups it was
    made from. The search counts byte edits: a character edit is at most 4 of them (UTF-8)."""
    dfa, start = unedited(pattern)
    found = nearest(dfa, start, text.encode("utf-8"), 4 * edits)
    if found is None:
        return None
    found_text = found.decode("utf-8", errors="replace")
    return compiled(pattern).fullmatch(found_text) if levenshtein(found_text, text) <= edits else None



def match_regex(plan: QueryPlan):
    """MATCHING as a Python ``re`` pattern, for capture groups (None where ``re`` cannot take it)."""
    try:
        return compiled(plan.matching)
    except (re.error, RecursionError, OverflowError, ValueError):
        return None



def value_of(node, env, source, condition: bool = False):
    """The value of expression ``node`` in ``env`` (``condition``: as a truth value), errors placed in ``source``."""
    try:
        value = evaluate(node, env)
        return truth(value, node) if condition else value
    except Error as e:
        if e.source is None:
            e.source = source
        raise

