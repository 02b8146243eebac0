"""Results as text: tables (streamed or sized to fit), CSV, JSON and JSON lines.

Entry point: ``write(columns, rows, fmt, out)``.
"""

from .format import FORMATS, Sink, format_value, render_table, started, write

__all__ = ["write", "started", "Sink", "render_table", "format_value", "FORMATS"]
