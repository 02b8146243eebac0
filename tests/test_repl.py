"""The interactive shell, driven as a person would: keys into prompt_toolkit's pipe input, the
screen read back from a terminal output over a StringIO (and, where tmux is installed, the real
``relmql`` command in a tmux pane)."""

from __future__ import annotations

import _thread
import io
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prompt_toolkit.completion import CompleteEvent
from prompt_toolkit.data_structures import Size
from prompt_toolkit.document import Document
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output.vt100 import Vt100_Output
from pygments.token import Error as ErrorToken

import relmql
from relmql.repl import COMMANDS, run_repl, should_submit
from relmql.repl.commands import names
from relmql.repl.completer import RelmqlCompleter
from relmql.repl.lexer import KEYWORDS, RelmqlLexer

ROOT = Path(__file__).resolve().parents[1]
UP = "\x1b[A"
CTRL_C, CTRL_D = "\x03", "\x04"
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]|\r")


def plain(text: str) -> str:
    return _ESCAPES.sub("", text)


@pytest.fixture(scope="module")
def con():
    c = relmql.connect(model="tiny-gpt2", dtype="float32")
    c.model()  # load once, outside the timed parts
    return c


@pytest.fixture(autouse=True)
def fresh(request, tmp_path, monkeypatch):
    monkeypatch.setenv("RELMQL_HISTORY", str(tmp_path / "history"))
    if "con" in request.fixturenames:
        c = request.getfixturevalue("con")
        saved = dict(c.settings)
        yield
        c.settings.clear()
        c.settings.update(saved)
    else:
        yield


