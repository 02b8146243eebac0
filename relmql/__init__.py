"""relmql: a declarative query language and engine for validating language models with regular
expressions."""

from .errors import CompileError, Error, ModelError, RegexError

__version__ = "0.1.0"

__all__ = ["Error", "RegexError", "CompileError", "ModelError", "__version__"]
