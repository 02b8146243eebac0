"""The ``relmql`` command: scripts, ``-c``, standard input, or the interactive shell.

    relmql examples/birthdays.rql
    relmql -c "SELECT text, prob MATCHING 'The (cat|dog) sat' PREFIX 'The' LIMIT 2;"
    echo "SHOW MODELS;" | relmql --format csv
    relmql                      # the shell
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional

from . import __version__
from .errors import Error

EXIT_ERROR, EXIT_USAGE, EXIT_CANCELLED = 1, 2, 130


def build_parser() -> argparse.ArgumentParser:
    from .models import BUILTIN_MODELS, DEFAULT_MODEL
    from .output import FORMATS
    from .output.plot import PLOT_KINDS
    from .records import DTYPES
    p = argparse.ArgumentParser(
        prog="relmql",
        description="Query language models with regular expressions. With no FILE and no -c, reads "
                    "statements from standard input, or opens the interactive shell on a terminal.")
    p.add_argument("files", nargs="*", metavar="FILE", help="scripts of statements ending with ';'")
    p.add_argument("-c", "--command", action="append", metavar="SQL", help="run these statements (repeatable)")
    p.add_argument("--version", action="version", version=f"relmql {__version__}")
    p.add_argument("--model", help=f"the default model: {', '.join(BUILTIN_MODELS)}, a local directory or a "
                                   f"Hugging Face id (default: {DEFAULT_MODEL})")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--dtype", choices=DTYPES, help="model weights and arithmetic (default: float32, exact; "
                   "the others are faster and approximate, auto: the fastest the hardware runs natively)")
    p.add_argument("--seed", type=int, help="random seed of SAMPLE (default: 0)")
    p.add_argument("--format", choices=FORMATS,
                   help="output format (default: table on a terminal; with --output, from its extension, a table "
                        "for .txt or none; otherwise jsonl)")
    p.add_argument("-o", "--output", metavar="PATH", help="write results to PATH instead of standard output")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE",
                   help="bind :NAME to the string VALUE (repeatable)")
    p.add_argument("--plot", metavar="FILE",
                   help="also draw each query's rows into FILE (.png, .svg or .pdf); the second query's into "
                        "FILE-2, and so on")
    p.add_argument("--plot-kind", choices=PLOT_KINDS,
                   help="bar (grouped results), cumulative (rows over time) or cdf (of a numeric column) "
                        "(default: chosen from the columns)")
    p.add_argument("--log-scale", action="store_true", help="a log scale on the plot's value axis")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on standard error")
    p.add_argument("--engine", choices=("local", "ray"),
                   help="where queries run: local (this process, the default) or ray (worker processes of a Ray "
                        "cluster; pip install 'relmql[ray]')")
    p.add_argument("--workers", type=int, metavar="N", help="--engine ray: worker processes (default: one per "
                                                            "GPU with --device cuda, otherwise one per CPU)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="CPU threads of the model's arithmetic: this process's, or each worker's with --engine ray")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="--engine ray: the cluster to join: auto or HOST:6379 (default: RAY_ADDRESS, or a new "
                        "local instance)")
    return p


def _params(items: List[str]) -> Dict[str, str]:
    from .plan.options import command_params
    return command_params(items)


def _format(args, out: IO[str]) -> str:
    from .output import FORMATS
    if args.format:
        return args.format
    if args.output:
        ext = Path(args.output).suffix.lower().lstrip(".")
        if ext in FORMATS:
            return ext
        if ext not in ("txt", ""):
            print(f"note: no output format is named .{ext}: writing JSON lines to {args.output} (--format "
                  f"chooses one of {', '.join(FORMATS)})", file=sys.stderr)
        return "table" if ext in ("txt", "") else "jsonl"
    return "table" if out.isatty() else "jsonl"


def quiet_waits() -> None:
    """Before torch starts its OpenMP threads, let waiting threads sleep rather than spin, so that
    queries beside other work share the cores (docs/executor.md, "Beside other work"); a policy
    already set is kept, and nothing changes once torch is loaded."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: Optional[List[str]] = None) -> int:
    quiet_waits()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["test"]:  # relmql test PATH...: verdicts and exit codes for CI
        from .runner import main as test_main
        return test_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.param = _params(args.param)
    except Error as e:
        parser.error(e.message)  # a wrong command line: the usage, exit status 2
    try:
        return _main(args)
    except KeyboardInterrupt:  # outside a statement (one is cancelled in run_script)
        print("cancelled", file=sys.stderr)
        return EXIT_CANCELLED


