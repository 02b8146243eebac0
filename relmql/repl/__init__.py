"""The interactive shell: ``relmql`` with no file.

Entry point: ``run_repl(con)``. Statements may span lines and run when Enter follows a ``;``;
lines that start with ``.`` are meta-commands (``.help`` lists them, from the one table in
``commands.py``). Ctrl-C cancels the running query and keeps the shell; Ctrl-D exits.

    relmql --model tiny-gpt2
    relmql> SELECT text, prob
       ...> MATCHING 'a(b|c)' LIMIT 2;
"""

from __future__ import annotations

import os
import sys
from typing import IO, Optional

from ..errors import Error
from .commands import COMMANDS, help_text, run_command
from .shell import Shell

__all__ = ["run_repl", "Shell", "COMMANDS", "help_text", "run_command", "history_path", "should_submit"]

PROMPT = "relmql> "
CONTINUATION = "   ...> "


def history_path() -> str:
    """$RELMQL_HISTORY, else $XDG_DATA_HOME/relmql/history (~/.local/share/relmql/history)."""
    if os.environ.get("RELMQL_HISTORY"):
        return os.path.expanduser(os.environ["RELMQL_HISTORY"])
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "relmql", "history")


def _history():
    """The history file's, or where it cannot be written, one kept in memory and why (else None)."""
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    path = history_path()
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "ab"):
            pass
        return FileHistory(path), None
    except OSError as e:
        why = e.strerror or str(e)
        if e.filename and os.path.abspath(e.filename) != os.path.abspath(path):  # a folder on the way
            why += f": {e.filename}"
        return InMemoryHistory(), f"history is kept for this session only: cannot write {path} ({why})"


def should_submit(text: str) -> bool:
    """Whether Enter runs the buffer (else it starts a new line): a blank buffer, a meta-command
    (or a psql one, ``\\q``, which the shell answers), ``exit``/``quit``/``help``, or statements
    ending with ``;`` outside strings and comments."""
    from ..syntax import is_complete
    stripped = text.strip()
    return (not stripped or stripped.startswith((".", "\\"))
            or stripped.lower().rstrip(";").strip() in ("exit", "quit", "help") or is_complete(text))


def _key_bindings(session_buffer):
    from prompt_toolkit import search
    from prompt_toolkit.filters import Condition, completion_is_selected, is_searching
    from prompt_toolkit.key_binding import KeyBindings
    kb = KeyBindings()

    @kb.add("enter", filter=completion_is_selected)
    def _take_completion(event):
        # Enter on a highlighted completion takes it (and runs nothing)
        event.current_buffer.complete_state = None

    @kb.add("enter", filter=~completion_is_selected & ~is_searching &
            Condition(lambda: should_submit(session_buffer().text)))
    def _submit(event):
        event.current_buffer.validate_and_handle()

    @kb.add("enter", filter=is_searching)
    def _run_found(event):
        # Enter on a statement found with Ctrl-R runs it, as in psql and bash; an unfinished one
        # is left to edit
        search.accept_search()
        if should_submit(session_buffer().text):
            session_buffer().validate_and_handle()

    return kb


def run_repl(con, input=None, output=None, stdout: Optional[IO[str]] = None,
             stderr: Optional[IO[str]] = None, mode: Optional[str] = None, params=None,
             results: Optional[str] = None) -> int:
    """The shell on ``con`` until ``.quit`` or Ctrl-D; returns the exit status (0, or 1 when
    ``results`` cannot be written).

    ``mode``: the starting output format (``.mode``; default: table, or the format that
    ``results`` names); ``params``: values of ``:name`` parameters for every statement (the
    CLI's ``--param``); ``results``: a file the results go to from the start (``.output``).

    ``input``/``output``: prompt_toolkit's (tests pass a pipe input and an output over a
    StringIO). Results and messages go to ``stdout`` (default: the stream of ``output`` where it
    has one, else sys.stdout), errors to ``stderr`` (default: that same stream when it came from
    ``output``, else sys.stderr).
    """
    if stdout is None and output is not None and hasattr(output, "stdout"):
        stdout = output.stdout
        stderr = stderr or stdout
    shell = Shell(con, stdout or sys.stdout, stderr or sys.stderr, params=params)
    run_command(shell, ".mode table")
    try:
        _set_output(shell, mode, results)
    except Error as e:
        shell.report(e)
        return 1
    history, unsaved = _history()
    session = _session(con, history, input, output)
    shell.width = lambda: session.output.get_size().columns
    _greet(shell, con, results, unsaved)
    try:
        _loop(shell, session)
    finally:
        shell.close()
    return 0


def _set_output(shell: Shell, mode: Optional[str], results: Optional[str]) -> None:
    """The starting output file and format (``.output``, ``.mode``)."""
    if results is not None:
        shell.set_output(results)  # .output FILE: a .csv or .json file chooses its format
    if mode is not None:
        run_command(shell, f".mode {mode}")


def _session(con, history, input, output):
    """The prompt_toolkit session: multi-line statements, their colours, completion and history."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
    from prompt_toolkit.lexers import PygmentsLexer

    from .commands import names
    from .completer import RelmqlCompleter
    from .lexer import RelmqlLexer
    session: PromptSession = None  # type: ignore[assignment]
    session = PromptSession(
        PROMPT, multiline=True, prompt_continuation=CONTINUATION,
        lexer=PygmentsLexer(RelmqlLexer), completer=RelmqlCompleter.for_connection(con, names()),
        history=history, enable_history_search=True, search_ignore_case=True,
        auto_suggest=AutoSuggestFromHistory(), enable_suspend=True,
        key_bindings=_key_bindings(lambda: session.default_buffer),
        input=input, output=output)
    return session


def _greet(shell: Shell, con, results: Optional[str], unsaved: Optional[str]) -> None:
    from .. import __version__
    shell.say(f"relmql {__version__} on {con.settings['model']}. Statements end with ';'. "
              "Enter .help for the commands; Ctrl-D exits.")
    if results is not None:
        shell.say(f"results go to {results} ({shell.mode}); .output brings them back here")
    if unsaved:
        shell.warn(unsaved)


def _loop(shell: Shell, session) -> None:
    """Read and run buffers until ``.quit`` or Ctrl-D."""
    while not shell.done:
        try:
            text = session.prompt()
        except KeyboardInterrupt:  # Ctrl-C at the prompt: the buffer is dropped
            continue
        except EOFError:  # Ctrl-D on an empty line
            break
        try:
            shell.handle(text)
        except KeyboardInterrupt:  # outside a running statement: nothing to cancel
            shell.warn("cancelled")
        except Exception as e:  # noqa: BLE001 -- the shell keeps running whatever happens
            shell.report(e)
