"""Progress over a script's statements, for scripts whose results do not go to the screen."""

from __future__ import annotations

import time
from typing import IO, Optional


class StatementProgress:
    """How far a script of several statements has got, on ``err``: a bar where ``err`` is a
    terminal and the results go elsewhere (``relmql checks.rql > out.jsonl``); a note line every
    ``EVERY`` seconds where ``err`` is not a terminal either (a log, CI); nothing where the results
    go to the terminal (they show the progress), nor for a script of one statement. Totals grow
    as the script's parts are read (a script with meta-commands is parsed part by part)."""

    DELAY = 1.0  # seconds before a bar shows
    EVERY = 60.0  # seconds between notes

    def __init__(self, err: IO[str], out_is_terminal: bool, enabled: bool = True):
        self.err = err
        self.total = self.done = 0
        self.t0 = self.noted = self.first = time.monotonic()
        self.bar = None
        self.where = ""  # the statement running (and its model), as ``at`` said
        terminal = is_terminal(err)
        self.mode: Optional[str] = None if not enabled or (terminal and out_is_terminal) else \
            "bar" if terminal else "notes"

    def add(self, statements: int) -> None:
        """``statements`` more statements to run."""
        self.total += statements
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def at(self, where: str) -> None:
        """The statement now running, as a bar's label and a note's last words (``[model] file:line``)."""
        self.where = where
        if self.bar is not None:
            self.bar.set_description_str(where)

    def step(self) -> None:
        """One more statement has run."""
        self.done += 1
        if self.mode is None or self.total < 2:
            return
        if self.mode == "bar":
            if self.bar is None:
                from tqdm import tqdm
                self.bar = tqdm(file=self.err, total=self.total, initial=self.done - 1, delay=self.DELAY,
                                unit="statement", leave=False, dynamic_ncols=True, desc=self.where or "statements")
            self.bar.update(1)
            return
        now = time.monotonic()
        if self.done == 1:
            self.first = now  # the rate is taken from here on: the first statement may have loaded the model
        elif now - self.noted >= self.EVERY and self.done < self.total:
            self.noted = now
            left = (now - self.first) / (self.done - 1) * (self.total - self.done)
            self.err.write(f"note: {self.done:,} of {self.total:,} statements run ({self.done / self.total:.0%}) in "
                           f"{_duration(now - self.t0)}; about {_duration(left)} left"
                           + (f"; the last: {self.where}" if self.where else "") + "\n")
            self.err.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def is_terminal(stream) -> bool:
    """Whether ``stream`` is a terminal (False for a stream without a file, or a closed one)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _duration(seconds: float) -> str:
    """``seconds`` as a person says it: 45 s, 12 min, 3 h 20 min."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60} min"
