"""The syntax stage: golden ASTs and error messages, round trips through unparse, fuzzing, is_complete.

Golden files: ``tests/golden/syntax/X.rql`` → ``X.ast`` (``dump`` of each statement, blank-line separated);
``tests/golden/syntax_errors/X.rql`` → ``X.err`` (the error's ``render()``). Regenerate them with
``pytest tests/test_syntax.py --update-golden`` and read the diff before keeping it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relmql.errors import Error
from relmql.syntax import ParseError, ast as A, dump, is_complete, parse, parse_one, unparse
from relmql.syntax.parser import unquote

GOLDEN = Path(__file__).parent / "golden"
GOOD = sorted((GOLDEN / "syntax").glob("*.rql"))
BAD = sorted((GOLDEN / "syntax_errors").glob("*.rql"))


@pytest.fixture
def update_golden(request) -> bool:
    return bool(request.config.getoption("--update-golden"))


def check_golden(path: Path, actual: str, update: bool) -> None:
    if update:
        path.write_text(actual, encoding="utf-8")
        return
    assert path.is_file(), f"{path} is missing: run pytest {Path(__file__).name} --update-golden"
    assert actual == path.read_text(encoding="utf-8")


def read(path: Path) -> str:
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def dump_all(stmts) -> str:
    return "\n\n".join(dump(s) for s in stmts) + "\n"


def check_spans(node: A.Node, text: str, outer=(0, None)) -> None:
    """Every span lies inside its parent's and the text; leaves' spans cover their own source text."""
    lo, hi = outer
    hi = len(text) if hi is None else hi
    start, end = node.span
    assert lo <= start <= end <= hi, (node, outer)
    src = text[start:end]
    if isinstance(node, A.Param):
        assert src == ":" + node.name
    elif isinstance(node, A.Star):
        assert src == "*"
    elif isinstance(node, A.Column):
        if src.startswith('"'):
            assert src[1:-1].replace('""', '"') == node.name
        else:
            assert src.lower() == node.name
    elif isinstance(node, A.Literal) and isinstance(node.value, str) and src.startswith("'"):
        assert unquote(src) == node.value
    elif isinstance(node, A.Call):
        assert src.lower().startswith(node.name) and src.endswith(")")
    for child in node.children():
        check_spans(child, text, node.span)


def test_golden_sets_are_there():
    assert len(GOOD) >= 15 and len(BAD) >= 12
    # an expected file whose input was removed is stale
    for folder, suffix in (("syntax", ".ast"), ("syntax_errors", ".err")):
        for expected in (GOLDEN / folder).glob("*" + suffix):
            assert expected.with_suffix(".rql").is_file(), f"{expected} has no input"


def test_expected_tokens_are_those_that_could_come_next():
    """An error lists what the statement could go on with there: no ')' outside parentheses,
    no ',' after LIMIT's number (LALR's own lists hold both, from states it merged)."""
    def expected(text):
        with pytest.raises(ParseError) as info:
            parse(text)
        return info.value.message.split("; expected ")[1]
    after_limit = expected("SELECT text MATCHING 'a' LIMIT 1 foo")
    assert "')'" not in after_limit and "','" not in after_limit and "';'" in after_limit
    assert "')'" in expected("SELECT (1 + 2 foo")
    assert expected("SELECT text MATCHING 'a' USING topk 5 foo").startswith("',', ';', FOR")


def test_typographic_quotes_are_told_apart_from_straight_ones():
    """Text pasted from a word processor or a chat has curly quotes, which are not SQL's."""
    for text in ("SELECT text MATCHING \u2018The cat\u2019", "SELECT text MATCHING \u201cThe cat\u201d"):
        with pytest.raises(ParseError) as info:
            parse(text)
        e = info.value
        assert e.span == (21, 22) and e.message == f"unexpected {text[21]!r}, a typographic quote"
        assert e.hint.startswith("strings are written with straight quotes: 'The cat'")


def test_an_unquoted_edit_scope_prefix_is_told_to_quote_it():
    """``edit_scope prefix`` reads as the PREFIX clause, which then has no value: the hint says to
    quote the word, whether the statement ends there or goes on."""
    for text in ("SELECT text MATCHING 'ab' PREFIX 'a' USING edit_scope prefix",
                 "SELECT text MATCHING 'ab' PREFIX 'a' USING edit_scope prefix LIMIT 1"):
        with pytest.raises(ParseError) as info:
            parse(text)
        assert info.value.hint == "PREFIX is a clause; as a value it is written as a string: edit_scope 'prefix'"


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_golden_ast(path, update_golden):
    text = read(path)
    stmts = parse(text)
    assert stmts
    for s in stmts:
        check_spans(s, text)
    check_golden(path.with_suffix(".ast"), dump_all(stmts), update_golden)


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_golden_error(path, update_golden):
    text = read(path)
    with pytest.raises(ParseError) as info:
        parse(text)
    err = info.value
    assert isinstance(err, Error) and err.source == text
    assert err.span is not None and 0 <= err.span[0] <= err.span[1] <= len(text) + 1
    check_golden(path.with_suffix(".err"), err.render() + "\n", update_golden)


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_golden_round_trip(path):
    stmts = parse(read(path))
    text = unparse(stmts)
    assert parse(text) == stmts
    assert unparse(parse(text)) == text


