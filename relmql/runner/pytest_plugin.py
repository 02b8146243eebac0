"""The pytest plugin (registered when relmql is installed): every ``test_*.rql`` file is collected,
each of its EXPECT statements a test item. A ``fail`` verdict fails the item, an ``inconclusive``
one fails it with its own message, a statement that cannot run is an error."""

from __future__ import annotations

from typing import Optional

import pytest


class RqlFailure(Exception):
    """An expectation that failed or was inconclusive."""


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".rql" and file_path.name.startswith("test_"):
        return RqlFile.from_parent(parent, path=file_path)
    return None


class RqlFile(pytest.File):
    """A ``test_*.rql`` file: its statements run in order on one session, as ``relmql test`` runs them."""

    def collect(self):
        from ..syntax import ast as A
        from ..syntax import decode_script, parse
        self.text = decode_script(self.path.read_bytes())
        self.statements = parse(self.text)  # a syntax error fails collection, with its caret
        self.done, self.con, self.runs = 0, None, None
        for i, st in enumerate(self.statements):
            if isinstance(st, A.Query) and st.expect is not None:
                line = self.text.count("\n", 0, st.span[0]) + 1
                name = st.expect.name or f"line {line}"
                yield RqlItem.from_parent(self, name=name, index=i, line=line)

    def verdict(self, index: int):
        """Run the statements up to ``index`` (those before it once), and judge that one."""
        import relmql
        if self.con is None:
            self.con = relmql.connect(progress=False)
            self.runs = self.con.statements(self.text, {})
        for statement in self.runs[self.done:index]:
            for _ in statement.run():
                pass
        self.done = index + 1
        return self.runs[index].run().verdict


class RqlItem(pytest.Item):
    """One EXPECT statement."""

    def __init__(self, *, index: int, line: int, **kw):
        super().__init__(**kw)
        self.index, self.line = index, line
        self.outcome = None

    def setup(self):
        self.outcome = self.parent.verdict(self.index)  # a statement that cannot run raises: an error
        if self.outcome.status == "error":
            raise RuntimeError(self.outcome.message)

    def runtest(self):
        v = self.outcome
        if v.status == "fail":
            raise RqlFailure(f"fail: {v.line_text()}")
        if v.status == "inconclusive":
            raise RqlFailure(f"inconclusive (not a pass): {v.line_text()}")

    def repr_failure(self, excinfo, style: Optional[str] = None):
        if isinstance(excinfo.value, (RqlFailure, RuntimeError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, self.line - 1, f"{self.path.name}:{self.line}: {self.name}"
