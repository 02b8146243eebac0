"""The shell's meta-commands: one table (``COMMANDS``) that runs them, completes them and writes
``.help``.

A command is a function ``handler(shell, arg)`` registered with ``@command(name, args, help)``;
``arg`` is the rest of the line, stripped (and without a trailing ``;``).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from ..errors import Error, closest
from ..syntax import decode_script

__all__ = ["Command", "COMMANDS", "command", "lookup", "run_command", "help_text"]


@dataclass(frozen=True)
class Command:
    """One meta-command. ``complete``: what its argument is, for completion: ``models``,
    ``modes``, ``onoff``, ``path``, ``plot`` (a path, then plot kinds), ``commands`` or None."""

    name: str
    args: str
    help: str
    handler: Callable[..., None]
    aliases: Tuple[str, ...] = ()
    complete: Optional[str] = None

    @property
    def usage(self) -> str:
        return f"{self.name} {self.args}".rstrip()


COMMANDS: Dict[str, Command] = {}


def command(name: str, args: str = "", help: str = "", aliases: Tuple[str, ...] = (),
            complete: Optional[str] = None):
    """Register ``handler(shell, arg)`` as the meta-command ``name`` (with its leading dot)."""
    def register(handler):
        COMMANDS[name] = Command(name, args, help, handler, aliases, complete)
        return handler
    return register


def lookup(name: str) -> Optional[Command]:
    name = name.lower()
    for cmd in COMMANDS.values():
        if name == cmd.name or name in cmd.aliases:
            return cmd
    return None


def names() -> Dict[str, Tuple[str, str, Optional[str]]]:
    """Every name and alias → (arguments, meaning, argument kind), for the completer."""
    out = {}
    for cmd in COMMANDS.values():
        for n in (cmd.name,) + cmd.aliases:
            out[n] = (cmd.args, cmd.help, cmd.complete)
    return out


def run_command(shell, line: str) -> None:
    """Run one meta-command line such as ``.mode csv``; errors raise ``relmql.Error``."""
    name, _, arg = line.strip().partition(" ")
    name = name.rstrip(";")
    arg = arg.strip()
    if arg.endswith(";"):
        arg = arg[:-1].rstrip()
    cmd = lookup(name)
    if cmd is None:
        known = [n for c in COMMANDS.values() for n in (c.name,) + c.aliases]
        near = closest(name, known)
        raise Error(f"unknown command {name}" + (f"; did you mean {near}?" if near else ""),
                    hint="enter .help for the list of commands")
    cmd.handler(shell, arg)


def help_text(only: Optional[str] = None) -> str:
    """``.help``: every command (or one), generated from ``COMMANDS``."""
    cmds = list(COMMANDS.values())
    if only:
        cmd = lookup(only if only.startswith(".") else "." + only)
        if cmd is None:
            near = closest(only if only.startswith(".") else "." + only, [c.name for c in cmds])
            raise Error(f"no command {only}" + (f"; did you mean {near}?" if near else ""))
        cmds = [cmd]
    width = max(len(c.usage) for c in cmds) + 2
    lines = []
    for c in cmds:
        also = f" (also {', '.join(c.aliases)})" if c.aliases else ""
        lines.append(f"{c.usage.ljust(width)}{c.help}{also}")
    if not only:
        lines += ["",
                  "Statements end with ';' and may span lines; Enter runs them once the ';' is typed.",
                  "Tab completes, Up searches the history by what is typed, Ctrl-R searches it all.",
                  "Ctrl-C cancels a running query (or clears the line); Ctrl-D on an empty line exits."]
    return "\n".join(lines)


def _on_off(shell, arg: str, attr: str, label: str) -> None:
    if arg:
        value = arg.lower()
        if value not in ("on", "off"):
            raise Error(f"{label} takes on or off, not {arg!r}")
        setattr(shell, attr, value == "on")
    else:
        setattr(shell, attr, not getattr(shell, attr))
    shell.say(f"{label} {'on' if getattr(shell, attr) else 'off'}")


# -- the commands, in the order .help lists them

@command(".help", "[COMMAND]", "list the commands, or show one")
def _help(shell, arg):
    shell.say(help_text(arg or None))


@command(".model", "[NAME]", "use the model NAME from now on (SET model = 'NAME'); show it with no NAME",
         complete="models")
def _model(shell, arg):
    if not arg:
        shell.say(f"model: {shell.con.settings['model']}")
        return
    name = arg.strip("'\"")
    shell.use_model(name)


@command(".mode", "[table|csv|json|jsonl]", "the format of results; show it with no argument", complete="modes")
def _mode(shell, arg):
    from ..output import FORMATS
    if not arg:
        shell.say(f"mode: {shell.mode}")
        return
    mode = arg.lower()
    if mode not in FORMATS:
        near = closest(mode, FORMATS)
        raise Error(f"unknown mode {arg!r}; modes: {', '.join(FORMATS)}" +
                    (f"; did you mean {near}?" if near else ""))
    shell.mode, shell.mode_before_output = mode, None  # chosen: it outlasts an .output file


@command(".timer", "[on|off]", "print the time each statement takes (no argument: switch)", complete="onoff")
def _timer(shell, arg):
    _on_off(shell, arg, "timer", "timer")


@command(".explain", "[on|off]", "print each query's plan (as EXPLAIN does) before its rows (no argument: "
                                 "switch)", complete="onoff")
def _explain(shell, arg):
    _on_off(shell, arg, "explain", "explain")


@command(".read", "FILE", "run the statements of FILE (stops at the first error)", complete="path")
def _read(shell, arg):
    if not arg:
        raise Error(".read needs a FILE")
    path = os.path.expanduser(arg.strip("'\""))
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise Error(f"cannot read {path}: {e.strerror or e}") from None
    try:
        text = decode_script(data)
    except Error as e:
        shell.report(e, path)
        return
    shell.run_text(text, name=path)


@command(".output", "[FILE]", "write results to FILE (replacing it; .csv, .json and .jsonl in that format); back "
                             "to the screen with no FILE",
         complete="path")
def _output(shell, arg):
    if not arg:
        shell.set_output(None)
        return
    shell.set_output(os.path.expanduser(arg.strip("'\"")))


@command(".plot", "FILE [bar|cumulative|cdf] [log]",
         "draw the last result into FILE (.png, .svg or .pdf); no kind: chosen from the columns", complete="plot")
def _plot(shell, arg):
    from ..output.plot import PLOT_KINDS, check_path
    try:
        words = shlex.split(arg)
    except ValueError:
        words = arg.split()
    if not words:
        raise Error(".plot needs a FILE", hint="e.g. .plot probs.png bar")
    path, kind, log = os.path.expanduser(words[0]), None, False
    for word in words[1:]:
        if word.lower() == "log":
            log = True
        elif word.lower() in PLOT_KINDS:
            kind = word.lower()
        else:
            near = closest(word, PLOT_KINDS + ("log",))
            raise Error(f".plot takes a kind ({', '.join(PLOT_KINDS)}) and log, not {word!r}" +
                        (f"; did you mean {near}?" if near else ""))
    check_path(path)
    if shell.last_result is None:
        raise Error("no result to plot yet; run a query first")
    shell.say(f"wrote {path} ({shell.last_result.plot(path, kind=kind, log=log)})")


@command(".quit", "", "leave the shell (so does Ctrl-D)", aliases=(".exit",))
def _quit(shell, arg):
    shell.done = True
