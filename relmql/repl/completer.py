"""Tab completion for the shell: keywords, options (and their values), columns, functions, model
names and meta-commands, chosen by where the cursor is.

The context comes from a light scan of the current statement (the text after the last ``;``
before the cursor): no completion inside a string or a comment; after ``FROM`` model names;
after ``USING`` or ``SET`` option names, and an option's choices after it; in ``SELECT``,
``WHERE`` and ``GROUP BY`` columns and functions; otherwise keywords.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from prompt_toolkit.completion import Completer, Completion, PathCompleter
from prompt_toolkit.document import Document

from ..api.show import SHOW_WHAT as API_SHOW_WHAT
from .lexer import KEYWORDS

__all__ = ["RelmqlCompleter", "scan"]

# what may follow a complete clause, in the order people write them
CLAUSES = ("SELECT", "FROM", "MATCHING", "PREFIX", "PROMPT", "WHERE", "USING", "ORDER BY", "SAMPLE", "GROUP BY",
           "LIMIT", "EXPECT", "FOR EACH ROW IN")
STATEMENTS = ("SELECT", "MATCHING", "EXPLAIN", "SET", "SHOW")
SHOW_WHAT = tuple(what.upper() for what in API_SHOW_WHAT)
EXPR_KEYWORDS = ("NOT", "NULL", "TRUE", "FALSE")
AFTER_OPERAND = {"SELECT": ("AS",), "WHERE": ("AND", "OR", "NOT", "IN", "IS", "MATCHES", "NOT MATCHING"),
                 "EXPECT": ("AND", "OR", "AS"),
                 "FOR": ("WHERE", "LIMIT"), "GROUP": ()}
ORDER_KEYS = ("prob", "total_prob")
_CLAUSE_WORDS = {"SELECT", "FROM", "MATCHING", "PREFIX", "PROMPT", "WHERE", "EXPECT", "USING", "ORDER", "SAMPLE",
                 "GROUP", "LIMIT", "SET", "SHOW", "EXPLAIN", "FOR"}
_KEYWORDS = set(KEYWORDS)
_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]*\Z")
_LONG_WORD = re.compile(r"[A-Za-z0-9_.\-/]*\Z")
_IDENT = re.compile(r"(?<![\w.:])[^\W\d]\w*\Z|\Z")
_TOKEN = re.compile(r"""\s+|--[^\n]*|/\*.*?(?P<c>\*/|\Z)|'[^']*(?:''[^']*)*(?P<s>'|\Z)|"[^"]*(?:""[^"]*)*(?P<n>"|\Z)
                        |:\w+|[^\W\d]\w*|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|<=|>=|<>|!=|==|\|\||.""",
                    re.S | re.X)


def _in_from(tokens: List[str]) -> bool:
    """Whether ``tokens`` end inside a FROM list."""
    return RelmqlCompleter._clause([t.upper() for t in tokens])[0] == "FROM"


def scan(text: str) -> Tuple[List[str], Optional[str]]:
    """The tokens of ``text`` (whitespace and comments dropped) and the state it ends in:
    None, or ``"string"``, ``"name"`` or ``"comment"`` when it ends inside an unterminated one."""
    tokens: List[str] = []
    state = None
    for m in _TOKEN.finditer(text):
        tok = m.group(0)
        if tok[0].isspace():
            state = None
        elif tok.startswith("--"):
            state = "comment" if m.end() == len(text) else None
        elif tok.startswith("/*"):
            state = None if m.group("c") else "comment"
        else:
            state = "string" if m.group("s") == "" else "name" if m.group("n") == "" else None
            tokens.append(tok)
    return tokens, state


def _statement(tokens: List[str]) -> List[str]:
    """The tokens of the statement the cursor is in."""
    for i in range(len(tokens) - 1, -1, -1):
        if tokens[i] == ";":
            return tokens[i + 1:]
    return tokens


class RelmqlCompleter(Completer):
    """Completes relmql statements and the shell's meta-commands.

    ``options``: name → (meaning, choices); ``models``: a callable giving the model names to offer
    (the built-in ones and the session's); ``columns``: result columns; ``functions``: name →
    meaning; ``commands``: meta-command name (with its dot) → (arguments, meaning, kind of argument:
    models, modes, onoff, path, plot (a path, then plot kinds) or None); ``modes``: output formats.
    """

    def __init__(self, options: Dict[str, Tuple[str, Sequence[str]]], models: Callable[[], Iterable[str]],
                 columns: Sequence[str], functions: Dict[str, str],
                 commands: Optional[Dict[str, Tuple[str, str, Optional[str]]]] = None,
                 modes: Sequence[str] = ()):
        self.options = options
        self.models = models
        self.columns = tuple(columns)
        self.functions = functions
        self.commands = commands or {}
        self.modes = tuple(modes)
        self._paths = PathCompleter(expanduser=True)

    @classmethod
    def for_connection(cls, con, commands=None) -> "RelmqlCompleter":
        """A completer over relmql's own tables and ``con``'s models."""
        from ..records import COLUMNS, COMPUTED_COLUMNS
        from ..models import BUILTIN_MODELS
        from ..output import FORMATS
        from ..plan.expr import AGGREGATES, FUNCTIONS, ROW_FUNCTIONS
        from ..plan.options import OPTIONS

        def models():
            names = list(BUILTIN_MODELS)
            for name in [con.settings.get("model")] + con.models.names():
                if name and name not in names:
                    names.append(name)
            return names

        functions = {name: f.doc for name, f in FUNCTIONS.items()}
        functions.update(ROW_FUNCTIONS)
        functions.update(AGGREGATES)
        options = {name: (spec.doc, tuple(spec.choices) if spec.kind == "choice" else
                          (("true", "false") if spec.kind == "bool" else ()))
                   for name, spec in OPTIONS.items()}
        return cls(options, models, COLUMNS + COMPUTED_COLUMNS, functions, commands, FORMATS)

    # -- prompt_toolkit
    def get_completions(self, document: Document, complete_event):
        text = document.text_before_cursor
        if text.lstrip().startswith(".") and "\n" not in text.lstrip():
            yield from self._meta(text.lstrip(), document, complete_event)
            return
        tokens, state = scan(text)
        if state is not None:
            return
        long = _LONG_WORD.search(text).group(0)  # a model name may hold '-', '.' and '/'
        before, _ = scan(text[:len(text) - len(long)])
        if before and (before[-1].upper() == "FROM" or (before[-1] == "," and _in_from(before))) and long:
            word, tokens = long, before
        else:
            word = _IDENT.search(text).group(0)
            if not word and long:
                return  # right after a number or a model name: nothing to add
            tokens = scan(text[:len(text) - len(word)])[0] if word else tokens
        for value, meta, display in self.candidates(_statement(tokens), word):
            if value.lower().startswith(word.lower()):
                yield Completion(value, start_position=-len(word), display=display or value, display_meta=meta)

    def _meta(self, line: str, document, event):
        name, sep, arg = line.partition(" ")
        if not sep:
            for cmd, (args, meaning, _) in self.commands.items():
                if cmd.startswith(name.lower()):
                    yield Completion(cmd, start_position=-len(name), display_meta=meaning)
            return
        kind = self.commands.get(name.lower(), (None, None, None))[2]
        arg = arg.lstrip()
        if kind == "plot" and " " in arg:  # .plot FILE [kind] [log]: the words after the file
            from ..output.plot import PLOT_KINDS
            word = arg.rsplit(" ", 1)[1]
            for v in PLOT_KINDS + ("log",):
                if v.startswith(word.lower()):
                    yield Completion(v, start_position=-len(word))
            return
        if kind in ("path", "plot"):
            yield from self._paths.get_completions(Document(arg, len(arg)), event)
            return
        values = {"models": lambda: list(self.models()), "modes": lambda: list(self.modes),
                  "onoff": lambda: ["on", "off"]}.get(kind)
        if values is None or " " in arg:
            return
        for v in values():
            if v.lower().startswith(arg.lower()):
                yield Completion(v, start_position=-len(arg))

    # -- the candidates for a statement whose tokens before the cursor's word are ``tokens``
    def candidates(self, tokens: List[str], word: str) -> List[Tuple[str, str, Optional[str]]]:
        """(text to insert, meaning, what the menu shows or None) for the word after ``tokens``."""
        up = [t.upper() for t in tokens]
        prev = up[-1] if up else None
        used = {"ORDER BY" if t == "ORDER" else "GROUP BY" if t == "GROUP" else "FOR EACH ROW IN" if t == "FOR"
                else t for t in up}
        if up and up != ["EXPLAIN"]:
            used.add("SELECT")  # SELECT comes first or not at all
        clauses = tuple(c for c in CLAUSES if c not in used)
        if prev is None:
            return self._keywords(STATEMENTS + CLAUSES)
        if prev == "EXPLAIN" and len(up) == 1:
            return self._keywords(clauses)
        if prev == "FROM" or (prev == "," and self._clause(up)[0] == "FROM"):
            return self._models(quoted=False)
        if prev == "SHOW":
            return self._keywords(SHOW_WHAT) + self._options()
        if prev in ("ORDER", "GROUP"):
            return self._keywords(("BY",))
        clause, at = self._clause(up)
        where = _Where(tokens, up, prev, at, clauses)
        by_clause = _BY_CLAUSE.get(clause)
        return by_clause(self, where) if by_clause is not None else self._keywords(clauses)

    def _in_set(self, w: "_Where"):
        after = w.tokens[w.at + 1:]
        if not after:
            return self._options()
        if len(after) == 1:
            return self._keywords(("=", "TO"))
        if len(after) == 2 and after[1].upper() in ("=", "TO"):
            name = after[0].lower()
            if name == "model":
                return self._models(quoted=True)
            return [(f"'{c}'", "", None) for c in self.options.get(name, ("", ()))[1]
                    if c not in ("true", "false")] + \
                [(c.upper(), "", None) for c in self.options.get(name, ("", ()))[1] if c in ("true", "false")]
        return []

    def _in_using(self, w: "_Where"):
        if w.prev in ("USING", ","):
            return self._options()
        name = w.tokens[-1].lower()
        if name in self.options and w.up[-2:-1] in (["USING"], [","]):
            choices = self.options[name][1]
            if choices:
                return [(c, "", None) for c in choices] + self._keywords(w.clauses)
        return self._keywords(w.clauses)

    def _in_order(self, w: "_Where"):
        if w.prev in ("BY", ","):
            return [(k, "", None) for k in ORDER_KEYS]
        if w.prev in ("ASC", "DESC"):
            return self._keywords(w.clauses)
        return self._keywords(("DESC", "ASC") + w.clauses)

    def _in_expression(self, w: "_Where"):
        """SELECT, WHERE, GROUP BY, FOR EACH ROW IN and EXPECT: columns and functions, or what
        follows an operand."""
        clause = w.up[w.at]
        if self._after_operand(w.tokens):
            more = AFTER_OPERAND[clause] if w.prev != "*" else ()
            return self._keywords(more + (w.clauses if clause != "FOR" else ()))
        out = self._columns() + self._functions()
        if clause == "WHERE":
            out += self._keywords(EXPR_KEYWORDS)
        return out

    def _in_models(self, w: "_Where"):  # after a model: another, or the next clause
        return self._keywords((",",) + w.clauses)

    def _in_prompt(self, w: "_Where"):
        if self._after_operand(w.tokens):
            return self._keywords(w.clauses)
        return [("chat(", "a conversation, rendered by the model's chat template", "chat()")] + self._functions()

    def _in_operand(self, w: "_Where"):
        """MATCHING, PREFIX, SAMPLE and LIMIT: their one operand, then the next clause."""
        if self._after_operand(w.tokens):
            return self._keywords(w.clauses)
        return self._functions() if w.up[w.at] in ("MATCHING", "PREFIX") else []

    @staticmethod
    def _clause(up: List[str]) -> Tuple[Optional[str], int]:
        depth = 0
        for i in range(len(up) - 1, -1, -1):
            t = up[i]
            if t == ")":
                depth += 1
            elif t == "(":
                depth -= 1
            elif depth <= 0 and t in _CLAUSE_WORDS:
                if t == "MATCHING" and i > 0 and up[i - 1] == "NOT":
                    continue
                return t, i
        return None, -1

    @staticmethod
    def _after_operand(tokens: List[str]) -> bool:
        """Whether the last token ends an operand (so an operator or a keyword comes next)."""
        t = tokens[-1]
        u = t.upper()
        if u in _KEYWORDS:
            return u in ("NULL", "TRUE", "FALSE", "ASC", "DESC")
        if t == ")":
            return True
        if t == "*":  # SELECT * (not a product)
            return len(tokens) > 1 and tokens[-2].upper() in ("SELECT", ",")
        return t[0] in "'\":_" or t[0].isalnum() or (t[0] == "." and len(t) > 1)

    @staticmethod
    def _keywords(words: Iterable[str]):
        return [(w, "", None) for w in dict.fromkeys(words)]

    def _options(self):
        return [(name, doc, None) for name, (doc, _) in self.options.items()]

    def _models(self, quoted: bool):
        out = []
        for m in self.models():
            value = f"'{m}'" if quoted or not _MODEL_NAME.match(m) else m
            out.append((value, "model", None))
        return out

    def _columns(self):
        return [(c, "column", None) for c in self.columns]

    def _functions(self):
        return [(f + "(", doc, f + "()") for f, doc in self.functions.items()]


class _Where(NamedTuple):
    """Where the cursor is in a statement, for ``RelmqlCompleter.candidates``."""
    tokens: List[str]  # the statement's tokens before the cursor's word
    up: List[str]  # the same, upper-cased
    prev: str  # the last of ``up``
    at: int  # the index of the clause the cursor is in
    clauses: Tuple[str, ...]  # the clauses the statement does not have yet


# the candidates inside each clause, by its first word
_BY_CLAUSE: Dict[str, Callable[[RelmqlCompleter, _Where], list]] = {
    "SET": RelmqlCompleter._in_set, "USING": RelmqlCompleter._in_using, "ORDER": RelmqlCompleter._in_order,
    **dict.fromkeys(("SELECT", "WHERE", "GROUP", "FOR", "EXPECT"), RelmqlCompleter._in_expression),
    "FROM": RelmqlCompleter._in_models, "PROMPT": RelmqlCompleter._in_prompt,
    **dict.fromkeys(("MATCHING", "PREFIX", "SAMPLE", "LIMIT"), RelmqlCompleter._in_operand),
}
