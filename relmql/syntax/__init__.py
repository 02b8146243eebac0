"""The language's syntax: text → statements (frozen dataclasses with source spans) and back.

Entry point: ``parse(text)`` → a list of statements; ``unparse(tree)`` → text.
"""

from . import ast
from .ast import dump
from .parser import ParseError, grammar_path, is_complete, parse, parse_one, unquote
from .source import EncodingError, check_text, decode_script, string_literal_at
from .unparse import quote, unparse

__all__ = ["ast", "parse", "parse_one", "unparse", "dump", "ParseError", "grammar_path", "is_complete", "quote",
           "string_literal_at", "unquote", "decode_script", "check_text", "EncodingError"]
