"""relmql's benchmarks (docs/benchmarks.md) and the paper's evaluations (``benchmarks.paper``,
docs/paper-results.md): a package run from the repository root, e.g. ``python -m benchmarks.run``;
not part of the installed library."""