class Screen:
    """A terminal of fixed size whose bytes land in a StringIO."""

    def __init__(self, columns=100, rows=40):
        self.buffer = io.StringIO()
        self.output = Vt100_Output(self.buffer, lambda: Size(rows=rows, columns=columns), term="xterm")

    @property
    def text(self) -> str:
        return plain(self.buffer.getvalue())

    def wait_for(self, predicate, timeout=20.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate(self.text):
                return True
            time.sleep(0.02)
        return False


def drive(con, keys: str = "", script=None, columns=100, **options):
    """Run the shell on ``keys`` (and, in a second thread, ``script(send, screen)`` for steps that
    must wait for the screen); returns (exit status, what the screen shows)."""
    screen = Screen(columns)
    with create_pipe_input() as inp:
        inp.send_text(keys)
        helper, failed = None, []
        if script is not None:
            def run():
                try:
                    script(inp.send_text, screen)
                except BaseException as e:  # noqa: BLE001 -- raised again in the test's thread
                    failed.append(e)
                    inp.send_text("\x03")  # Ctrl-C: clear a half-typed statement (or a menu) so Ctrl-D ends
                finally:
                    inp.send_text("\r" + CTRL_D)  # never leave the shell waiting

            helper = threading.Thread(target=run, daemon=True)
            helper.start()
        code = run_repl(con, input=inp, output=screen.output, **options)
        if helper is not None:
            helper.join(5)
        if failed:
            raise failed[0]
    return code, screen.text


# -- the shell

def test_multiline_query_runs_and_shows_rows(con):
    code, screen = drive(con, "SELECT text, prob\rMATCHING 'a(b|c)'\rLIMIT 2;\r" + CTRL_D)
    assert code == 0
    assert "relmql> SELECT text, prob" in screen
    assert "   ...> MATCHING 'a(b|c)'" in screen and "   ...> LIMIT 2;" in screen
    rows = [line for line in screen.splitlines() if line.startswith("│ a")]
    assert [r.split("│")[1].strip() for r in rows] == ["ac", "ab"]
    assert "(2 rows)" in screen
    assert "Traceback" not in screen


def test_bad_queries_print_a_caret_and_the_shell_keeps_going(con):
    code, screen = drive(con, "SELECT nope MATCHING 'a';\r"
                              "SELECT text MATCHING 'a(b';\r"
                              "SELECT text\rMATCHING 'a' LIMIT;\r"
                              "SELECT text MATCHING 'a(b|c)' LIMIT 1;\r" + CTRL_D)
    assert code == 0
    lines = screen.splitlines()
    i = lines.index("error: unknown column 'nope'")
    assert lines[i + 1] == "  SELECT nope MATCHING 'a';"
    assert lines[i + 2] == "         ^^^^"
    assert "missing ), unterminated subpattern" in screen
    assert any(line.startswith("LINE 2: MATCHING 'a' LIMIT;") for line in lines)  # a multi-line buffer
    assert "(1 row)" in screen
    assert "Traceback" not in screen


def test_bad_prompts_print_a_caret_and_the_shell_keeps_going(con):
    code, screen = drive(con, "SELECT text MATCHING ' a' PROMPT chat('usr', 'hi');\r"
                              "SELECT text FROM tiny-gpt2 MATCHING ' a' PROMPT chat('user', 'hi');\r"
                              "SELECT text FROM tiny-gpt2, tiny-gpt2 MATCHING ' a';\r"
                              "SELECT text, prompt MATCHING ' a' PROMPT 'Once upon a time' LIMIT 1;\r" + CTRL_D)
    assert code == 0
    lines = screen.splitlines()
    i = lines.index("error: unknown role 'usr'; a role is one of system, user, assistant")
    assert lines[i + 2].strip() == "^^^^^"
    assert "model error: the model 'tiny-gpt2' has no chat template" in screen
    assert "error: FROM names the model 'tiny-gpt2' twice" in screen
    assert "Once upon a time" in screen and "(1 row)" in screen
    assert "Traceback" not in screen


def test_errors_before_the_first_row_leave_no_empty_table(con):
    bad = "SELECT text MATCHING 'x(?<=y)';"
    _, screen = drive(con, bad + "\r.mode csv\r" + bad + "\r.mode json\r" + bad + "\r" + CTRL_D)
    lines = screen.splitlines()
    echoes = [i for i, line in enumerate(lines) if line.endswith("relmql> " + bad)]
    assert len(echoes) == 3
    for i in echoes:  # the error right under the statement: no table, no CSV header, no '['
        assert lines[i + 1:i + 4] == ["regex error: look-behind assertions are not supported", "  " + bad,
                                      " " * (2 + bad.index("(?<=")) + "^" * len("(?<=y)")]
    assert "(0 rows)" not in screen and "┌" not in screen


def test_a_query_cancelled_before_its_first_row_shows_no_table(con, monkeypatch):
    import relmql.engine
    from relmql.execute import Cancelled
    started = threading.Event()

    def stuck(plan, models, listener, *args, **kwargs):  # a query still looking for its first row
        started.set()
        listener.cancel.wait(20)
        raise Cancelled("the query was cancelled")
        yield

    monkeypatch.setattr(relmql.engine, "run", stuck)

    def script(send, screen):
        assert started.wait(20)
        _thread.interrupt_main()
        assert screen.wait_for(lambda s: "cancelled" in s, timeout=30), screen.text[-2000:]

    _, screen = drive(con, "SELECT text MATCHING 'a(b|c)';\r", script)
    after = screen.split("relmql> SELECT text MATCHING 'a(b|c)';\n", 1)[1]
    assert after.startswith("cancelled\n")
    assert "(0 rows)" not in screen and "┌" not in screen and "Traceback" not in screen


def test_ctrl_c_is_not_lost_when_it_lands_in_a_finalizer(con, monkeypatch):
    """Python drops a KeyboardInterrupt raised inside a finalizer ("Exception ignored in ..."): the
    shell's own Ctrl-C handler only records the press, so the statement is cancelled at once
    rather than left to run on (here: until its 20 s wait ends)."""
    import signal
    import types

    import relmql.engine
    import relmql.repl.shell as shell_module
    from relmql.execute import Cancelled
    from relmql.repl.shell import Shell
    started = threading.Event()

    def stuck(plan, models, listener, *args, **kwargs):
        started.set()
        listener.cancel.wait(20)
        raise Cancelled("the query was cancelled")
        yield

    class PressedDuringFinalizer:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside __del__

    pressed = []

    def sleep(seconds):
        time.sleep(seconds)
        if started.is_set() and not pressed:
            pressed.append(1)
            PressedDuringFinalizer()  # made and dropped at once

    monkeypatch.setattr(relmql.engine, "run", stuck)
    monkeypatch.setattr(shell_module, "time", types.SimpleNamespace(sleep=sleep, perf_counter=time.perf_counter))
    out, err = io.StringIO(), io.StringIO()
    shell = Shell(con, out, err)
    before = signal.getsignal(signal.SIGINT)
    t0 = time.perf_counter()
    assert shell.run_text("SELECT text MATCHING 'a(b|c)';") is False
    assert time.perf_counter() - t0 < 10
    assert pressed and err.getvalue() == "cancelled\n"
    assert signal.getsignal(signal.SIGINT) is before  # the handler from before is back


def test_set_show_and_explain_statements(con):
    _, screen = drive(con, "SET topk = 5;\rEXPLAIN SELECT text MATCHING 'a(b|c)';\rSHOW MODELS;\r" + CTRL_D)
    assert "SET topk = 5" in screen
    assert re.search(r"^strings\s+2$", screen, re.M)
    assert "│ tiny-gpt2" in screen


def test_show_tables_are_sized_to_their_values(con):
    from relmql.plan import OPTIONS
    longest = max(len(spec.doc) for spec in OPTIONS.values())
    _, screen = drive(con, "SHOW OPTIONS;\r" + CTRL_D, columns=longest + 60)
    assert all(spec.doc in screen for spec in OPTIONS.values())  # not cut to equal columns
    _, screen = drive(con, "SHOW OPTIONS;\r" + CTRL_D, columns=100)
    table = [line for line in screen.splitlines() if line.startswith(("│", "┌", "├", "└"))]
    assert len(table) > len(OPTIONS) and max(len(line) for line in table) <= 100
    assert OPTIONS["topk"].doc[:40] in screen  # the meaning column has the room the others leave


def test_numbers_in_tables_are_never_cut(con):
    _, screen = drive(con, "SELECT 123456789012345 AS n, -prob * 1e-220 AS x MATCHING 'a(b|c)';\r"
                           "SELECT text, probability() AS p MATCHING 'a(b|c)' SAMPLE 50 GROUP BY text;\r" + CTRL_D)
    assert screen.count("│ 123456789012345 │") == 2
    assert len(re.findall(r"│ -\d\.\d{5}e-2\d\d │", screen)) == 2  # the exponent whole
    assert re.search(r"│ +\S+ \[\S+, \S+\] │", screen)  # an estimate with its whole interval
    assert "…" not in screen


def test_a_narrow_screen_cuts_text_not_numbers_and_keeps_the_borders(con):
    """SHOW OPTIONS on 44 columns: max_memory's 2147483648 needs 10 columns in two of them, so
    text columns give way first; where even that cannot fit, every line of the box is as long."""
    for columns in (44, 60):
        _, screen = drive(con, "SHOW OPTIONS;\r" + CTRL_D, columns=columns)
        table = [line for line in screen.splitlines() if line.startswith(("│", "┌", "├", "└"))]
        assert len({len(line) for line in table}) == 1, columns  # the borders line up
        assert screen.count("2147483648") == 2
        assert len(table[0]) <= max(columns, 4 * 13 + 1)  # text down to 8 columns; numbers whole


def test_a_table_too_wide_for_its_numbers_still_ends():
    """A number column as wide as a text column, before it: the text column gives way (the
    narrowing once picked the number's column, which cannot give, and never ended)."""
    from relmql.output.format import render_table
    got = []
    worker = threading.Thread(target=lambda: got.append(render_table(("n", "t"), [(1234567890, "abcdefghij")],
                                                                     max_width=20)), daemon=True)
    worker.start()
    worker.join(10)
    assert got, "render_table did not end"
    assert "│ 1234567890 │ abcdefg… │" in got[0]


def test_help_lists_every_command(con):
    _, screen = drive(con, ".help\r.help mode\r" + CTRL_D)
    listing = screen.split(".help\n", 1)[1]
    for cmd in COMMANDS.values():
        assert re.search(rf"^{re.escape(cmd.usage)} +{re.escape(cmd.help)}", listing, re.M), cmd.name
    assert ".exit" in listing and "Ctrl-C" in listing
    one = screen.split(".help mode\n", 1)[1].splitlines()[0]
    assert one.startswith(".mode [table|csv|json|jsonl]")


def test_mode_changes_the_output(con):
    _, screen = drive(con, ".mode\r.mode csv\rSELECT text, rank MATCHING 'a(b|c)';\r"
                           ".mode jsonl\rSELECT text MATCHING 'a(b|c)' LIMIT 1;\r.mode yaml\r" + CTRL_D)
    assert "mode: table" in screen
    assert "text,rank\nac,1\nab,2\n" in screen
    assert '{"text": "ac"}\n' in screen
    assert "unknown mode 'yaml'" in screen


def test_starting_mode_and_parameters(con):
    _, screen = drive(con, "SELECT text MATCHING :p;\r" + CTRL_D, mode="csv", params={"p": "a(b|c)"})
    assert "text\nac\nab\n" in screen


def test_timer_line(con):
    _, screen = drive(con, ".timer on\rSELECT text MATCHING 'a(b|c)';\r.timer off\rSELECT text MATCHING 'ab';\r"
                      + CTRL_D)
    assert "timer on" in screen and "timer off" in screen
    assert len(re.findall(r"^time: \d+\.\d{3} s$", screen, re.M)) == 1


def test_explain_mode_prints_the_plan_before_the_rows(con):
    _, screen = drive(con, ".explain on\rSELECT text MATCHING 'a(b|c)';\r" + CTRL_D)
    plan_at = re.search(r"^strings\s+2$", screen, re.M)
    assert plan_at and plan_at.start() < screen.index("(2 rows)")


def test_read_runs_a_file_and_locates_its_errors(con, tmp_path):
    script = tmp_path / "script.rql"
    script.write_text(".mode csv\n"
                      "-- two strings\n"
                      "SELECT text\n  MATCHING 'a(b|c)';\n"
                      "SELECT nope\n  MATCHING 'a';\n"
                      "SELECT 'never' MATCHING 'a';\n")
    _, screen = drive(con, f".read {script}\r.read {tmp_path / 'missing.rql'}\r" + CTRL_D)
    assert "text\nac\nab\n" in screen
    assert f"{script}:5: error: unknown column 'nope'" in screen
    assert "never" not in screen.split(f".read {script}", 1)[1]
    assert "cannot read" in screen and "missing.rql" in screen


def test_a_pasted_script_runs_its_meta_command_lines_as_read_does(con):
    paste = ("SELECT text MATCHING 'a(b|c)' LIMIT 1;\n.mode csv\nSELECT text, rank MATCHING 'a(b|c)';\n"
             ".mode jsonl\nSELECT nope MATCHING 'a';\nSELECT 'never' AS n MATCHING 'a';")
    _, screen = drive(con, "\x1b[200~" + paste + "\x1b[201~\r" + CTRL_D)
    assert "(1 row)" in screen and "text,rank\nac,1\nab,2\n" in screen
    assert "LINE 5: SELECT nope MATCHING 'a';" in screen  # the pasted buffer's line
    assert "never" not in screen.split("error: unknown column")[1]
    assert "syntax error" not in screen


def test_read_of_a_file_without_statements_says_so(con, tmp_path):
    empty = tmp_path / "empty.rql"
    empty.write_text("-- nothing yet\n\n")
    _, screen = drive(con, f".read {empty}\r.mode\r" + CTRL_D)
    assert f"note: {empty} has no statements" in screen
    assert "mode: table" in screen


def test_output_sends_results_to_a_file(con, tmp_path):
    target = tmp_path / "out.csv"
    _, screen = drive(con, f".mode csv\r.output {target}\rSELECT text MATCHING 'a(b|c)';\r.output\r"
                           f"SELECT text MATCHING 'a(b|c)' LIMIT 1;\r.output {tmp_path}/no/such/dir/x\r" + CTRL_D)
    assert target.read_text() == "text\nac\nab\n"
    assert "text\nac\n" in screen and "ab\n" not in screen
    assert "cannot write" in screen


def test_a_results_file_from_the_start_as_psqls_o(con, tmp_path):
    """``relmql -o FILE`` on a terminal: the shell, its results going to FILE (in the format its
    extension names) until ``.output``."""
    target = tmp_path / "out.csv"
    _, screen = drive(con, "SELECT text MATCHING 'a(b|c)';\r.output\rSELECT text MATCHING 'a(b|c)' LIMIT 1;\r"
                      + CTRL_D, results=str(target))
    assert target.read_text() == "text\nac\nab\n"
    assert f"results go to {target} (csv)" in screen and "(1 row)" in screen
    code, screen = drive(con, CTRL_D, results=str(tmp_path / "no" / "dir" / "x.csv"))
    assert code == 1 and "cannot write" in screen


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_to_a_full_disk_is_one_message(con):
    _, screen = drive(con, ".output /dev/full\rSELECT text MATCHING 'a(b|c)';\r.output\r"
                           "SELECT text MATCHING 'a(b|c)' LIMIT 1;\r" + CTRL_D)
    assert "error: cannot write /dev/full: No space left on device\n" in screen
    assert "internal error" not in screen and "(1 row)" in screen


def test_model_command(con):
    _, screen = drive(con, ".model\r.model smolm2\r.model\r" + CTRL_D)
    assert screen.count("model: tiny-gpt2") == 2
    assert "did you mean 'smollm2-135m'" in screen
    assert con.settings["model"] == "tiny-gpt2"


def test_unknown_meta_command_suggests_the_closest(con):
    _, screen = drive(con, ".hepl\r.outptu x\r.mode\r" + CTRL_D)
    assert "error: unknown command .hepl; did you mean .help?" in screen
    assert "did you mean .output?" in screen
    assert "mode: table" in screen  # still running


def test_ctrl_d_exits_and_ctrl_c_clears_the_line(con):
    start = time.monotonic()
    code, screen = drive(con, "SELECT tex" + CTRL_C + ".mode\r" + CTRL_D)
    assert code == 0 and time.monotonic() - start < 5
    assert "mode: table" in screen and "error" not in screen


def test_quit_and_exit(con):
    assert drive(con, ".quit\r")[0] == 0
    assert drive(con, "exit\r")[0] == 0


def _ctrl_c_then_a_query(send, screen):
    """Ctrl-C (SIGINT → KeyboardInterrupt in the main thread, which waits on the statement), its
    `cancelled`, and a query the shell then runs."""
    _thread.interrupt_main()
    assert screen.wait_for(lambda s: "cancelled" in s, timeout=30), screen.text[-2000:]
    send("SELECT text MATCHING 'a(b|c)';\r")
    assert screen.wait_for(lambda s: "(2 rows)" in s, timeout=8)


def test_ctrl_c_cancels_the_running_query_and_keeps_the_shell(con):
    def script(send, screen):
        # a query that runs for minutes: wait for its first rows, then Ctrl-C
        assert screen.wait_for(lambda s: "│     3 │" in s), screen.text[-2000:]
        _ctrl_c_then_a_query(send, screen)

    start = time.monotonic()
    code, screen = drive(con, ".timer on\rMATCHING '[a-z]{1,30}' USING topk 50 LIMIT 100000;\r", script)
    assert code == 0
    assert time.monotonic() - start < 10
    after = screen.split("cancelled", 1)[1]
    assert re.search(r"^time: \d+\.\d{3} s$", after, re.M)
    assert "(2 rows)" in after
    assert "Traceback" not in screen


def test_ctrl_c_stops_a_long_compile(con):
    """EXPLAIN of a pattern whose automaton takes minutes to build (2,097,152 states, under a
    raised max_states): Ctrl-C ends it within seconds, and the shell goes on."""
    def script(send, screen):
        time.sleep(1.5)  # into the determinization
        _ctrl_c_then_a_query(send, screen)

    start = time.monotonic()
    code, screen = drive(con, "EXPLAIN MATCHING '(a|b)*a(a|b){20}' USING max_states 3000000;\r", script)
    assert code == 0
    assert time.monotonic() - start < 20  # the compile alone takes minutes
    assert "(2 rows)" in screen.split("cancelled", 1)[1]
    assert "Traceback" not in screen and "strings" not in screen  # no plan was shown


def test_unexpected_failures_are_one_line_not_a_traceback(con, monkeypatch):
    def broken(*args):
        raise RuntimeError("boom")
    monkeypatch.setattr(con, "_statement", broken)
    _, screen = drive(con, "SELECT text MATCHING 'a';\r.mode\r" + CTRL_D)
    assert "internal error: RuntimeError: boom" in screen
    assert "mode: table" in screen and "Traceback" not in screen


def test_history_is_saved_and_up_recalls_it(con, tmp_path):
    drive(con, "SELECT text MATCHING 'a(b|c)' LIMIT 1;\r" + CTRL_D)
    assert "SELECT text MATCHING 'a(b|c)' LIMIT 1;" in (tmp_path / "history").read_text()
    _, screen = drive(con, UP + "\r" + CTRL_D)  # a new session: Up brings the query back
    assert "(1 row)" in screen


def test_enter_on_a_statement_found_with_ctrl_r_runs_it(con, tmp_path):
    drive(con, "SELECT text MATCHING 'a(b|c)' LIMIT 1;\rSELECT text MATCHING 'a(b|c)'\r  LIMIT 2;\r" + CTRL_D)
    _, screen = drive(con, "\x12b|c)' LIMIT 1\r\x03" + CTRL_D)  # Ctrl-R, the text to find, one Enter
    assert screen.count("(1 row)") == 1 and "(2 rows)" not in screen
    _, screen = drive(con, "\x12  LIMIT 2\r\x03" + CTRL_D)  # a statement of two lines runs too
    assert "(2 rows)" in screen


def test_history_falls_back_to_memory(con, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("RELMQL_HISTORY", str(blocker / "history"))  # a directory that cannot exist
    code, screen = drive(con, "SELECT text MATCHING 'ab';\r" + CTRL_D)
    assert code == 0 and "(1 row)" in screen
    assert f"history is kept for this session only: cannot write {blocker / 'history'} (File exists: {blocker})" \
        in screen


def test_enter_submits_only_complete_input():
    assert should_submit("SELECT text MATCHING 'a';")
    assert should_submit("  ")
    assert should_submit(".help")
    assert should_submit("quit")
    assert not should_submit("SELECT text MATCHING 'a'")
    assert not should_submit("SELECT text MATCHING 'a;'")
    assert not should_submit("SELECT text MATCHING 'a' -- ;")
    assert should_submit("SELECT text MATCHING 'a'; -- done")


def test_psql_habits_get_an_answer_not_a_continuation_prompt(con):
    """\\q quits, help shows .help, and another psql command says what the shell's are, at once
    (they used to open a '...>' line and then fail as SQL)."""
    for line in ("\\q", "\\d", "\\timing", "help"):
        assert should_submit(line)
    code, screen = drive(con, "\\timing\r" + "help\r" + "\\q\r")
    assert code == 0
    assert "\\timing: the shell's commands start with '.'" in screen and ".timer" in screen
    assert ".read" in screen and "syntax error" not in screen


# -- highlighting

def test_lexer_keywords_are_the_grammars():
    grammar = (ROOT / "grammar" / "relmql.lark").read_text()
    assert set(re.findall(r"^([A-Z]+)\.2:", grammar, re.M)) == set(KEYWORDS)


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.rql")), ids=lambda p: p.name)
def test_lexer_reads_the_examples_without_errors(path):
    assert not [v for t, v in RelmqlLexer().get_tokens(path.read_text()) if t in ErrorToken]


def test_lexer_tokens():
    q = ("-- c\nselect group(1) AS g, count(*) FROM tiny-gpt2 MATCHING 'it''s (a|b)' /* x */ PREFIX :p\n"
         "WHERE edits <= 1.5e0 AND text NOT MATCHING 'z' USING topk 40 LIMIT 10;\n.mode csv\n")
    toks = [(str(t), v) for t, v in RelmqlLexer().get_tokens(q) if v.strip()]
    assert not [v for t, v in toks if "Error" in t]
    kinds = dict((v, t) for t, v in toks)
    assert kinds["select"] == "Token.Keyword" and kinds["MATCHING"] == "Token.Keyword"
    assert kinds["group"] == "Token.Name.Function" and kinds["count"] == "Token.Name.Function"
    assert kinds["tiny-gpt2"] == "Token.Name.Namespace"
    assert kinds["''"] == "Token.Literal.String.Escape"
    assert kinds[":p"] == "Token.Name.Variable.Magic"
    assert kinds["1.5e0"] == "Token.Literal.Number.Float" and kinds["40"] == "Token.Literal.Number.Integer"
    assert kinds["-- c"] == "Token.Comment.Single" and kinds["/*"] == "Token.Comment.Multiline"
    assert kinds[".mode"] == "Token.Keyword.Pseudo"


def test_lexer_is_found_by_pygments_name():
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    html = highlight("SELECT text MATCHING 'a';", RelmqlLexer(), HtmlFormatter())
    assert '<span class="k">SELECT</span>' in html


# -- completion

@pytest.fixture(scope="module")
def completer(con):
    return RelmqlCompleter.for_connection(con, names())


def complete(completer, text):
    doc = Document(text, len(text))
    return [c.text for c in completer.get_completions(doc, CompleteEvent(completion_requested=True))]


@pytest.mark.parametrize("text,expected", [
    ("", ["SELECT", "MATCHING", "EXPLAIN", "SET", "SHOW"]),
    ("sel", ["SELECT"]),
    ("MATCHING 'a' USING ", ["topk", "topp", "temperature", "tokenization", "eos", "edits"]),
    ("MATCHING 'a' USING topk 5, to", ["topk", "topp", "tokenization"]),
    ("MATCHING 'a' USING tokenization ", ["canonical", "all"]),
    ("SELECT text FROM ", ["tiny-gpt2", "smollm2-135m"]),
    ("SELECT text FROM tiny-g", ["tiny-gpt2"]),
    ("SELECT text FROM tiny-gpt2, ", ["smollm2-135m", "gemma3-270m"]),
    ("SELECT text FROM tiny-gpt2, gem", ["gemma3-270m"]),
    ("SELECT text FROM tiny-gpt2 ", [",", "MATCHING", "PROMPT"]),
    ("MATCHING 'a' PRO", ["PROMPT"]),
    ("MATCHING 'a' PROMPT ", ["chat("]),
    ("MATCHING 'a' PROMPT ch", ["chat("]),
    ("MATCHING 'a' PROMPT chat('user', 'hi') ", ["WHERE", "USING"]),
    ("SELECT model, pro", ["prompt", "prob_under("]),
    ("MATCHING 'a' USING chat", ["chat_template"]),
    ("SELECT te", ["text"]),
    ("SELECT text, co", ["completion", "count(", "coalesce("]),
    ("SELECT text MATCHING 'a' WHERE ed", ["edits"]),
    ("SELECT text MATCHING 'a' WHERE edits ", ["AND", "OR"]),
    ("MATCHING 'a' GROUP BY ", ["text", "prob"]),
    ("MATCHING 'a' ORDER BY ", ["prob", "total_prob"]),
    ("SET ", ["topk", "model"]),
    ("SET tokenization = ", ["'canonical'", "'all'"]),
    ("SET model TO ", ["'tiny-gpt2'"]),
    ("SHOW ", ["MODELS", "OPTIONS", "FUNCTIONS", "PARAMETERS", "topk", "model"]),
    (".", [".help", ".model", ".mode", ".timer", ".read", ".output", ".quit", ".explain"]),
    (".mo", [".model", ".mode"]),
    (".model ", ["tiny-gpt2"]),
    (".mode ", ["table", "csv", "json", "jsonl"]),
    (".timer ", ["on", "off"]),
])
def test_completer_proposes(completer, text, expected):
    got = complete(completer, text)
    assert set(expected) <= set(got), got


@pytest.mark.parametrize("text,absent", [
    ("SELECT text MATCHING 'a' US", ["SELECT"]),
    ("SELECT text MATCHING 'a' USING topk 5 ", ["USING", "SELECT", "MATCHING"]),
    ("SELECT text MATCHING 'a' ", ["SELECT", "MATCHING"]),
])
def test_completer_leaves_out_used_clauses(completer, text, absent):
    assert not set(absent) & set(complete(completer, text))


@pytest.mark.parametrize("text", ["SELECT text MATCHING 'a", "MATCHING 'it''s", "MATCHING 'a' -- a com",
                                  "MATCHING 'a' /* note ", "MATCHING 'a' LIMIT 5"])
def test_completer_is_quiet_inside_strings_comments_and_numbers(completer, text):
    assert complete(completer, text) == []


def test_completion_is_applied_with_tab(con):
    def script(send, screen):
        assert screen.wait_for(lambda s: "SHOW FUNCTIONS" in s, timeout=5)  # completion runs in the background
        send(";\r")
        assert screen.wait_for(lambda s: "│ escape" in s, timeout=5)

    _, screen = drive(con, "SHOW FUNC\t", script)
    assert "│ escape" in screen


# -- the real console command in a terminal

@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_console_command_in_tmux(tmp_path):
    sock = f"relmql-test-{os.getpid()}"
    tmux = ["tmux", "-L", sock]
    env = dict(os.environ, RELMQL_HISTORY=str(tmp_path / "history"), TERM="xterm")
    cmd = f"{sys.executable} -m relmql.cli --model tiny-gpt2 --no-progress; echo relmql-exit=$?; sleep 30"

    def screen():
        return subprocess.run(tmux + ["capture-pane", "-p", "-J", "-t", "repl", "-S", "-200"], capture_output=True,
                              text=True, env=env).stdout

    def wait_for(needle, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            text = screen()
            if needle in text:
                return text
            time.sleep(0.1)
        raise AssertionError(f"{needle!r} not on the screen:\n{screen()}")

    def keys(*k):
        subprocess.run(tmux + ["send-keys", "-t", "repl", *k], check=True, env=env)

    subprocess.run(tmux + ["new-session", "-d", "-s", "repl", "-x", "110", "-y", "40", cmd], check=True, env=env,
                   cwd=ROOT)
    try:
        wait_for("relmql>")  # (capture-pane drops trailing spaces)
        keys("SELECT text, prob", "Enter", "MATCHING 'a(b|c)' LIMIT 2\\;", "Enter")
        text = wait_for("(2 rows)")
        assert "   ...> MATCHING 'a(b|c)' LIMIT 2;" in text
        assert re.search(r"^│ ac +│ +4\.\d+e-05 │$", text, re.M)
        # Ctrl-C through the terminal: a real SIGINT
        keys("MATCHING '[a-z]{1,30}' LIMIT 100000\\;", "Enter")
        wait_for("│     3 │")
        keys("C-c")
        wait_for("cancelled")
        keys(".hepl", "Enter")
        wait_for("hint: enter .help for the list of commands\nrelmql>")  # the next prompt is up
        keys("C-d")
        assert "relmql-exit=0" in wait_for("relmql-exit=")
        assert "Traceback" not in screen()
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True, env=env)


def test_the_embedded_model_through_the_shell(smol):
    """The multiple-choice birthday query typed into the shell on SmolLM2: the months on screen,
    in order, with the probabilities that scoring each string directly gives."""
    import math
    import relmql
    con = relmql.connect(dtype="float32")
    con.models.put("smollm2-135m", "cpu", "float32", smol)  # the session's copy, loaded once
    months = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
              "October", "November", "December"]
    prefix = "George Washington was born on"
    query = (f"SELECT rank, group(1) AS month, prob\rMATCHING '{prefix} ({'|'.join(months)})'\r"
             f"PREFIX '{prefix}'\rLIMIT 4;\r")
    code, screen = drive(con, query + CTRL_D)
    assert code == 0 and "Traceback" not in screen
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in screen.splitlines()
            if re.match(r"│ +\d+ │", line)]
    n_prefix = len(smol.vocabulary.encode(prefix))
    oracle = {}
    for m in months:
        toks = smol.vocabulary.encode(f"{prefix} {m}")
        assert toks[:n_prefix] == smol.vocabulary.encode(prefix)
        oracle[m] = math.exp(float(smol.score(toks)[n_prefix:].sum()))
    best = sorted(months, key=oracle.get, reverse=True)[:4]
    assert [r[0] for r in rows] == ["1", "2", "3", "4"]
    assert {r[1] for r in rows} == set(best)
    for _, month, prob in rows:
        assert abs(float(prob) - oracle[month]) <= 1e-4 * oracle[month] + 1e-6