# -- facts the golden files show, stated directly

def test_strings_are_sql_strings():
    q = parse_one(r"MATCHING 'www\.it''s\\' PREFIX ''")
    assert q.matching.value == "www\\.it's\\\\"  # backslashes are ordinary characters
    assert q.prefix.value == ""


def test_keywords_are_case_insensitive_and_clauses_unordered():
    a = parse("SELECT text MATCHING 'a' LIMIT 3 USING topk 2;")
    b = parse("select TEXT using TOPK 2 limit 3 matching 'a'")
    assert a == b
    assert parse_one('SELECT "TEXT"').select[0].expr.name == "TEXT"


def test_comments_are_ignored():
    assert parse("SELECT /* x ; */ a -- b ;\n, c") == parse("SELECT a, c")


def test_operator_spellings():
    assert parse("WHERE a != 1 AND b == 2") == parse("WHERE a <> 1 AND b = 2")


def test_parse_one_and_empty_scripts():
    assert parse("") == [] and parse(" ;; -- nothing\n") == []
    with pytest.raises(ParseError):
        parse_one("SELECT 1; SELECT 2")
    with pytest.raises(ParseError):
        parse(None)


def test_deep_nesting_is_not_a_crash():
    for text in ("SELECT " + "(" * 3000 + "1" + ")" * 3000, "SELECT " + "NOT " * 3000 + "x"):
        try:
            parse(text)
        except ParseError:
            pass
    q = parse_one("SELECT " + "(" * 300 + "1" + ")" * 300)
    assert q.select[0].expr == A.Literal(1)


def test_overflowing_numbers_round_trip():
    stmts = parse("SELECT 1e999, -1e999 USING t 1e999, u -1e999")
    assert parse(unparse(stmts)) == stmts


# -- is_complete

@pytest.mark.parametrize("text, complete", [
    ("SELECT 1;", True),
    ("SELECT 1;  \n", True),
    ("SELECT 1", False),
    ("", False),
    ("SELECT ';'", False),
    ("SELECT ';';", True),
    ("SELECT 'it''s;'", False),
    ("SELECT 'it''s';", True),
    ("SELECT 'a''", False),
    ('SELECT "a;"', False),
    ('SELECT "a"";";', True),
    ("SELECT 1 -- ;", False),
    ("SELECT 1 -- ;\n;", True),
    ("SELECT 1; -- done", True),
    ("SELECT 1 /* ; */", False),
    ("SELECT 1 /* ; */ ;", True),
    ("SELECT 1; /* open", False),
])
def test_is_complete(text, complete):
    assert is_complete(text) is complete


# -- fuzzing: any text

KEYWORDS = ["SELECT", "FROM", "MATCHING", "MATCHES", "PREFIX", "WHERE", "USING", "ORDER", "BY", "ASC", "DESC",
            "SAMPLE", "GROUP", "LIMIT", "AS", "AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE", "EXPLAIN",
            "SET", "TO", "SHOW", "FOR", "EACH", "ROW", "MODELS"]
FRAGMENTS = ["'", "''", "'a'", "'it''s'", "'\\'", '"', '"x"', '""', "--", "/*", "*/", "\n", ";", ",", "(", ")",
             "*", "+", "-", "/", "%", "||", "=", "==", "<>", "!=", "<", ">", "<=", ">=", ":p", ":", "0", "1.5",
             ".5", "2.", "1e5", "1e999", "x", "text", "prob", "gpt2-medium", "a/b", "count(*)", "group(1)",
             "lines('f')", "é", "@", "$", "#", "\\", "\t", " ", "\x00"]
TOKEN = st.one_of(st.sampled_from(KEYWORDS).flatmap(lambda k: st.sampled_from([k, k.lower(), k.title()])),
                  st.sampled_from(FRAGMENTS))
SOUP = st.lists(st.tuples(TOKEN, st.sampled_from(["", " ", " ", "\n"])), max_size=25).map(
    lambda parts: "".join(a + b for a, b in parts))
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check_any_text(text: str) -> None:
    try:
        stmts = parse(text)
    except Error as e:
        assert e.source == text
        assert e.span is not None and 0 <= e.span[0] <= e.span[1] <= len(text) + 1
        assert isinstance(e.render(), str) and e.message
        return
    for s in stmts:
        check_spans(s, text)
    assert parse(unparse(stmts)) == stmts
    if stmts:
        assert is_complete(text + "\n;")


