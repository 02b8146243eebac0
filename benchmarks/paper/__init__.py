"""The paper's four evaluations (memorization, bias, extraction, LAMBADA): a ``.rql`` file and a
driver each, run alone (``python -m benchmarks.paper.lambada``) or together
(``python -m benchmarks.paper.run``)."""
