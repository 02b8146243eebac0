"""``relmql test``: run files of statements, judge each EXPECT, print a line per expectation and a
summary, write reports, and exit 0 (every expectation passed), 1 (one failed or was inconclusive)
or 2 (a statement could not run)."""

from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import IO, Dict, List, Optional, Sequence, Tuple

from ..errors import Error
from ..verdict import Verdict
from .reports import by_model, check_writable, compare, totals, write_report

EXIT_PASS, EXIT_FAIL, EXIT_ERROR, EXIT_CANCELLED = 0, 1, 2, 130
SUITES = Path(__file__).resolve().parent / "suites"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relmql test", description="Run .rql files and judge their EXPECT clauses: "
                                "exit 0 when every expectation passes, 1 when one fails or is inconclusive, "
                                "2 when a statement cannot run.")
    p.add_argument("paths", nargs="*", metavar="PATH", help=".rql files, or folders of them")
    p.add_argument("--suite", action="append", default=[], metavar="NAME", help="a shipped suite (--list-suites)")
    p.add_argument("--list-suites", action="store_true", help="list the shipped suites")
    p.add_argument("--model", help="comma-separated models: every file runs on each (default: the session's)")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", help="float32 (default, exact), bfloat16, float16 or auto")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--junit", metavar="FILE", help="a JUnit XML report")
    p.add_argument("--json", metavar="FILE", help="a JSON report (a later run's --baseline)")
    p.add_argument("--report", metavar="FILE", action="append", default=[],
                   help="a summary: FILE.md Markdown (a pull-request comment), FILE.html one self-contained page "
                   "with plots of grouped results (may be given more than once)")
    p.add_argument("--baseline", metavar="FILE.json", help="name the values that moved beyond their intervals "
                                                            "since this earlier --json report")
    return p


def suites() -> Dict[str, Tuple[Path, str]]:
    """The shipped suites: name → (file, what it checks: its first comment line)."""
    out = {}
    for path in sorted(SUITES.glob("*.rql")):
        first = next((ln[2:].strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.startswith("--")),
                     "")
        out[path.stem] = (path, first)
    return out


def files_of(paths: Sequence[str]) -> List[Path]:
    """The .rql files that ``paths`` name (folders searched through), in order; an ``Error`` for a
    path that is not there or a folder without any."""
    out: List[Path] = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_dir():
            found = sorted(p.rglob("*.rql"))
            if not found:
                raise Error(f"no .rql files in {raw!r}")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise Error(f"no file or folder {raw!r}")
    return list(OrderedDict.fromkeys(out))


def main(argv: Optional[Sequence[str]] = None, out: IO[str] = None) -> int:
    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    shipped = suites()
    if args.list_suites:
        for name, (_, what) in shipped.items():
            print(f"{name:<14} {what}", file=out)
        return EXIT_PASS
    try:
        unknown = [s for s in args.suite if s not in shipped]
        if unknown:
            raise Error(f"no suite {unknown[0]!r}; the suites: {', '.join(shipped)}")
        files = files_of(args.paths) + [shipped[s][0] for s in args.suite]
        if not files:
            raise Error("no .rql files to run: give files or folders, or --suite NAME")
        for path, what in ((args.junit, "the JUnit report"), (args.json, "the JSON report"),
                           *((r, "the report") for r in args.report)):
            if path:
                check_writable(path, what)
        from ..plan.options import command_params
        params = command_params(args.param)
        texts = [(f, text, _parsed(text)) for f, text in ((f, _read(f)) for f in files)]
    except Error as e:
        print(e.render(), file=sys.stderr)
        return EXIT_ERROR
    models = [m.strip() for m in args.model.split(",") if m.strip()] if args.model else [None]
    started = time.perf_counter()
    verdicts: List[Verdict] = []
    cancelled = False
    from ..output.progress import StatementProgress, is_terminal
    progress = StatementProgress(sys.stderr, is_terminal(out))  # in a CI log: a note a minute, with the time left
    progress.add(len(models) * sum(len(st) if isinstance(st, list) else 1 for _, _, st in texts))
    try:
        for model in models:
            for path, text, statements in texts:
                verdicts += run_file(path, text, statements, model, params, args, out, progress)
    except KeyboardInterrupt:
        cancelled = True
        print("cancelled: the reports hold the expectations judged so far", file=sys.stderr)
    finally:
        progress.close()
    seconds = time.perf_counter() - started
    judged = [v for v in verdicts if v.status != "none"]
    if not judged and not cancelled:
        print(f"note: no EXPECT in {', '.join(str(f) for f in files)}: nothing to judge", file=sys.stderr)
    changes = compare(judged, args.baseline) if args.baseline else []
    _summary(judged, seconds, models, changes, out)
    for path in (args.junit, args.json, *args.report):
        if path:
            write_report(path, judged, seconds, changes)
    if cancelled:
        return EXIT_CANCELLED
    t = totals(judged)
    return EXIT_ERROR if t["error"] else EXIT_FAIL if t["fail"] or t["inconclusive"] else EXIT_PASS


