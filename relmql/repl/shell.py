"""What the shell does with each submitted buffer: meta-commands, statements run in a worker
thread (so that Ctrl-C cancels the query and not the shell), results, errors and the timer line.

No prompt_toolkit here: ``Shell`` reads nothing, it is handed text (by ``run_repl``, or by
``.read``) and writes to streams.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import IO, Iterator, List, Optional, Tuple

from ..api.interrupts import interrupts
from ..errors import Error
from ..output import Presenter
from ..records import cancelling
from .commands import run_command

__all__ = ["Shell", "ScriptShell"]

_MAX_READ_DEPTH = 16


WAITING = "the current model call or compile step to end"  # what a cancelled statement waits for


class _Ticket:
    """The link between the waiting main thread and the worker: ``cancel()`` from the main thread
    cancels the statement's ``Result`` whether or not the worker has made it yet."""

    def __init__(self):
        self.result = None
        self.event = threading.Event()  # set on cancel: what runs before the Result exists (a compile) checks it

    @property
    def stopped(self) -> bool:
        return self.event.is_set()

    def attach(self, result) -> None:
        self.result = result
        if self.stopped:
            result.cancel()

    def cancel(self) -> None:
        self.event.set()
        result = self.result
        if result is not None:
            result.cancel()


class Shell:
    """The state of one shell session: the connection, the output mode and file, the timer and
    explain switches. Results go to ``out`` (the screen, or the file of ``.output``); messages
    (SET, the timer, meta-commands) to ``console``; errors to ``err``."""

    def __init__(self, con, stdout: Optional[IO[str]] = None, stderr: Optional[IO[str]] = None,
                 params=None):
        self.con = con
        self.console = stdout or sys.stdout
        self.presenter = Presenter(self.console, flush=True)  # results on ``out``, the rest said on ``console``
        self.err = stderr or sys.stderr
        self.out = self.screen = self.console  # results; ``screen``: where ``.output`` goes back to
        self.out_path: Optional[str] = None
        self.params = params
        self.mode = "table"
        self.mode_before_output: Optional[str] = None  # set while an .output file's extension chose the mode
        self.timer = False
        self.explain = False
        self.done = False
        self.last_result = None  # the last query's rows, for .plot
        self.width = None  # a callable giving the screen's width, for tables (default: the terminal's)
        self._depth = 0

    # -- writing
    def say(self, text: str) -> None:
        self.presenter.say(text)

    def warn(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()

    def report(self, e: BaseException, name: Optional[str] = None, line: Optional[int] = None) -> None:
        """One clean message for any failure: an ``Error`` rendered with its caret (``line``: the
        meta-command line of file ``name`` it came from), anything else (a bug) as one line, never
        a traceback."""
        if isinstance(e, Error):
            self.warn(f"{name}:{line}: {e.render()}" if name is not None and line is not None else e.render(name))
        elif isinstance(e, KeyboardInterrupt):
            self.warn("cancelled")
        else:
            self.warn(f"internal error: {type(e).__name__}: {e}\n"
                      "hint: this is a bug in relmql; the shell keeps running")

    def set_output(self, path: Optional[str]) -> None:
        """Results to the file at ``path`` (None: back to the screen). A file named .csv, .json or
        .jsonl is written in that format, as ``--output`` is, until results go elsewhere."""
        from ..output import FORMATS, Sink
        new = self.screen
        if path is not None:
            try:
                new = Sink(open(path, "w", encoding="utf-8", newline=""), path)
            except OSError as e:
                raise Error(f"cannot write {path}: {e.strerror or e}") from None
        self.close()
        self.out, self.out_path = new, path
        ext = os.path.splitext(path or "")[1].lower().lstrip(".")
        if ext in FORMATS and ext != self.mode:
            self.mode_before_output, self.mode = self.mode, ext

    def close(self) -> None:
        if self.out is not self.screen:
            try:
                self.out.close()
            except OSError:
                pass
        self.out, self.out_path = self.screen, None
        if self.mode_before_output is not None:  # the mode the file's extension chose ends with it
            self.mode, self.mode_before_output = self.mode_before_output, None

    # -- input
    def handle(self, text: str) -> None:
        """One submitted buffer: ``exit``, or statements and meta-command lines (a pasted script
        runs as ``.read`` runs a file)."""
        stripped = text.strip()
        if not stripped:
            return
        word = stripped.rstrip(";").strip().lower()
        if word in ("exit", "quit", "\\q"):
            self.done = True
            return
        if word == "help":
            text = ".help"
        elif stripped.startswith("\\"):  # psql's meta-commands
            self.say(f"{stripped.split()[0]}: the shell's commands start with '.' (psql's \\? is .help, \\timing is "
                     ".timer, \\i is .read, \\o is .output); .help lists them")
            return
        self.run_text(text)

    def run_text(self, text: str, name: Optional[str] = None) -> bool:
        """Run every statement and meta-command line of ``text``; stops at the first error.
        ``name``: the file (``.read``), for error locations. Returns success."""
        if name is None:
            return self._run_chunks(text, None)
        if self._depth >= _MAX_READ_DEPTH:
            raise Error(f".read nested more than {_MAX_READ_DEPTH} deep (does {name} read itself?)")
        self._depth += 1
        try:
            return self._run_chunks(text, name)
        finally:
            self._depth -= 1

    def _run_chunks(self, text: str, name: Optional[str]) -> bool:
        chunks = list(_chunks(text))
        if not chunks and name is not None:
            self.warn(f"note: {name} has no statements")
        for kind, body, line in chunks:
            if self.done:
                return True
            if kind == "command":
                try:
                    run_command(self, body)
                except Error as e:
                    self.report(e, name, line)
                    return False
            elif not self._run_sql("\n" * (line - 1) + body, name):
                return False
        return True

    def _run_sql(self, text: str, name: Optional[str]) -> bool:
        try:
            statements = self.con.statements(text, self.params)
        except Error as e:
            self.report(e, name)
            return False
        for statement in statements:
            if not self.run_statement(statement, name):
                return False
        return True

    def run_statement(self, statement, name: Optional[str] = None) -> bool:
        """Run one statement (of ``Connection.statements``) in a worker thread and show its result:
        a table row by row as they come, sized to the screen, where rows stream (a query without
        aggregates); else sized to fit its values."""
        def job(ticket: _Ticket):
            result = statement.run()
            ticket.attach(result)
            if not ticket.stopped:
                self.presenter.show(result, self.mode, self.out, explain=self.explain, width=self.width)
                if result.kind == "rows":
                    self.last_result = result

        start = time.perf_counter()
        stopped, error = self.background(job)
        elapsed = time.perf_counter() - start
        if stopped:
            self.warn("cancelled")
        elif error is not None:
            self.report(error, name)
            return False
        if self.timer:
            self.presenter.timer(elapsed)
        return not stopped

    def use_model(self, name: str) -> None:
        """``.model NAME``: set the session's model and load it now, so that a bad name fails here."""
        old = self.con.settings["model"]

        def job(ticket):
            self.con.set("model", name)
            self.con.model()

        stopped, error = self.background(job, waiting="the model to finish loading")
        if stopped or error is not None:
            self.con.settings["model"] = old
        if stopped:
            self.warn("cancelled")
        elif isinstance(error, Error):
            raise error  # reported where the command's line is known
        elif error is not None:
            self.report(error)
        else:
            self.say(f"model: {self.con.settings['model']}")

    def background(self, job, waiting: str = WAITING) -> Tuple[bool, Optional[BaseException]]:
        """Run ``job(ticket)`` in a worker thread while this thread waits; Ctrl-C cancels it, then
        waits for the worker to stop at its next model call (``waiting``: what it waits for, said
        at the first press where nothing can stop sooner, else at the second). Returns (cancelled,
        the exception the job raised or None)."""
        ticket = _Ticket()
        box: List[BaseException] = []
        finished = threading.Event()

        def target():
            try:
                with cancelling(ticket.event):
                    job(ticket)
            except BaseException as e:  # handed to the main thread, reported there
                box.append(e)
            finally:
                finished.set()

        worker = threading.Thread(target=target, name="relmql-statement", daemon=True)
        presses: List[int] = []
        with interrupts(presses.append):
            worker.start()
            seen = 0
            # Poll with sleep, not Thread.join: the handler runs only when this thread runs Python
            # code, and a KeyboardInterrupt inside join() can mark a running thread as stopped
            # (CPython gh-90882), so that the worker would outlive the statement.
            while not finished.is_set():
                try:
                    time.sleep(0.02)
                except KeyboardInterrupt:  # not from Ctrl-C (the handler above records it): code that raised one
                    presses.append(signal.SIGINT)
                if len(presses) > seen:
                    if seen or ticket.result is None:
                        self.warn(f"cancelling: waiting for {waiting}")
                    seen = len(presses)
                    ticket.cancel()
        worker.join()
        return ticket.stopped, (box[0] if box else None)


class ScriptShell(Shell):
    """The state a script's meta-command lines change (``relmql FILE``, standard input, ``-c``;
    see ``cli.run_script``): results go to the script's output ``out`` (and back to it after
    ``.output``), what the commands say and errors to ``err``; ``failed`` once one has failed,
    ``cancelled`` once Ctrl-C has stopped one (a script stops there, where the shell goes on)."""

    def __init__(self, con, out: IO[str], err: IO[str], params=None, mode: str = "jsonl"):
        super().__init__(con, stdout=err, stderr=err, params=params)
        self.out = self.screen = out
        self.mode = mode
        self.failed = self.cancelled = False
        self.first = True  # no result written yet (tables are separated by a blank line)

    def report(self, e: BaseException, name: Optional[str] = None, line: Optional[int] = None) -> None:
        self.failed = True
        super().report(e, name, line)

    def run_text(self, text: str, name: Optional[str] = None) -> bool:
        ok = super().run_text(text, name)
        self.failed |= not ok  # a meta-command that failed inside a .read file says so itself
        return ok

    def background(self, job, waiting: str = WAITING) -> Tuple[bool, Optional[BaseException]]:
        stopped, error = super().background(job, waiting)
        self.cancelled |= stopped
        return stopped, error


def is_command_line(line: str) -> bool:
    """Whether a line is a meta-command (``.mode csv``) where no statement is open: it starts with
    '.', not with a number such as ``.5``."""
    line = line.lstrip()
    return line.startswith(".") and not line[1:2].isdigit()


def _chunks(text: str) -> Iterator[Tuple[str, str, int]]:
    """A script split into ("sql", text, first line) and ("command", line, line) parts: a line
    that starts with '.' where no statement is open is a meta-command. SQL of nothing but
    whitespace and comments is left out."""
    from .completer import scan
    sql: List[str] = []
    start = 1
    for no, line in enumerate(text.splitlines(keepends=True), 1):
        pending = "".join(sql)
        tokens, state = scan(pending)
        is_open = state is not None or (tokens and tokens[-1] != ";")
        if not is_open and is_command_line(line):
            if tokens or state is not None:
                yield "sql", pending, start
            sql = []
            yield "command", line.strip(), no
            start = no + 1
            continue
        if not sql:
            start = no
        sql.append(line)
    tokens, state = scan("".join(sql))
    if tokens or state is not None:
        yield "sql", "".join(sql), start
