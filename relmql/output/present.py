"""The one presenter of statement results, for the faces (the shell and the CLI).

Entry point: ``Presenter(side).show(result, fmt, out)``.
"""

from __future__ import annotations

from typing import IO, Callable, Iterator, Optional

from .format import Sink, started, write


class Presenter:
    """How a face shows each statement's result: its rows in format ``fmt`` on ``out``, a test's
    outcome (and with ``verdicts``, an expectation's verdict) beneath a table, and what is said
    beside the results on ``side`` (a SET's message, the plan of ``.explain on``, the timer line,
    a test's outcome beside a format other than a table). ``flush``: each result is flushed as it
    ends (the shell's screen)."""

    def __init__(self, side: IO[str], verdicts: bool = False, flush: bool = False):
        self.side = side  # where what is not a result goes
        self.verdicts = verdicts  # an expectation's verdict line follows its rows (the CLI)
        self.flush = flush  # flush each result and each line said (the shell)

    def say(self, text: str) -> None:
        """A line beside the results."""
        self.side.write(text + "\n")
        if self.flush:
            self.side.flush()

    def timer(self, seconds: float) -> None:
        """``.timer on``: a statement's time."""
        self.say(f"time: {seconds:.3f} s")

    def show(self, result, fmt: str, out: IO[str], explain: bool = False,
             width: Optional[Callable[[], int]] = None) -> None:
        """A statement's result, whole: a SET's message, or the rows (a table row by row as they
        come, where rows stream; ``width()``: the screen's width)."""
        if result.kind == "status":
            self.say(result.message or "")
            return
        self.rows(result, self.begin(result, explain), fmt, out, stream=True, width=width)

    def begin(self, result, explain: bool = False) -> Iterator[tuple]:
        """The result's rows with the first one read (``started``): an error before it shows
        alone, without a separator, a header or an empty table; first, with ``explain``, the plan
        of a query."""
        if explain and result.kind == "rows":
            self.say(result.explain() + "\n")
        return started(result)

    def rows(self, result, rows: Iterator[tuple], fmt: str, out: IO[str], stream: bool = True,
             width: Optional[Callable[[], int]] = None, tally: Optional[Sink] = None) -> None:
        """Write ``rows`` (from ``begin``): a text result's lines as they are in a table, else
        ``write``'s format (``stream``: a table may stream); then what follows them. ``tally``:
        counts the results and JSON arrays written (a second array is noted)."""
        if result.kind == "text" and fmt == "table":
            for (line,) in rows:
                out.write(line + "\n")
            self._flush(out)
            return
        write(result.columns, rows, fmt, out, stream=stream and result.streams, kinds=result.kinds,
              width=width() if width else None)
        self._flush(out)
        if tally is not None:
            self._count(tally, fmt, out)
        if getattr(result, "test_plan", None) is not None:  # TEST ...: its outcome under a table, else beside
            self._beneath(result.test.summary(), fmt, out)
        if self.verdicts and result.expects:
            self._beneath(result.verdict.line_text(), fmt, out)

    def _count(self, tally: Sink, fmt: str, out: IO[str]) -> None:
        tally.results += 1
        tally.arrays += fmt == "json"
        if fmt == "json" and tally.arrays == 2:  # as duckdb writes them; a JSON reader stops at the second
            self.say(f"note: {getattr(out, 'name', 'the output')} holds one JSON array per statement; "
                     "--format jsonl writes rows that read as one stream")

    def _beneath(self, text: str, fmt: str, out: IO[str]) -> None:
        if fmt == "table":
            out.write(text + "\n")
            self._flush(out)
        else:
            self.say(text)

    def _flush(self, out: IO[str]) -> None:
        if self.flush:
            out.flush()
