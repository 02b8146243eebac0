"""Text → statements, with Lark (LALR) and the grammar in ``grammar/relmql.lark``."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import List, Optional

from lark import Lark, Token, Transformer_NonRecursive, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from ..errors import Error, ParseError, closest
from . import ast as A


def grammar_path() -> Path:
    """``relmql.lark``: packaged beside the code in a wheel, or in ``grammar/`` of a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "grammar" / "relmql.lark", here.parent.parent / "grammar" / "relmql.lark"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("relmql.lark not found: the installation is incomplete")


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(grammar_path().read_text(encoding="utf-8"), start="script", parser="lalr",
                propagate_positions=True, maybe_placeholders=False)


# readable names of terminals for "expected ..." messages
_TERMINALS = {
    "NAME": "a name", "QUOTED_NAME": "a name", "MODEL_NAME": "a model name", "STRING": "a string",
    "PARAM": "a :parameter", "NUMBER": "a number", "COMPARE": "a comparison", "CONCAT": "'||'",
    "ADD_OP": "'+' or '-'", "MUL_OP": "'/' or '%'", "STAR": "'*'", "SEMICOLON": "';'", "COMMA": "','",
    "LPAR": "'('", "RPAR": "')'", "EQUAL": "'='", "$END": "the end",
}
_CLAUSES = ("SELECT", "FROM", "MATCHING", "PREFIX", "PROMPT", "WHERE", "USING", "ORDER", "SAMPLE", "GROUP", "LIMIT",
            "TEST", "EXPECT")


def _describe(expected) -> str:
    expected = set(expected) - ({"$END"} if "SEMICOLON" in expected else set())  # ';' says it may end
    names = sorted({_TERMINALS.get(t, t) for t in expected if not t.startswith("__")})
    clauses = [c for c in _CLAUSES if c in names]
    others = [n for n in names if n not in clauses]
    ordered = others + clauses
    if len(ordered) > 8:
        ordered = ordered[:8] + ["..."]
    return ", ".join(ordered)


def _did_you_mean(word: str, expected) -> Optional[str]:
    if not word.isalpha():
        return None
    keywords = [t for t in expected if t.isalpha() and t.isupper() and t not in _TERMINALS]
    best = closest(word.upper(), keywords, cutoff=0.85)  # a word one or two letters off, not a column (prob)
    return f"did you mean {best}?" if best else None


def _token_text(tok: Token) -> str:
    return "the end" if tok.type == "$END" else repr(str(tok))


def parse(text: str) -> List[A.Statement]:
    """The statements of ``text`` (a script: statements separated by ``;``)."""
    if not isinstance(text, str):
        raise ParseError(f"a query must be a string, not {type(text).__name__}")
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error(e, text) from None
    try:
        return _ToAst(text).transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, Error):
            raise e.orig_exc from None
        if isinstance(e.orig_exc, RecursionError):
            raise _too_deep(text) from None
        raise
    except RecursionError:
        raise _too_deep(text) from None


def _too_deep(text: str) -> ParseError:
    return ParseError("the statement is nested too deeply", (0, len(text)), text)


def parse_one(text: str) -> A.Statement:
    """The single statement of ``text``."""
    stmts = parse(text)
    if len(stmts) != 1:
        raise ParseError(f"expected one statement, found {len(stmts)}", (0, len(text)) if stmts else None, text)
    return stmts[0]


