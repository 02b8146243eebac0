"""relmql: a declarative query language and engine for validating language models with regular
expressions.

    import relmql
    relmql.sql("SELECT text, prob MATCHING 'The (cat|dog) sat' PREFIX 'The' LIMIT 2").show()
"""

from .errors import CompileError, Error, ModelError, RegexError
from .version import __version__


def __getattr__(name):
    # the API pulls in torch; load it on first use so that `import relmql` stays quick
    if name in ("connect", "sql", "Connection", "Result"):
        from . import api
        return getattr(api, name)
    if name in ("ParseError",):
        from .syntax import ParseError
        return ParseError
    if name in ("PlanError",):
        from .plan import PlanError
        return PlanError
    if name in ("ExecutionError", "Cancelled", "stats"):
        import importlib  # not "from . import": that asks this __getattr__ for the name again
        if name == "stats":
            return importlib.import_module(f"{__name__}.stats")
        return getattr(importlib.import_module(f"{__name__}.records"), name)
    raise AttributeError(f"module 'relmql' has no attribute {name!r}")


__all__ = ["connect", "sql", "Connection", "Result", "Error", "ParseError", "PlanError", "RegexError",
           "CompileError", "ModelError", "ExecutionError", "Cancelled", "stats", "__version__"]
