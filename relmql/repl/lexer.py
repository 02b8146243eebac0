"""A Pygments lexer for relmql statements (the shell's highlighting; usable by docs too).

    from pygments import highlight
    from pygments.formatters import TerminalFormatter
    from relmql.repl.lexer import RelmqlLexer
    print(highlight("SELECT text MATCHING 'a(b|c)' LIMIT 2;", RelmqlLexer(), TerminalFormatter()))

Self-contained on purpose (imports nothing from relmql), so that a docs build can use it
without the engine's dependencies. ``KEYWORDS`` must list the keywords of grammar/relmql.lark
(a test checks it).
"""

from __future__ import annotations

import re

from pygments.lexer import RegexLexer, bygroups, words
from pygments.token import (Comment, Keyword, Name, Number, Operator, Punctuation, String, Text,
                            Whitespace)

__all__ = ["RelmqlLexer", "KEYWORDS"]

KEYWORDS = ("SELECT", "FROM", "MATCHING", "MATCHES", "PREFIX", "PROMPT", "WHERE", "USING", "ORDER", "BY", "ASC", "DESC",
            "SAMPLE", "GROUP", "LIMIT", "AS", "AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE", "EXPLAIN",
            "SET", "TO", "SHOW", "FOR", "EACH", "ROW", "TEST", "OF", "EXPECT")
_CONSTANTS = ("NULL", "TRUE", "FALSE")


class RelmqlLexer(RegexLexer):
    """relmql: keywords (any case), '...' strings with '' escapes, "quoted" names, :params,
    numbers, -- and /* */ comments, function calls, model names after FROM, and the shell's
    .meta-commands at the start of a line."""

    name = "relmql"
    aliases = ["relmql", "rql"]
    filenames = ["*.rql"]
    mimetypes = ["text/x-relmql"]
    url = "https://github.com/relmql/relmql"
    flags = re.IGNORECASE | re.MULTILINE

    tokens = {
        "root": [
            (r"^([ \t]*)(\.[a-z_][a-z0-9_]*)([^\n]*)", bygroups(Whitespace, Keyword.Pseudo, Text)),
            (r"\s+", Whitespace),
            (r"--[^\n]*", Comment.Single),
            (r"/\*", Comment.Multiline, "block-comment"),
            (r"'", String.Single, "string"),
            (r'"', Name.Variable, "quoted-name"),
            (r":\w+", Name.Variable.Magic),
            (r"(from)(\s+)([a-z0-9_][a-z0-9_.\-/]*)", bygroups(Keyword, Whitespace, Name.Namespace)),
            (r"(group|prefix|sample)(?=\()", Name.Function),  # group(1): a call, not the keyword
            (words(_CONSTANTS, suffix=r"\b"), Keyword.Constant),
            (words(KEYWORDS, suffix=r"\b"), Keyword),
            (r"([^\W\d]\w*)(\s*)(?=\()", bygroups(Name.Function, Whitespace)),
            (r"(\d+\.\d*|\.\d+)(e[+-]?\d+)?|\d+e[+-]?\d+", Number.Float),
            (r"\d+", Number.Integer),
            (r"[^\W\d]\w*", Name),
            (r"<=|>=|<>|!=|==|\|\||[=<>+\-*/%]", Operator),
            (r"[(),;.]", Punctuation),
        ],
        "string": [
            (r"[^']+", String.Single),
            (r"''", String.Escape),
            (r"'", String.Single, "#pop"),
        ],
        "quoted-name": [
            (r'[^"]+', Name.Variable),
            (r'""', String.Escape),
            (r'"', Name.Variable, "#pop"),
        ],
        "block-comment": [
            (r"[^*]+", Comment.Multiline),
            (r"\*/", Comment.Multiline, "#pop"),
            (r"\*", Comment.Multiline),
        ],
    }