def _syntax_error(e: UnexpectedInput, text: str) -> ParseError:
    if isinstance(e, UnexpectedCharacters):
        pos = e.pos_in_stream
        ch = text[pos]
        if ch == "'":
            return ParseError("unterminated string: a quote inside a string is written ''", (pos, len(text)), text)
        if ch == '"':
            return ParseError('unterminated quoted name', (pos, len(text)), text)
        if text.startswith("/*", pos):
            return ParseError("unterminated comment", (pos, len(text)), text)
        if ch in "\u2018\u2019\u201c\u201d":  # pasted from a word processor or a chat
            return ParseError(f"unexpected {ch!r}, a typographic quote", (pos, pos + 1), text,
                              hint="strings are written with straight quotes: 'The cat' (names with \"...\")")
        expected = _describe(e.allowed or ())
        # a whole word where it cannot go reads better than its first character
        m = re.compile(r"[A-Za-z_][\w\-.]*|.", re.S).match(text, pos)  # "." also: \x1f is not WS here
        word = m.group(0)
        return ParseError(f"unexpected {word!r}" + (f"; expected {expected}" if expected else ""),
                          (pos, pos + len(word)), text, hint=_did_you_mean(word, e.allowed or ()))
    if isinstance(e, UnexpectedEOF):
        end = len(text.rstrip())  # the caret goes just after the last word, not on a blank last line
        return ParseError(f"the statement ends early; expected {_describe(e.expected)}", (end, end + 1), text,
                          hint=_ends_early_hint(text[:end]))
    if isinstance(e, UnexpectedToken):
        tok = e.token
        # what the parser would take next (LALR's ``expected`` may hold tokens no statement allows there)
        expected = e.accepts or e.expected
        if tok.type == "$END":
            # Lark's end token borrows the position of the last real token
            end = tok.end_pos if tok.end_pos is not None else len(text.rstrip())
            return ParseError(f"the statement ends early; expected {_describe(expected)}", (end, end + 1), text,
                              hint=_ends_early_hint(text[:end]))
        start = tok.start_pos
        # the lexer reads an unclosed /* as the tokens / and *: the error is at one of them
        opened = _unclosed_comment(text)
        if opened is not None and opened <= start <= opened + 1:
            return ParseError("unterminated comment", (opened, len(text)), text)
        span = (start, start + max(1, len(str(tok))))
        before = text[:start].rstrip()
        clause = re.search(r"\bFROM\s+(" + "|".join(_CLAUSES) + r")$", before, re.IGNORECASE)
        if clause:  # FROM MATCHING 'a': the clause word was read as the model's name
            return ParseError(f"FROM needs a model name before {clause.group(1).upper()}", clause.span(1), text,
                              hint="FROM smollm2-135m (or a quoted name), or leave FROM out for the session's model")
        if text[start - 1:start] == "'" and start > 0 and tok.type in ("NAME", "MODEL_NAME"):
            hint = "a quote inside a string is written twice: 'it''s'"  # 'it's': the string ended early
        elif _ends_early_hint(before):
            hint = _ends_early_hint(before)
        elif re.search(r"\bSELECT\s+DISTINCT$", before, re.IGNORECASE):
            hint = "DISTINCT is not supported: GROUP BY gives each value once (SELECT text, count(*) ... GROUP BY text)"
        elif tok.type == "SELECT":
            hint = "SELECT comes first in a query; the other clauses follow it in any order"
        elif tok.type in _CLAUSES and re.search(r"\bFOR\s+EACH\s+ROW\s+IN\b", before, re.IGNORECASE):
            hint = f"FOR EACH ROW IN comes last in a query: put {tok.type} before it"
        else:  # a keyword in the wrong place is not a misspelling of another keyword
            hint = _did_you_mean(str(tok), expected) if tok.type in ("NAME", "MODEL_NAME") else None
        return ParseError(f"unexpected {_token_text(tok)}; expected {_describe(expected)}", span, text, hint=hint)
    return ParseError(str(e), None, text)


def _ends_early_hint(before: str) -> Optional[str]:
    """The hint for text that reads as complete up to ``before`` but was not meant so."""
    if re.search(r"\bedit_scope\s+prefix\b", before, re.IGNORECASE):  # read as the PREFIX clause
        return "PREFIX is a clause; as a value it is written as a string: edit_scope 'prefix'"
    return None


def _unclosed_comment(text: str) -> Optional[int]:
    """Offset of a ``/*`` (outside strings, quoted names and comments) that is never closed."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "'\"":
            j = i + 1
            while True:
                j = text.find(ch, j)
                if j < 0:
                    return None
                if not text.startswith(ch * 2, j):
                    break
                j += 2
            i = j + 1
        elif text.startswith("--", i):
            j = text.find("\n", i)
            i = len(text) if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                return i
            i = j + 2
        else:
            i += 1
    return None


def _span(meta) -> A.Span:
    return (meta.start_pos, meta.end_pos) if not getattr(meta, "empty", False) else (0, 0)


def _tspan(tok: Token) -> A.Span:
    return (tok.start_pos, tok.end_pos)


def unquote(raw: str) -> str:
    """The value of a SQL string literal ``'...'`` (``''`` is a quote; backslashes are literal)."""
    return raw[1:-1].replace("''", "'")


_CLAUSE_FIELD = {"from_clause": "model", "matching_clause": "matching", "prefix_clause": "prefix",
                 "prompt_clause": "prompt",
                 "where_clause": "where", "using_clause": "using", "order_clause": "order",
                 "sample_clause": "sample", "group_clause": "group_by", "limit_clause": "limit",
                 "test_clause": "test", "expect_clause": "expect"}


def _set_value(value) -> A.Node:
    """A SET's value; a bare word (SET model = gemma3-270m) is read as a column is."""
    if isinstance(value, Token) and value.type == "SET_WORD":
        return A.Column(str(value), _tspan(value))
    return value


