"""The Python API: ``connect()`` → ``Connection``; ``Connection.sql(text)`` → a lazy ``Result``.

    import relmql
    con = relmql.connect(model="tiny-gpt2")
    con.sql("SELECT text, prob MATCHING 'a(b|c)' LIMIT 2").show()
"""

from __future__ import annotations

from .connection import Connection, connect, sql
from .result import Result
from .show import SHOW_WHAT

__all__ = ["Connection", "Result", "connect", "sql", "SHOW_WHAT"]
