"""``relmql test`` and its reports, the pytest plugin that collects ``test_*.rql`` files, and the
shipped suites (``suites/``)."""

from __future__ import annotations

__all__ = ["main"]


def main(argv=None) -> int:
    """``relmql test``'s command line (``relmql.runner.run.main``)."""
    from .run import main as run_main
    return run_main(argv)