def _parsed(text: str):
    """A file's statements, or the syntax error that stops it (its one entry)."""
    from ..syntax import parse
    try:
        return parse(text)
    except Error as e:
        return e


def _read(path: Path) -> str:
    from ..syntax import decode_script
    try:
        return decode_script(path.read_bytes())
    except OSError as e:
        raise Error(f"cannot read {path}: {e.strerror or e}") from None


def run_file(path: Path, text: str, statements, model: Optional[str], params, args, out: IO[str],
             progress=None) -> List[Verdict]:
    """The verdicts of one file's expectations on ``model`` (``statements``: the file's, or its
    syntax error); statements without EXPECT run too; a statement that cannot run is an ``error``
    verdict, and where it has no EXPECT the file's later statements do not run."""
    import relmql
    from ..syntax import ast as A
    name = str(path)
    if isinstance(statements, Error):
        v = Verdict("error", f"{path.name} (syntax)", "", message=statements.render(name).splitlines()[0],
                    file=_shown(path), model=model)
        print(v.line_text(), file=out)
        return [v]
    con = relmql.connect(model=model, device=args.device, dtype=args.dtype, progress=False)
    verdicts = []
    for st, statement in zip(statements, con.statements(text, params)):
        query = st if isinstance(st, A.Query) else None
        line = text.count("\n", 0, st.span[0]) + 1
        expect = query.expect if query is not None else None
        label = (expect.name or "") if expect is not None else ""
        verdict = None
        if progress is not None:
            progress.at((f"[{model}] " if model else "") + f"{path.name}:{line}")
        try:
            result = statement.run()
            if result.expects:
                verdict = result.verdict
            else:
                for _ in result:  # a statement without EXPECT runs all the same (a SET, a warm-up)
                    pass
        except Error as e:
            verdict = Verdict("error", label or f"statement at line {line}", "",
                              message=e.render(name).splitlines()[0])
        if progress is not None:
            progress.step()
        if verdict is not None:
            _tell(verdict, path, line, model, out)
            verdicts.append(verdict)
            if verdict.status == "error" and expect is None:  # one the expectations after it may need:
                break  # the file stops here
    return verdicts


def _shown(path: Path) -> str:
    """A file as reports name it: a shipped suite by its name, another file as it was given."""
    return f"suite {path.stem}" if path.parent == SUITES else str(path)


def _tell(v: Verdict, path: Path, line: int, model: Optional[str], out: IO[str]) -> None:
    v.file, v.line, v.model = _shown(path), line, model
    print((f"[{model}] " if model else "") + f"{path.name}:{line}  " + v.line_text(), file=out, flush=True)


def _summary(verdicts: Sequence[Verdict], seconds: float, models, changes, out: IO[str]) -> None:
    t = totals(verdicts)
    if len(models) > 1:
        _, grid = by_model(verdicts)
        width = max([len(n) for _, n in grid] + [11])
        print("\n" + "expectation".ljust(width) + "  " + "  ".join(f"{m:<14}" for m in models), file=out)
        for (_, name), by in grid.items():
            print(name.ljust(width) + "  " + "  ".join(f"{by[m].status if m in by else '':<14}" for m in models),
                  file=out)
    for c in changes:
        print(f"changed: {c}", file=out)
    print(f"\n{t['pass']} passed, {t['fail']} failed, {t['inconclusive']} inconclusive, {t['error']} errors "
          f"in {seconds:.1f} s", file=out)


__all__ = ["main", "run_file", "files_of", "suites"]