@FUZZ
@given(st.text(max_size=60))
def test_fuzz_arbitrary_text(text):
    check_any_text(text)


@FUZZ
@given(SOUP)
def test_fuzz_token_soup(text):
    check_any_text(text)


# -- fuzzing: trees → text → the same trees

KEYWORD_NAMES = [k.lower() for k in KEYWORDS]
IDENT = st.one_of(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), st.sampled_from(KEYWORD_NAMES))
PARAM_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True)
ANY_NAME = st.one_of(IDENT, st.text(max_size=6))
# a name before "(" is a function unless it is a keyword that can start an expression
FUNC_NAME = IDENT.filter(lambda s: s not in ("not", "null", "true", "false"))
NUMBER = st.one_of(st.integers(-10**12, 10**12), st.floats(allow_nan=False))

leaf = st.one_of(
    st.builds(A.Literal, NUMBER),
    st.builds(A.Literal, st.text(max_size=8)),
    st.builds(A.Literal, st.sampled_from([True, False, None])),
    st.builds(A.Param, PARAM_NAME),
    st.builds(A.Column, ANY_NAME),
    st.builds(A.Call, st.sampled_from(["count", "sum"]), st.just((A.Star(),))),
)


def _negate(x):
    # the parser folds the sign into a number literal
    if isinstance(x, A.Literal) and isinstance(x.value, (int, float)) and not isinstance(x.value, bool):
        return A.Literal(-x.value)
    return A.Unary("-", x)


def _compound(e):
    items = st.lists(e, min_size=1, max_size=3).map(tuple)
    call = st.builds(A.Call, FUNC_NAME, st.lists(e, max_size=3).map(tuple))
    return st.one_of(
        st.builds(A.Binary, st.sampled_from(["OR", "AND", "=", "<>", "<", ">", "<=", ">=", "||", "+", "-", "*",
                                             "/", "%"]), e, e),
        st.builds(lambda x: A.Unary("NOT", x), e),
        st.builds(_negate, e),
        call,
        st.builds(A.InList, e, items, st.booleans()),
        st.builds(A.InList, e, call.map(lambda c: (c,)), st.booleans()),
        st.builds(A.Matches, e, e, st.booleans()),
        st.builds(A.IsNull, e, st.booleans()),
    )


EXPR = st.recursive(leaf, _compound, max_leaves=12)
OPT = lambda s: st.one_of(st.none(), s)  # noqa: E731
TUPLE = lambda s, lo=0: st.lists(s, min_size=lo, max_size=3).map(tuple)  # noqa: E731

SELECT_ITEM = st.one_of(st.builds(A.SelectItem, EXPR, OPT(ANY_NAME)), st.just(A.SelectItem(A.Star())))
MODEL = st.one_of(st.builds(A.Literal, st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-/]{0,10}", fullmatch=True)),
                  st.builds(A.Literal, st.text(max_size=8)), st.builds(A.Param, PARAM_NAME))
OPTION_VALUE = st.one_of(st.builds(A.Literal, NUMBER), st.builds(A.Literal, st.text(max_size=8)),
                         st.builds(A.Literal, IDENT), st.builds(A.Literal, st.booleans()),
                         st.builds(A.Param, PARAM_NAME))
OPTION = st.builds(A.Option, IDENT, OPT(OPTION_VALUE))
DATASET = st.builds(A.Dataset, EXPR, OPT(EXPR), OPT(EXPR))


def _query_ok(q: A.Query) -> bool:
    return bool(q.select) or any(getattr(q, f) not in (None, ()) for f in (
        "model", "matching", "prefix", "where", "using", "order", "sample", "group_by", "limit"))


QUERY = st.builds(A.Query, select=TUPLE(SELECT_ITEM), model=OPT(MODEL), matching=OPT(EXPR), prefix=OPT(EXPR),
                  where=OPT(EXPR), using=TUPLE(OPTION), order=TUPLE(st.builds(A.OrderKey, IDENT, st.booleans())),
                  sample=OPT(EXPR), group_by=TUPLE(EXPR), limit=OPT(EXPR), dataset=OPT(DATASET)).filter(_query_ok)
STATEMENT = st.one_of(QUERY, st.builds(A.Explain, QUERY), st.builds(A.Set, IDENT, EXPR),
                      st.builds(A.SetParam, IDENT, EXPR), st.builds(A.Show, IDENT))


@FUZZ
@given(EXPR)
def test_fuzz_expression_round_trip(expr):
    stmts = [A.Query(select=(A.SelectItem(expr),))]
    assert parse(unparse(stmts)) == stmts


@FUZZ
@given(st.lists(STATEMENT, min_size=1, max_size=3))
def test_fuzz_statement_round_trip(stmts):
    text = unparse(stmts)
    back = parse(text)
    assert back == stmts
    for s in back:
        check_spans(s, text)