@v_args(meta=True)
class _ToAst(Transformer_NonRecursive):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    # -- statements
    def script(self, meta, children):
        return [c for c in children if isinstance(c, A.Node)]

    def explain(self, meta, c):
        return A.Explain(c[1], _span(meta))

    def set_stmt(self, meta, c):
        name = c[1]
        return A.Set(_name(name).lower(), _set_value(c[-1]), _span(meta), _tspan(name))

    def set_param(self, meta, c):
        return A.SetParam(str(c[1])[1:], _set_value(c[-1]), _span(meta), _tspan(c[1]))

    def show(self, meta, c):
        return A.Show(_name(c[1]).lower(), _span(meta))

    def query(self, meta, children):
        values = {}
        where_from = {}
        select = ()
        dataset = None
        for c in children:
            if isinstance(c, tuple) and c and c[0] == "select":
                select = c[1]
            elif isinstance(c, A.Dataset):
                dataset = c
            elif isinstance(c, tuple):
                kind, value, span, word = c
                name = _CLAUSE_FIELD[kind]
                if name in values:
                    raise ParseError(f"{word} is given twice in one query", span, self.text,
                                     hint=f"the first {word} is at line "
                                          f"{self.text.count(chr(10), 0, where_from[name]) + 1}")
                values[name] = value
                where_from[name] = span[0]
        return A.Query(select=select, dataset=dataset, span=_span(meta), **values)

    def select_clause(self, meta, c):
        return ("select", tuple(x for x in c if isinstance(x, A.SelectItem)))

    def select_item(self, meta, c):
        alias = None
        if len(c) == 3:
            alias = c[2]
        return A.SelectItem(c[0], alias, _span(meta))

    def select_star(self, meta, c):
        return A.SelectItem(A.Star(_tspan(c[0])), None, _span(meta))

    def alias(self, meta, c):
        tok = c[0]
        return _name(tok)

    def _clause(kind):
        def handler(self, meta, c):
            value = c[1] if len(c) == 2 else c[1:]
            return (kind, value, _tspan(c[0]) if isinstance(c[0], Token) else _span(meta), str(c[0]).upper())
        return handler

    def from_clause(self, meta, c):
        refs = tuple(x for x in c[1:] if isinstance(x, A.Node))
        value = refs[0] if len(refs) == 1 else A.Models(refs, (refs[0].span[0], refs[-1].span[1]))
        return ("from_clause", value, _tspan(c[0]), "FROM")

    matching_clause = _clause("matching_clause")
    prefix_clause = _clause("prefix_clause")
    prompt_clause = _clause("prompt_clause")
    where_clause = _clause("where_clause")
    sample_clause = _clause("sample_clause")
    limit_clause = _clause("limit_clause")

    def using_clause(self, meta, c):
        return ("using_clause", tuple(x for x in c if isinstance(x, A.Option)), _tspan(c[0]), "USING")

    def order_clause(self, meta, c):
        return ("order_clause", tuple(x for x in c if isinstance(x, A.OrderKey)), _tspan(c[0]), "ORDER BY")

    def group_clause(self, meta, c):
        return ("group_clause", tuple(x for x in c[2:] if isinstance(x, A.Node)), _tspan(c[0]), "GROUP BY")

    def test_clause(self, meta, c):
        test = A.Test(str(c[1]).lower(), tuple(x for x in c[3:] if isinstance(x, A.Node)), _span(meta), _tspan(c[1]))
        return ("test_clause", test, _tspan(c[0]), "TEST")

    def expect_clause(self, meta, c):
        name = next((unquote(str(x)) for x in c[2:] if isinstance(x, Token) and x.type == "STRING"), None)
        return ("expect_clause", A.Expect(c[1], name, _span(meta)), _tspan(c[0]), "EXPECT")

    def model_ref(self, meta, c):
        tok = c[0]
        if tok.type == "STRING":
            return A.Literal(unquote(str(tok)), _tspan(tok))
        if tok.type == "PARAM":
            return A.Param(str(tok)[1:], _tspan(tok))
        return A.Literal(str(tok), _tspan(tok))

    def option(self, meta, c):
        name = c[0]
        value = c[1] if len(c) > 1 else None
        if isinstance(value, Token):
            if value.type == "STRING":
                value = A.Literal(unquote(str(value)), _tspan(value))
            elif value.type == "PARAM":
                value = A.Param(str(value)[1:], _tspan(value))
            else:  # a bare word: an enumerated value such as canonical
                value = A.Literal(str(value), _tspan(value))
        return A.Option(str(name).lower(), value, _span(meta), _tspan(name))

    def signed_number(self, meta, c):
        sign = -1 if len(c) == 2 and str(c[0]) == "-" else 1
        n = self.number(meta, [c[-1]])
        return A.Literal(sign * n.value, _span(meta))

    def order_key(self, meta, c):
        desc = not (len(c) == 2 and str(c[1]).upper() == "ASC")
        return A.OrderKey(str(c[0]).lower(), desc, _span(meta))

    def for_clause(self, meta, c):
        rest = c[4:]
        source, where, limit = rest[0], None, None
        i = 1
        while i < len(rest):
            word = str(rest[i]).upper()
            if word == "WHERE":
                where = rest[i + 1]
            elif word == "LIMIT":
                limit = rest[i + 1]
            i += 2
        return A.Dataset(source, where, limit, _span(meta))

    # -- expressions
    def _chain(self, meta, c):
        node = c[0]
        for i in range(1, len(c), 2):
            op = str(c[i])
            op = op.upper() if op.isalpha() else op
            node = A.Binary(op, node, c[i + 1], (node.span[0], c[i + 1].span[1]))
        return node

    or_ = and_ = concat = arith = _chain

    def not_(self, meta, c):
        return A.Unary("NOT", c[1], _span(meta))

    def negate(self, meta, c):
        if str(c[0]) == "+":
            return c[1]
        if isinstance(c[1], A.Literal) and isinstance(c[1].value, (int, float)) and not isinstance(c[1].value, bool):
            return A.Literal(-c[1].value, _span(meta))
        return A.Unary("-", c[1], _span(meta))

    def compare(self, meta, c):
        op = {"==": "=", "!=": "<>"}.get(str(c[1]), str(c[1]))
        return A.Binary(op, c[0], c[2], _span(meta))

    def in_list(self, meta, c):
        negated = any(isinstance(x, Token) and x.type == "NOT" for x in c)
        items = tuple(x for x in c[1:] if isinstance(x, A.Node))
        return A.InList(c[0], items, negated, _span(meta))

    def in_call(self, meta, c):
        negated = any(isinstance(x, Token) and x.type == "NOT" for x in c)
        return A.InList(c[0], (c[-1],), negated, _span(meta))

    def not_matching(self, meta, c):
        return A.Matches(c[0], c[-1], True, _span(meta))

    def matches(self, meta, c):
        negated = any(isinstance(x, Token) and x.type == "NOT" for x in c)
        return A.Matches(c[0], c[-1], negated, _span(meta))

    def is_null(self, meta, c):
        negated = any(isinstance(x, Token) and x.type == "NOT" for x in c)
        return A.IsNull(c[0], negated, _span(meta))

    def number(self, meta, c):
        raw = str(c[0])
        value = int(raw) if re.fullmatch(r"\d+", raw) else float(raw)
        return A.Literal(value, _tspan(c[0]))

    def string(self, meta, c):
        return A.Literal(unquote(str(c[0])), _tspan(c[0]))

    def param(self, meta, c):
        return A.Param(str(c[0])[1:], _tspan(c[0]))

    def true(self, meta, c):
        return A.Literal(True, _span(meta))

    def false(self, meta, c):
        return A.Literal(False, _span(meta))

    def null(self, meta, c):
        return A.Literal(None, _span(meta))

    def call(self, meta, c):
        name, name_span = c[0]
        args = []
        for x in c[1:]:
            if isinstance(x, Token) and x.type == "STAR":
                args.append(A.Star(_tspan(x)))
            elif isinstance(x, A.Node):
                args.append(x)
        return A.Call(name.lower(), tuple(args), _span(meta), name_span)

    def func_name(self, meta, c):
        return (str(c[0]), _tspan(c[0]))

    def column(self, meta, c):
        return A.Column(_name(c[0]), _tspan(c[0]))


def _name(tok: Token) -> str:
    s = str(tok)
    if tok.type == "QUOTED_NAME":
        return s[1:-1].replace('""', '"')
    return s.lower()


def is_complete(text: str) -> bool:
    """Whether ``text`` ends with a statement terminator ``;`` outside strings and comments (the
    REPL reads lines until it does)."""
    state, i, last = None, 0, ""
    while i < len(text):
        ch = text[i]
        if state is None:
            if ch == "'":
                state = "'"
            elif ch == '"':
                state = '"'
            elif text.startswith("--", i):
                j = text.find("\n", i)
                i = len(text) if j < 0 else j
                continue
            elif text.startswith("/*", i):
                state = "*/"
                i += 2
                continue
            elif not ch.isspace():
                last = ch
        elif state in ("'", '"'):
            if ch == state:
                if text.startswith(state * 2, i):
                    i += 2
                    continue
                state = None
                last = ch
        elif text.startswith("*/", i):
            state = None
            i += 2
            continue
        i += 1
    return state is None and last == ";"
