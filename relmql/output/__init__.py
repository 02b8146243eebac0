"""Results as text: tables (streamed or sized to fit), CSV, JSON and JSON lines.

Entry points: ``write(columns, rows, fmt, out)``; ``Presenter``, which shows statement results for the
shell and the CLI.
"""

from .format import FORMATS, Sink, format_value, render_table, started, write
from .present import Presenter

__all__ = ["write", "started", "Sink", "render_table", "format_value", "FORMATS", "Presenter"]
