"""relmql's version, the one place it is written (CHANGELOG.md says what changed in each)."""

__version__ = "0.3.0"
