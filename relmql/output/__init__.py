"""Results as text: tables (streamed or sized to fit), CSV, JSON and JSON lines.

Entry point: ``write(columns, rows, fmt, out)``.
"""

from .format import FORMATS, format_value, render_table, write

__all__ = ["write", "render_table", "format_value", "FORMATS"]
