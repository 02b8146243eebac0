"""The progress bar of a query's rows on a terminal, and notes written around it."""

from __future__ import annotations

import sys
import time
from typing import Callable, List


class RowBar:
    """A tqdm bar on stderr, only on a terminal and only once a query has run for a second: rows
    and their rate, the estimated time left when the total is known (SAMPLE n, datasets,
    probability()), and how far the search for the next row has gone (``note``). The bars are
    taken off the screen while a ``Result`` hands out a row, and drawn again when the next one
    is asked for, so that rows written to the same terminal never run into a bar."""

    DELAY = 1.0
    MININTERVAL = 0.1  # seconds between redraws
    _live: List["RowBar"] = []  # the open bars

    def __init__(self, enabled: bool):
        self.bar = None
        self.shown = False  # drawn and not cleared since
        self.hidden = False  # cleared for a row, to be drawn again
        self._t0 = self._noted = time.monotonic()
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            # miniters=1: no redraws from tqdm's monitor thread, which clear() would not know of
            self.bar = tqdm(file=sys.stderr, delay=self.DELAY, mininterval=self.MININTERVAL, miniters=1, leave=False,
                            unit="row", dynamic_ncols=True)
            self.shown = self.DELAY <= 0  # tqdm draws it at once
            RowBar._live.append(self)

    def total(self, n: int, unit: str = "row") -> None:
        if self.bar is not None:
            self.bar.total, self.bar.unit = n, unit

    def update(self, n: int) -> None:
        if self.bar is None:
            return
        self.bar.set_postfix_str("", refresh=False)  # the note was of the row now counted
        if self.bar.update(n):
            self.shown, self.hidden = True, False

    def note(self, text: str) -> None:
        """``text`` beside the count, drawn at once when the bar is due and was not drawn in the
        last MININTERVAL: a search between rows calls no ``update``, and may run for minutes."""
        if self.bar is None:
            return
        cleared = not text and self.bar.postfix  # a note that is over goes at once (the compile's)
        self.bar.set_postfix_str(text, refresh=False)
        now = time.monotonic()
        if not self.hidden and now - self._t0 >= self.DELAY and (cleared or now - self._noted >= self.MININTERVAL):
            self._noted = now
            self.bar.refresh()
            self.shown = True

    def close(self) -> None:
        if self.bar is not None:
            if self.shown:  # drawn by note() alone (no row yet), which tqdm's close takes as never drawn
                self.bar.clear()
            self.bar.close()
            self.bar.fp.flush()  # before the rows' last lines, on a stderr that is not line-buffered
            self.bar = None
            RowBar._live.remove(self)

    @classmethod
    def clear(cls) -> None:
        """Take the bars that are drawn off the screen, the cursor back at the start of their line."""
        for p in list(cls._live):
            if p.shown and p.bar is not None:
                p.bar.clear()
                p.bar.fp.flush()  # before the row, on a stderr that is not line-buffered
                p.shown, p.hidden = False, True

    @classmethod
    def redraw(cls) -> None:
        """Draw again the bars that ``clear`` took off."""
        for p in list(cls._live):
            if p.hidden and p.bar is not None:
                p.bar.refresh()
                p.shown, p.hidden = True, False


def noting(notes: List[str]) -> Callable[[str], None]:
    """A function that writes a note on stderr, with the bars taken off the screen meanwhile, and
    keeps it in ``notes`` (``relmql.engine.speaking`` takes it)."""
    def tell(line: str) -> None:
        RowBar.clear()
        print(line, file=sys.stderr)
        RowBar.redraw()
        notes.append(line)
    return tell