def _main(args) -> int:
    if args.plot and not _writable_plot(args.plot):
        return EXIT_ERROR
    con = _connect(args)
    if isinstance(con, int):
        return con
    _note_ray_only(args)
    scripts = _scripts(args)
    if scripts is None:
        return EXIT_ERROR
    if not scripts:  # no FILE, no -c, and a terminal: the shell
        from .repl import run_repl
        if args.plot:
            print("note: --plot draws a script's results; in the shell, .plot FILE draws the last query's",
                  file=sys.stderr)
        return run_repl(con, mode=args.format, params=args.param, results=args.output)
    return _run_scripts(args, con, scripts)


def _writable_plot(path: str) -> bool:
    """Whether ``--plot FILE`` can be written (else why not, on standard error)."""
    from .output.plot import check_path
    try:
        check_path(path)
    except Error as e:  # a file that cannot be written
        print(e.render(), file=sys.stderr)
        return False
    return True


def _connect(args):
    """The session of the command line's settings, or the exit status of a setting it cannot take."""
    try:
        from .api import Connection
        con = Connection(model=args.model, device=args.device, dtype=args.dtype, seed=args.seed,
                         progress=not args.no_progress, workers=args.workers, address=args.ray_address,
                         threads=args.threads, engine=args.engine)
        con.models.after_load = _freeze_collector
    except Error as e:  # a flag's value that no setting takes is a wrong command line, as argparse's; a model,
        from .plan import PlanError  # a GPU or Ray that is not here is not
        print(e.render(), file=sys.stderr)
        return EXIT_USAGE if isinstance(e, PlanError) else EXIT_ERROR
    return con


def _note_ray_only(args) -> None:
    ray_only = [f for f, v in (("--workers", args.workers), ("--ray-address", args.ray_address)) if v is not None]
    if ray_only and args.engine != "ray":
        verb = "apply" if len(ray_only) > 1 else "applies"
        print(f"note: {' and '.join(ray_only)} {verb} to the Ray engine (--engine ray, or SET engine = 'ray' in "
              f"the script); until then queries run in this process", file=sys.stderr)


def _scripts(args) -> Optional[List[tuple]]:
    """(name, text) of each script to run: the -c statements, the FILEs, else standard input where it
    is not a terminal (none: the shell); None where one cannot be read (said on standard error)."""
    from .syntax import check_text, decode_script
    scripts = []
    try:
        for c in args.command or []:
            scripts.append(("-c", check_text(c)))
    except Error as e:
        print(e.render(), file=sys.stderr)
        return None
    for f in args.files:
        try:
            scripts.append((f, decode_script(Path(f).read_bytes()) if f != "-" else _read_stdin()))
        except Error as e:
            print(e.render("<stdin>" if f == "-" else f), file=sys.stderr)
            return None
        except OSError as e:
            print(f"error: cannot read {f}: {e.strerror or e}", file=sys.stderr)
            if isinstance(e, FileNotFoundError) and not Path(f).suffix and "/" not in f:  # relmql help
                print("hint: FILE arguments are scripts of statements to run; relmql --help lists the options, "
                      "and -c 'SQL' runs a statement", file=sys.stderr)
            return None
    if not scripts and not sys.stdin.isatty():
        try:
            scripts.append(("<stdin>", _read_stdin()))
        except Error as e:
            print(e.render("<stdin>"), file=sys.stderr)
            return None
    return scripts


def _run_scripts(args, con, scripts: List[tuple]) -> int:
    """Run the scripts in turn, their results to --output or standard output; the exit status."""
    from .output import Sink
    try:
        out = Sink(open(args.output, "w", encoding="utf-8", newline="") if args.output else sys.stdout,
                   args.output or "standard output")
    except OSError as e:
        print(f"error: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return EXIT_ERROR
    try:
        fmt = _format(args, out)
        plotter = _Plotter(args.plot, args.plot_kind, args.log_scale) if args.plot else None
        for name, text in scripts:
            code = run_script(con, text, name, args.param, fmt, out, plot=plotter)
            if code:
                return code
        out.flush()
        return 0
    except Error as e:  # the last flush
        print(e.render(), file=sys.stderr)
        return EXIT_ERROR
    finally:
        if args.output:
            out.close()
        elif out.failed:
            _quiet_pipe()  # what is left in its buffer would fail again at exit


def _freeze_collector(model) -> None:
    """Move every object alive once a model is loaded (torch, transformers, the model: some
    430,000) out of the cycle collector's way for the rest of this process, as serving engines
    do: a search makes tens of thousands of nodes, and each full collection they set off would
    walk all of those objects again (0.2 s each, measured; about a tenth of a 20,000-node search
    on a model that costs nothing). Garbage is collected first, so that none is kept for good."""
    gc.collect()
    gc.freeze()


class _Plotter:
    """``--plot FILE``: draws each query's result, the first into FILE, then FILE-2, FILE-3...
    (a result of one row or none has nothing to draw, and is passed over)."""

    def __init__(self, path: str, kind: Optional[str] = None, log: bool = False):
        self.path, self.kind, self.log, self.count = Path(path), kind, log, 0

    def __call__(self, result, err: IO[str]) -> None:
        n = len(result)
        if n < 2:
            print(f"plot: nothing to draw for a result of {n} row{'' if n == 1 else 's'}", file=err)
            return
        self.count += 1
        path = self.path if self.count == 1 else self.path.with_name(
            f"{self.path.stem}-{self.count}{self.path.suffix}")
        kind = result.plot(str(path), kind=self.kind, log=self.log)
        print(f"plot: wrote {path} ({kind})", file=err)


def run_script(con, text: str, name: str, params, fmt: str, out: IO[str], err: IO[str] = None,
               plot: Optional[Callable[..., None]] = None) -> int:
    """Run every statement of ``text``, writing results to ``out``; stops at the first error
    (rendered on ``err``). ``plot(result, err)``: called after each query's rows are written.
    A line that starts with '.' where no statement is open is a meta-command, as in the shell
    (``.mode csv``, ``.output FILE``, ``.timer on``, ``.explain on``, ``.model NAME``, ``.read
    FILE``, ``.plot FILE``, ``.quit``): it applies to the statements after it, and what it says
    goes to ``err``, not among the results. Returns the exit status; a script without statements
    is not an error, but is noted on ``err``."""
    from .output.progress import StatementProgress
    err = err or sys.stderr
    progress = StatementProgress(err, out.isatty(), getattr(con, "progress", False))
    try:
        return _run_script(con, text, name, params, fmt, out, err, plot, progress)
    finally:
        progress.close()


def _run_script(con, text: str, name: str, params, fmt: str, out: IO[str], err: IO[str], plot, progress) -> int:
    from .repl.shell import ScriptShell, _chunks, is_command_line
    if not any(is_command_line(line) for line in text.splitlines()):  # the statements alone, in one go
        return _run_statements(con, text, name, params, fmt, out, err, progress, plot)
    from .repl.commands import run_command
    shell = ScriptShell(con, out, err, params, fmt)
    chunks = list(_chunks(text))
    if not chunks:
        print(f"note: {name} has no statements", file=err)
    try:
        for kind, body, line in chunks:
            if kind == "command":
                try:
                    run_command(shell, body)
                except Error as e:
                    origin = _origin(name)
                    print(f"{origin}:{line}: {e.render()}" if origin else e.render(), file=err)
                    return EXIT_ERROR
                if shell.cancelled:  # Ctrl-C in a .read or .model
                    return EXIT_CANCELLED
                if shell.failed:  # a .read that failed has said why
                    return EXIT_ERROR
                if shell.done:
                    return 0
            else:
                code = _run_statements(con, "\n" * (line - 1) + body, name, params, shell.mode, shell.out, err,
                                       progress, plot, shell)
                if code:
                    return code
        return 0
    finally:
        shell.close()


def _run_statements(con, text: str, name: str, params, fmt: str, out: IO[str], err: IO[str], progress,
                    plot: Optional[Callable[..., None]] = None, shell=None) -> int:
    """``run_script`` for statements alone; with ``shell`` (a script's meta-command state), its
    explain and timer switches apply, and each query's result is kept for ``.plot``; ``progress``
    (a ``StatementProgress``) is told of each statement run."""
    try:
        statements = con.statements(text, params)
    except Error as e:
        print(e.render(_origin(name)), file=err)
        return EXIT_ERROR
    if not statements and shell is None:
        print(f"note: {name} has no statements", file=err)
    return _Statements(con, statements, name, fmt, out, err, plot, shell).run(progress)


class _Statements:
    """A script's statements (of ``Connection.statements``) run in turn, each result written to
    ``out`` as it comes; the Ray engine's queries are started ahead (``ahead``: by index)."""

    def __init__(self, con, statements: list, name: str, fmt: str, out: IO[str], err: IO[str], plot, shell):
        from .output import Presenter, Sink
        self.con, self.statements, self.name, self.fmt, self.out, self.err = con, statements, name, fmt, out, err
        self.plot, self.shell = plot, shell  # ``plot(result, err)`` after each query; the script's meta-commands
        self.presenter = Presenter(err, verdicts=True)
        self.tally = out if isinstance(out, Sink) else Sink(out, "the output")  # results and JSON arrays written
        self.first = shell.first if shell is not None else not self.tally.results  # no result written yet
        self.ahead: Dict[int, object] = {}  # results started ahead (or the error of planning one)
        self.running: List[object] = []  # the query being read, cancelled by Ctrl-C

    def run(self, progress) -> int:
        """Every statement, until the first error; the exit status."""
        with _ctrl_c(self.running) as pressed:
            progress.add(len(self.statements))
            for i in range(len(self.statements)):
                if i:
                    progress.step()
                code = self.statement(i, pressed)
                if code is not None:
                    return code
            if pressed:
                print("cancelled", file=self.err)
                return EXIT_CANCELLED
            return 0

    def statement(self, i: int, pressed: List[int]) -> Optional[int]:
        """Run statement ``i`` and write its result; an exit status where the script stops there."""
        from .records import Cancelled
        result = None
        began = time.perf_counter()
        try:
            if pressed:  # Ctrl-C whose KeyboardInterrupt was lost between two statements
                raise KeyboardInterrupt
            result = self.ahead.pop(i, None)
            if isinstance(result, Error):
                raise result
            if result is None:
                result = self.statements[i].run()
            self.running[:] = [result]
            if result.kind == "rows" and self.con.settings["engine"] == "ray":
                result.start()
                _start_ahead(self.statements, i, self.ahead)
            if result.kind != "status":
                self.show(self.statements[i].node, result)
            _timer(self.shell, began, self.presenter)
        except Error as e:
            _cancel(self.ahead)
            if isinstance(e, Cancelled) and pressed:  # Ctrl-C, its KeyboardInterrupt lost: see _ctrl_c
                print("cancelled", file=self.err)
                return EXIT_CANCELLED
            print(e.render(_origin(self.name)), file=self.err)
            return EXIT_ERROR
        except KeyboardInterrupt:
            if result is not None:
                result.cancel()
            _cancel(self.ahead)
            print("cancelled", file=self.err)
            return EXIT_CANCELLED
        except BrokenPipeError:
            _quiet_pipe()
            _cancel(self.ahead)
            return 0
        return None

    def show(self, node, result) -> None:
        """Write the result of the statement ``node``: tables apart by a blank line; then draw a
        query's rows (``plot``) and keep them for the script's ``.plot``."""
        from .syntax import ast as A
        shell, fmt, out = self.shell, self.fmt, self.out
        rows = self.presenter.begin(result, explain=shell is not None and shell.explain)
        if fmt == "table" and not self.first:
            out.write("\n")
        self.first = False
        if shell is not None:
            shell.first = False
        self.presenter.rows(result, rows, fmt, out, stream=fmt == "table" and out.isatty(), tally=self.tally)
        if result.kind == "text" and fmt == "table":
            return
        if self.plot is not None and isinstance(node, A.Query) and result.kind == "rows":
            self.plot(result, self.err)
        if shell is not None and result.kind == "rows":
            shell.last_result = result


def _ctrl_c(running: List[object]):
    """Ctrl-C during a script: KeyboardInterrupt as ever, and the queries in ``running`` cancelled
    (``api.interrupts.ctrl_c_cancels``); yields the list of presses."""
    from .api.interrupts import ctrl_c_cancels

    def cancel() -> None:
        for r in running:
            r.cancel()
    return ctrl_c_cancels(cancel)


def _timer(shell, began: float, presenter) -> None:
    """``.timer on`` in a script: the statement's time, beside the results."""
    if shell is not None and shell.timer:
        presenter.timer(time.perf_counter() - began)


AHEAD = 16  # queries started ahead of the one being written (Ray engine)


def _start_ahead(statements, i: int, ahead: Dict[int, object]) -> None:
    """Ray engine: plan and start the queries that follow statement ``i``, up to the next
    statement of another kind (a SET changes how later ones are planned), so that the workers run
    them side by side. A query that fails to plan keeps its error for its turn; none after it
    starts."""
    from .syntax import ast as A
    for j in range(i + 1, min(len(statements), i + 1 + AHEAD)):
        if not isinstance(statements[j].node, A.Query) or isinstance(ahead.get(j), Error):
            return
        if j in ahead:
            continue
        try:
            ahead[j] = statements[j].run()
            ahead[j].start()
        except Error as e:
            ahead[j] = e
            return


def _cancel(ahead: Dict[int, object]) -> None:
    """Stop the queries started ahead that will not be written."""
    for r in ahead.values():
        if not isinstance(r, Error):
            r.cancel()


def _quiet_pipe():
    # the reader went away (e.g. `| head`): stop without a traceback at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _read_stdin() -> str:
    """Standard input as UTF-8 text: read as bytes where it has them (Python's own decoding keeps
    a byte that is not UTF-8 as a lone surrogate), else as the text it gives."""
    from .syntax import check_text, decode_script
    buffer = getattr(sys.stdin, "buffer", None)
    return decode_script(buffer.read()) if buffer is not None else check_text(sys.stdin.read())


def _origin(name: str) -> Optional[str]:
    return None if name == "-c" else name


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
