"""The command line: ``relmql FILE.rql ...``, ``-c``, standard input, output formats and errors.

Most tests call ``relmql.cli.main(argv)`` in-process; two run the real command in a subprocess.
"""

from __future__ import annotations

import csv
import gc
import io
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import relmql
from relmql.cli import main

REPO = Path(__file__).resolve().parent.parent
TINY = ["--model", "tiny-gpt2", "--dtype", "float32", "--no-progress"]
QUERY = "SELECT rank, text, prob, tokens MATCHING 'The (cat|dog|bird) (sat|ran)' PREFIX 'The'"
MONTHS = ("January February March April May June July August September October November December").split()


def run(capsys, *args):
    code = main([*TINY, *args])
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "Traceback" not in out.out
    return code, out.out, out.err


def jsonl(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def expected():
    """The rows of QUERY through the Python API: what every format must show."""
    con = relmql.connect(model="tiny-gpt2", dtype="float32")
    return con.sql(QUERY).to_dicts()


# -- where statements come from

def test_script_file_with_several_statements(capsys, tmp_path, expected):
    script = tmp_path / "queries.rql"
    script.write_text("-- a script\nSET topk = 30000;\n"
                      f"{QUERY} USING topk 50000;\n\n"
                      "SELECT text, prob MATCHING 'The (cat|dog|bird) (sat|ran)' PREFIX 'The' LIMIT 2;\n"
                      "SHOW OPTIONS;\n", encoding="utf-8")
    code, out, err = run(capsys, "--format", "jsonl", str(script))
    assert code == 0, err
    rows = jsonl(out)
    # a status statement (SET) prints nothing; the rows of the three others follow each other
    first = [r for r in rows if "tokens" in r]
    second = [r for r in rows if set(r) == {"text", "prob"}]
    options = {r["option"]: r["value"] for r in rows if "option" in r}
    assert len(first) == 6 and len(second) == 2 and len(rows) == 6 + 2 + len(options)
    assert [r["text"] for r in first] == [r["text"] for r in expected]
    # the SET applies to the statements after it: topk 30000 prunes, where the first's USING did not
    con = relmql.connect(model="tiny-gpt2", dtype="float32")
    topk = [r["text"] for r in con.sql(QUERY + " USING topk 30000 LIMIT 2").to_dicts()]
    assert [r["text"] for r in second] == topk
    assert options["topk"] == 30000


def test_dash_c_and_several_files_run_in_order(capsys, tmp_path):
    a, b = tmp_path / "a.rql", tmp_path / "b.rql"
    a.write_text("SELECT 'a' AS f, text MATCHING 'x(1|2)' LIMIT 1;", encoding="utf-8")
    b.write_text("SELECT 'b' AS f, text MATCHING 'y(1|2)' LIMIT 1;", encoding="utf-8")
    code, out, err = run(capsys, "--format", "jsonl", "-c", "SELECT 'c' AS f, text MATCHING 'z' LIMIT 1;",
                         "-c", "SELECT 'd' AS f, text MATCHING 'w'", str(a), str(b))
    assert code == 0, err
    assert [r["f"] for r in jsonl(out)] == ["c", "d", "a", "b"]
    assert jsonl(out)[0]["text"] == "z"


def test_stdin_in_a_subprocess(tmp_path):
    script = "SET topk = 30000;\nSELECT text, prob MATCHING 'The (cat|dog|bird) (sat|ran)' PREFIX 'The';\n"
    out = subprocess.run([sys.executable, "-m", "relmql.cli", *TINY, "--format", "csv"], input=script,
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = list(csv.reader(io.StringIO(out.stdout)))
    assert rows[0] == ["text", "prob"]
    con = relmql.connect(model="tiny-gpt2", dtype="float32")
    want = con.sql("SELECT text, prob MATCHING 'The (cat|dog|bird) (sat|ran)' PREFIX 'The' USING topk 30000")
    want = want.fetchall()
    assert [r[0] for r in rows[1:]] == [t for t, _ in want]
    assert all(math.isclose(float(r[1]), p, rel_tol=1e-6) for r, (_, p) in zip(rows[1:], want))
    assert "Traceback" not in out.stderr


def test_errors_in_a_subprocess_script(tmp_path):
    script = tmp_path / "bad.rql"
    script.write_text("SELECT text MATCHING 'a(b|c)';\n\nSELECT text\n  MATCHING 'x(?<=y)';\n", encoding="utf-8")
    out = subprocess.run([sys.executable, "-m", "relmql.cli", *TINY, "--format", "jsonl", str(script)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 1
    assert len(jsonl(out.stdout)) == 2  # the statement before the error ran (it parsed; the error is compiling)
    err = out.stderr
    assert "Traceback" not in err
    assert err.startswith(f"{script}:4: regex error: look-behind assertions are not supported"), err
    lines = err.splitlines()
    assert lines[1] == "LINE 4:   MATCHING 'x(?<=y)';"
    assert lines[2] == " " * lines[1].index("(?<=") + "^" * len("(?<=y)")


# -- output formats

def _table_rows(text):
    lines = [line for line in text.splitlines() if line.startswith("│")]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines]
    return cells[0], cells[1:]


def test_meta_commands_in_a_script(capsys, tmp_path, expected):
    """A script may hold the shell's meta-commands (as duckdb's and sqlite's scripts do): each
    applies to the statements after it, what they say goes to standard error, not among the rows."""
    saved, plotted, inner = tmp_path / "saved.jsonl", tmp_path / "probs.png", tmp_path / "inner.rql"
    inner.write_text("SELECT 'inner' AS f MATCHING 'i';\n", encoding="utf-8")
    script = tmp_path / "meta.rql"
    script.write_text(f".mode csv\n{QUERY};\n"
                      f".output {saved}\n.mode jsonl\n"
                      "SELECT text, prob MATCHING 'The (cat|dog|bird) (sat|ran)' PREFIX 'The'\n"
                      "  LIMIT 3;\n"
                      f".plot {plotted} bar\n"
                      f".output\n.mode json\n.timer on\n.explain on\n.read {inner}\n"
                      "SELECT 'after' AS f MATCHING 'a';\n.quit\nSELECT 'never' AS f MATCHING 'n';\n",
                      encoding="utf-8")
    code, out, err = run(capsys, "--format", "jsonl", str(script))
    assert code == 0, err
    at = re.search(r"(?m)^\[", out).start()  # the first JSON array (csv cells hold lists too)
    head, rest = out[:at], out[at:]
    table = list(csv.reader(io.StringIO(head)))
    assert table[0] == ["rank", "text", "prob", "tokens"]
    assert [r[1] for r in table[1:]] == [r["text"] for r in expected]
    assert [r["text"] for r in jsonl(saved.read_text(encoding="utf-8"))] == [r["text"] for r in expected[:3]]
    assert plotted.stat().st_size > 0
    # after .output with no file the results come back to standard output, as JSON arrays
    arrays, decoder = [], json.JSONDecoder()
    while rest.strip():
        got, end = decoder.raw_decode(rest.strip())
        arrays.append(got)
        rest = rest.strip()[end:]
    assert arrays == [[{"f": "inner"}], [{"f": "after"}]]
    assert "never" not in out
    assert err.count("time: ") == 2 and "MATCHING      'a'" in err and "wrote " + str(plotted) in err
    assert "inner" not in err


@pytest.mark.parametrize("line, message", [
    (".mode xml", "unknown mode 'xml'"),
    (".read nowhere.rql", "cannot read nowhere.rql"),
    (".frobnicate", "unknown command .frobnicate"),
    (".model nosuch", "unknown model 'nosuch'"),
])
def test_a_failing_meta_command_stops_the_script(capsys, tmp_path, line, message):
    script = tmp_path / "bad.rql"
    script.write_text(f"SELECT 'before' AS f MATCHING 'b';\n{line}\nSELECT 'after' AS f MATCHING 'a';\n",
                      encoding="utf-8")
    code, out, err = run(capsys, "--format", "jsonl", str(script))
    assert code == 1
    assert jsonl(out) == [{"f": "before"}]
    assert message in err and err.count("\n") <= 3, err
    if not line.startswith(".read"):
        assert err.startswith(f"{script}:2: "), err


def test_a_number_at_the_start_of_a_line_is_not_a_meta_command(capsys):
    code, out, err = run(capsys, "--format", "jsonl", "-c", "SELECT 'x' AS f MATCHING 'a';\n.5;")
    assert code == 1 and "syntax error" in err and "unknown command" not in err
    assert jsonl(out) == []  # the script did not parse: nothing ran


def test_formats_agree(capsys, expected):
    outputs = {}
    for fmt in ("csv", "json", "jsonl", "table"):
        code, out, err = run(capsys, "--format", fmt, "-c", QUERY + ";")
        assert code == 0, err
        outputs[fmt] = out
    as_csv = list(csv.reader(io.StringIO(outputs["csv"])))
    as_json = json.loads(outputs["json"])
    as_jsonl = jsonl(outputs["jsonl"])
    header, as_table = _table_rows(outputs["table"])
    columns = ["rank", "text", "prob", "tokens"]
    assert as_csv[0] == header == columns
    assert as_json == as_jsonl
    assert len(as_json) == len(as_csv) - 1 == len(as_table) == len(expected) == 6
    assert outputs["table"].rstrip().splitlines()[-1] == "(6 rows)"
    for want, j, c, t in zip(expected, as_json, as_csv[1:], as_table):
        assert list(j) == columns
        assert j["rank"] == want["rank"] == int(c[0]) == int(t[0])
        assert j["text"] == want["text"] == c[1] == t[1]
        assert math.isclose(j["prob"], want["prob"], rel_tol=1e-9)
        assert math.isclose(float(c[2]), want["prob"], rel_tol=1e-9)
        assert math.isclose(float(t[2]), want["prob"], rel_tol=1e-5)  # tables show 6 digits
        assert j["tokens"] == list(want["tokens"]) == json.loads(c[3])
        assert t[3] == "[" + ", ".join(map(str, want["tokens"])) + "]"


def test_the_default_format_off_a_terminal_is_jsonl(capsys, expected):
    code, out, _ = run(capsys, "-c", QUERY + ";")
    assert code == 0 and [r["text"] for r in jsonl(out)] == [r["text"] for r in expected]


@pytest.mark.parametrize("name, parse", [
    ("out.csv", lambda s: [r[1] for r in list(csv.reader(io.StringIO(s)))[1:]]),
    ("out.json", lambda s: [r["text"] for r in json.loads(s)]),
    ("out.jsonl", lambda s: [r["text"] for r in jsonl(s)]),
    ("out.txt", lambda s: [r[1] for r in _table_rows(s)[1]]),
])
def test_output_file_format_follows_its_extension(capsys, tmp_path, expected, name, parse):
    path = tmp_path / name
    code, out, err = run(capsys, "--output", str(path), "-c", QUERY + ";")
    assert code == 0, err
    assert out == ""
    assert parse(path.read_text(encoding="utf-8")) == [r["text"] for r in expected]


@pytest.mark.parametrize("name, parse", [
    ("dot.json", lambda s: [r["text"] for r in json.loads(s)]),
    ("dot.csv", lambda s: [r[0] for r in list(csv.reader(io.StringIO(s)))[1:]]),
])
def test_dot_output_follows_the_extension_as_the_flag_does(capsys, tmp_path, name, parse):
    path = tmp_path / name
    script = tmp_path / "s.rql"
    script.write_text(f".output {path}\nSELECT text MATCHING 'a(b|c)';\n.output\nSELECT text MATCHING 'x(b|c)';\n",
                      encoding="utf-8")
    code, out, err = run(capsys, str(script))
    assert code == 0, err
    assert sorted(parse(path.read_text(encoding="utf-8"))) == ["ab", "ac"]
    assert sorted(r["text"] for r in jsonl(out)) == ["xb", "xc"]  # back to the script's own format


def test_an_output_extension_that_is_no_format_says_what_is_written(capsys, tmp_path):
    path = tmp_path / "out.tsv"
    code, _, err = run(capsys, "-o", str(path), "-c", "SELECT text MATCHING 'a(b|c)';")
    assert code == 0 and "no output format is named .tsv: writing JSON lines" in err
    assert len(jsonl(path.read_text(encoding="utf-8"))) == 2


def test_output_format_flag_wins_over_the_extension(capsys, tmp_path):
    path = tmp_path / "out.csv"
    code, _, _ = run(capsys, "--format", "jsonl", "-o", str(path), "-c", QUERY + " LIMIT 2;")
    assert code == 0 and len(jsonl(path.read_text(encoding="utf-8"))) == 2


# -- flags

def test_param(capsys):
    code, out, err = run(capsys, "--param", "who=a.b(", "-p", "n=2", "-c",
                         "SELECT text, :n AS n MATCHING escape(:who) || '(x|y)' LIMIT :n;")
    assert code == 0, err
    rows = jsonl(out)
    assert sorted(r["text"] for r in rows) == ["a.b(x", "a.b(y"]
    assert {r["n"] for r in rows} == {"2"}  # parameters from the command line are strings


@pytest.mark.parametrize("bad", ["who", "=x", "a-b=x", "a b=x"])
def test_bad_param_is_an_error(capsys, bad):
    with pytest.raises(SystemExit) as info:  # a wrong command line: argparse's usage error
        run(capsys, "--param", bad, "-c", "SELECT text MATCHING 'a';")
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("usage: ") and "--param takes NAME=VALUE" in err


@pytest.mark.parametrize("flag, value, says", [("--seed", "-1", "seed must be at least 0"),
                                               ("--threads", "0", "threads must be at least 1"),
                                               ("--threads", "100000", "threads must be at most"),
                                               ("--device", "tpu", "device is cpu, cuda")])
def test_a_flag_value_no_setting_takes_is_a_wrong_command_line(capsys, flag, value, says):
    """As a value argparse refuses (``--seed abc``): exit status 2, nothing run, one message (a
    model, GPU or Ray that is not here is an error of this machine: exit status 1)."""
    code, out, err = run(capsys, flag, value, "-c", "SELECT text MATCHING 'a';")
    assert code == 2 and out == "" and err.startswith("error: " + says)


def test_threads_past_the_machine_s_cpus_are_refused_where_they_are_set(capsys):
    """torch starts a thread for each: 100,000 crashed the process (signal 11), with no message."""
    import os
    import torch
    threads = torch.get_num_threads()
    code, out, err = run(capsys, "-c", "SET threads = 100000;\nSELECT text MATCHING 'a';")
    assert code == 1 and out == "" and torch.get_num_threads() == threads
    cpus = os.cpu_count()
    assert f"error: threads must be at most {cpus}, the CPUs of this machine, not 100,000" in err
    assert "LINE 1: SET threads = 100000;\n" + " " * 22 + "^^^^^^\n" in err and "hint: more threads than CPUs" in err
    code, out, err = run(capsys, "-c", f"SET threads = {cpus}; SET threads = DEFAULT;")
    assert code == 0, err


def test_param_names_in_any_script(capsys):
    code, out, err = run(capsys, "-p", "caf\u00e9=2", "-p", "1st=x", "-c",
                         "SELECT :caf\u00e9 * 2 AS n, :1st AS f MATCHING 'a';")
    assert code == 0, err
    assert jsonl(out) == [{"n": 4, "f": "x"}]


def test_a_script_gives_its_parameters_defaults_that_param_overrides(capsys, tmp_path):
    """SET :draws = 5 in a script: its short run by default, the full one a --param away."""
    script = tmp_path / "draws.rql"
    script.write_text("SET :draws = 5;\n"
                      "SELECT count(*) AS n, :draws AS draws MATCHING 'The (cat|dog)' SAMPLE :draws;\n")
    code, out, err = run(capsys, str(script))
    assert code == 0, err
    assert jsonl(out) == [{"n": 5, "draws": 5}]
    code, out, err = run(capsys, "-p", "draws=12", str(script))
    assert code == 0, err
    assert jsonl(out) == [{"n": 12, "draws": "12"}]  # --param values are text, as always


def test_missing_param_is_an_error(capsys):
    code, out, err = run(capsys, "-c", "SELECT text MATCHING escape(:who);")
    assert code == 1 and out == ""
    assert err.startswith("error: parameter :who has no value")


def test_seed_flag(capsys):
    sample = "SELECT text MATCHING 'The (cat|dog|bird) (sat|ran)' PREFIX 'The' SAMPLE 12;"
    runs = {}
    for seed in ("1", "1", "2"):
        code, out, _ = run(capsys, "--seed", seed, "-c", sample)
        assert code == 0
        runs.setdefault(seed, []).append([r["text"] for r in jsonl(out)])
    assert runs["1"][0] == runs["1"][1] and len(runs["1"][0]) == 12
    assert runs["2"][0] != runs["1"][0]
    con = relmql.connect(model="tiny-gpt2", dtype="float32")
    assert [t for (t,) in con.sql(sample.replace("SAMPLE", "USING seed 2 SAMPLE"))] == runs["2"][0]


def test_device_flag(capsys):
    code, out, err = run(capsys, "--device", "cpu", "-c", "EXPLAIN SELECT text MATCHING 'a';")
    assert code == 0, err
    assert any("tiny-gpt2 on cpu" in r["plan"] for r in jsonl(out))


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"relmql {relmql.__version__}"


# -- errors

def test_a_script_error_has_file_line_and_caret(capsys, tmp_path):
    script = tmp_path / "bad.rql"
    script.write_text("-- line 1\nSELECT text,\n  probability\nMATCHING 'a(b|c)';\n", encoding="utf-8")
    code, out, err = run(capsys, str(script))
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert lines[0] == f"{script}:3: error: unknown column 'probability'"
    assert lines[1] == "LINE 3:   probability"
    assert lines[2] == " " * len("LINE 3:   ") + "^" * len("probability")


def test_a_syntax_error_in_statement_3_runs_nothing(capsys, tmp_path):
    script = tmp_path / "three.rql"
    script.write_text("SELECT text MATCHING 'a(b|c)';\n"
                      "SELECT text MATCHING 'd(e|f)';\n"
                      "SELECT text MATCHING 'g' LIMT 3;\n", encoding="utf-8")
    out_file = tmp_path / "rows.jsonl"
    code, out, err = run(capsys, "-o", str(out_file), str(script))
    assert code == 1
    assert out_file.read_text(encoding="utf-8") == ""  # statements 1 and 2 did not run
    assert err.startswith(f"{script}:3: syntax error: unexpected 'LIMT'")
    assert "^^^^" in err


def test_a_run_time_error_stops_the_script_after_what_ran(capsys, tmp_path):
    script = tmp_path / "two.rql"
    script.write_text("SELECT text MATCHING 'a(b|c)';\nSELECT text MATCHING 'a' PREFIX 'b';\n"
                      "SELECT text MATCHING 'never';\n", encoding="utf-8")
    code, out, err = run(capsys, str(script))
    assert code == 1
    assert sorted(r["text"] for r in jsonl(out)) == ["ab", "ac"]
    assert err.startswith(f"{script}:2: compile error: no string of MATCHING starts with a string of PREFIX")


def test_dash_c_errors_have_a_caret_without_a_file_name(capsys):
    code, _, err = run(capsys, "-c", "SELECT text MATCHING 'a' USING topq 3;")
    assert code == 1
    lines = err.splitlines()
    assert lines[0] == "error: unknown option 'topq'; did you mean topp?"
    assert lines[2].index("^") - lines[1].index("SELECT") == len("SELECT text MATCHING 'a' USING ")


@pytest.mark.parametrize("args, words", [
    (["--model", "smolm2", "-c", "SELECT text MATCHING 'a';"], "did you mean 'smollm2-135m'"),
    (["no/such/file.rql"], "cannot read no/such/file.rql"),
    (["help"], "hint: FILE arguments are scripts of statements to run; relmql --help lists the options"),
    (["-c", "SELECT text MATCHING 'a' FOR EACH ROW IN 'no/such/rows.jsonl';"], "no data file"),
    (["-c", "SELECT text MATCHING '(a)\\1';"], "back-references"),
    (["-c", "SET topk = 'x';"], "topk is a whole number"),
])
def test_errors_exit_1_without_a_traceback(capsys, args, words):
    code = main(["--no-progress", *args]) if args[0] == "--model" else main([*TINY, *args])
    err = capsys.readouterr().err
    assert code == 1 and words in err and "Traceback" not in err


# -- the example

def test_birthdays_multiple_choice_on_tiny_gpt2(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    text = (REPO / "examples" / "birthdays.rql").read_text(encoding="utf-8")
    first = text.split(";")[0] + ";"
    assert "LIMIT 5" in first and "(January|February|" in first
    code, out, err = run(capsys, "--format", "json", "-c", first)
    assert code == 0, err
    rows = json.loads(out)
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5]
    probs = [r["prob"] for r in rows]
    assert probs == sorted(probs, reverse=True) and all(0 < p <= 1 for p in probs)
    months = [r["month"] for r in rows]
    assert all(m.strip() in MONTHS for m in months)
    assert len(set(months)) == 5


def test_the_console_entry_point_is_main():
    assert re.search(r'relmql\s*=\s*"relmql\.cli:main"', (REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert os.path.isfile(REPO / "relmql" / "cli.py")


# -- what the user sees: no empty tables, no progress bar in the rows, no torch for --help

BAD_REGEX = "SELECT text MATCHING 'x(?<=y)';"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def screen_of(raw: str):
    """The lines a terminal shows after ``raw``: a carriage return goes back to the start of the
    line, and what follows overwrites it (escape sequences are dropped)."""
    lines, row, col = [""], 0, 0
    for ch in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw):
        if ch == "\n":
            row, col = row + 1, 0
            if row == len(lines):
                lines.append("")
        elif ch == "\r":
            col = 0
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + ch + line[col + 1:]
            col += 1
    return [line.rstrip() for line in lines]


def run_on_terminal(monkeypatch, *args, progress=False):
    """``main`` with standard output a terminal (tables stream); standard error a separate
    StringIO, or with ``progress`` the same terminal, as a shell shows both."""
    out = _Terminal()
    err = out if progress else io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    flags = TINY if not progress else [f for f in TINY if f != "--no-progress"]
    code = main([*flags, *args])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "jsonl"])
def test_an_error_before_the_first_row_writes_no_header(monkeypatch, fmt):
    code, out, err = run_on_terminal(monkeypatch, "--format", fmt, "-c", BAD_REGEX)
    assert code == 1
    assert out == ""  # no empty table, no CSV header, no '['
    lines = err.splitlines()
    assert lines[0] == "regex error: look-behind assertions are not supported"
    assert lines[1] == "  " + BAD_REGEX and lines[2] == " " * lines[1].index("(?<=") + "^" * len("(?<=y)")
    assert "Traceback" not in err


@pytest.mark.parametrize("fmt", ["table", "csv", "json", "jsonl"])
def test_cancelled_before_the_first_row_writes_nothing(monkeypatch, fmt):
    import relmql.engine

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
        yield  # a generator, as engine.run is

    monkeypatch.setattr(relmql.engine, "run", interrupted)
    code, out, err = run_on_terminal(monkeypatch, "--format", fmt, "-c", "SELECT text MATCHING 'a(b|c)';")
    assert (code, out, err) == (130, "", "cancelled\n")



def test_ctrl_c_is_not_lost_when_it_lands_in_a_finalizer(monkeypatch):
    """Python drops a KeyboardInterrupt raised inside a finalizer ("Exception ignored in ..."); a
    script's query is then cancelled too, so it stops at once (here: rather than at the end of its
    20 s wait) and the script ends as Ctrl-C ends it, with nothing printed about the lost one."""
    import signal

    import relmql.engine
    from relmql.records import Cancelled

    class PressedDuringFinalizer:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside __del__

    def stuck(plan, models, listener, *args, **kwargs):
        PressedDuringFinalizer()  # made and dropped at once
        listener.cancel.wait(20)
        raise Cancelled("the query was cancelled")
        yield

    monkeypatch.setattr(relmql.engine, "run", stuck)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # a test worker may ignore SIGINT
    try:
        t0 = time.perf_counter()
        code, out, err = run_on_terminal(monkeypatch, "-c", "SELECT text MATCHING 'a(b|c)';",
                                         "-c", "SELECT text MATCHING 'd';")
        assert time.perf_counter() - t0 < 10
        assert signal.signal(signal.SIGINT, before) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, before)
    assert (code, out, err) == (130, "", "cancelled\n")

def test_a_failing_second_query_adds_nothing_after_the_first_table(monkeypatch):
    code, out, err = run_on_terminal(monkeypatch, "-c", "SELECT text MATCHING 'a(b|c)';", "-c", BAD_REGEX)
    assert code == 1 and err.startswith("regex error: look-behind")
    assert out.endswith("└" + "─" * (len(out.splitlines()[0]) - 2) + "┘\n(2 rows)\n")  # no blank line after it


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_the_progress_bar_never_runs_into_the_rows(monkeypatch, fmt):
    from relmql.output import bars
    monkeypatch.setattr(bars.RowBar, "DELAY", 0)  # drawn at once, redrawn at every row
    monkeypatch.setattr(bars.RowBar, "MININTERVAL", 0)
    code, raw, _ = run_on_terminal(monkeypatch, "--format", fmt, "-c",
                                   "SELECT text MATCHING '(a|b)(c|d)(e|f)' LIMIT 8;", progress=True)
    assert code == 0
    assert re.search(r"\d+row \[\d\d:\d\d", raw)  # the bar was drawn on the same terminal
    lines = [line for line in screen_of(raw) if line.strip()]
    if fmt == "table":
        assert not [line for line in lines[:-1] if line[0] not in "┌│├└"]
        assert lines[-1] == "(8 rows)" and len(lines) == 4 + 8 + 1
    else:
        assert lines[0] == "text" and len(lines) == 9
        assert all(re.fullmatch("[ab][cd][ef]", line) for line in lines[1:]), lines


def test_the_progress_bar_on_a_real_terminal(tmp_path):
    """The real command on a pseudo-terminal, standard output and error both: a query that runs
    for seconds, long past the bar's one-second delay, so that the bar is drawn between rows (its
    own search: 3,000 rows, about 2.5 s on two cores even with the tokenizer's tables cached)."""
    import fcntl
    import pty
    import select
    import struct
    import termios
    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))  # rows, columns
    proc = subprocess.Popen([sys.executable, "-m", "relmql.cli", "--model", "tiny-gpt2", "--dtype", "float32",
                             "-c", "SELECT text MATCHING '[a-z]{1,30}' USING topk 50 LIMIT 3000;"],
                            stdin=subprocess.DEVNULL, stdout=child_fd, stderr=child_fd, cwd=tmp_path,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"})  # as a user runs it
    os.close(child_fd)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([main_fd], [], [], 300)
            if not ready:
                raise AssertionError("no output for 300 s")
            try:
                data = os.read(main_fd, 65536)
            except OSError:  # EIO: the child has exited
                break
            if not data:
                break
            chunks.append(data)
    finally:
        proc.wait(60)
        os.close(main_fd)
    raw = b"".join(chunks).decode("utf-8")
    assert proc.returncode == 0, raw[-2000:]
    assert re.search(r"\d+row \[\d\d:\d\d", raw), raw[:2000]  # the bar was drawn
    lines = [line for line in screen_of(raw) if line.strip()]
    assert lines[-1] == "(3000 rows)"
    assert not [line for line in lines[:-1] if line[0] not in "┌│├└"]  # not one line with a bar in it


@pytest.mark.parametrize("text", ["", "-- nothing here\n/* nor here */\n  \n"])
def test_an_empty_script_says_so(capsys, tmp_path, text):
    script = tmp_path / "empty.rql"
    script.write_text(text, encoding="utf-8")
    code, out, err = run(capsys, str(script))
    assert (code, out, err) == (0, "", f"note: {script} has no statements\n")


def test_an_empty_script_among_others(capsys, tmp_path):
    empty = tmp_path / "empty.rql"
    empty.write_text("-- to do\n", encoding="utf-8")
    code, out, err = run(capsys, "-c", "", str(empty), "-c", "SELECT text MATCHING 'ab';")
    assert code == 0 and [r["text"] for r in jsonl(out)] == ["ab"]
    assert err.splitlines() == ["note: -c has no statements", f"note: {empty} has no statements"]


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_do_not_import_torch(flag):
    # as `python -m relmql` (relmql/__main__.py) runs the same main() as the `relmql` script
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "relmql", flag],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    assert out.stdout.startswith(f"relmql {relmql.__version__}" if flag == "--version" else "usage: relmql")
    imported = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    assert "relmql.models" in imported and "argparse" in imported  # the list is real: the parser was built
    assert not {m for m in imported if m.split(".")[0] in ("torch", "transformers")}


def test_import_relmql_is_light_and_exports_its_names():
    code = ("import sys, relmql\n"
            "assert 'torch' not in sys.modules and 'relmql.api' not in sys.modules\n"
            "from relmql.models import BUILTIN_MODELS, DEFAULT_MODEL, load_model\n"
            "assert 'torch' not in sys.modules\n"
            "assert callable(relmql.connect) and callable(relmql.sql) and 'torch' in sys.modules\n"
            "names = {}\n"
            "exec('from relmql import *', names)\n"
            "assert set(relmql.__all__) <= set(names), set(relmql.__all__) - set(names)\n"
            "assert issubclass(relmql.ParseError, relmql.Error) and issubclass(relmql.PlanError, relmql.Error)\n"
            "from relmql.models import LanguageModel, ModelState, Vocabulary\n"
            "print(relmql.stats.wilson(37, 100)[0] > 0.28)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "True\n"


def test_an_output_path_that_cannot_be_written(capsys, tmp_path):
    path = tmp_path / "no" / "such" / "dir" / "x.csv"
    code, out, err = run(capsys, "-o", str(path), "-c", "SELECT text MATCHING 'a';")
    assert (code, out, err) == (1, "", f"error: cannot write {path}: No such file or directory\n")


def test_ctrl_c_while_reading_standard_input(capsys, monkeypatch):
    class Interrupted:
        def read(self):
            raise KeyboardInterrupt

        def isatty(self):
            return False

    monkeypatch.setattr(sys, "stdin", Interrupted())
    code, out, err = run(capsys)
    assert (code, out, err) == (130, "", "cancelled\n")


def test_csv_writes_booleans_and_nulls_as_the_other_formats_do(capsys):
    query = "SELECT text, prob > 0 AS likely, prob < 0 AS never, NULL AS nothing MATCHING 'a(b|c)';"
    code, out, _ = run(capsys, "--format", "csv", "-c", query)
    got = list(csv.reader(io.StringIO(out)))
    assert code == 0 and got[0] == ["text", "likely", "never", "nothing"]
    assert sorted(got[1:]) == [["ab", "true", "false", ""], ["ac", "true", "false", ""]]
    code, out, _ = run(capsys, "--format", "jsonl", "-c", query)
    assert [json.loads(line)["likely"] for line in out.splitlines()] == [True, True]


def test_tables_escape_control_characters_and_csv_keeps_them(capsys):
    query = r"SELECT text MATCHING 'a\x1b\[31mRED\x07b\x08c\u202e\\d';"  # ESC, BEL, backspace, RLO, a backslash
    code, out, err = run(capsys, "--format", "table", "-c", query)
    assert code == 0, err
    assert r"│ a\x1b[31mRED\x07b\x08c\u202e\\d │" in out
    assert not any(ch in out for ch in "\x1b\x07\x08\u202e")
    code, out, _ = run(capsys, "--format", "csv", "-c", query)
    assert out == "text\na\x1b[31mRED\x07b\x08c\u202e\\d\n"  # data, as it is


def test_json_output_of_several_statements_says_it_is_several_arrays(capsys, tmp_path):
    target = tmp_path / "m.json"
    code, _, err = run(capsys, "-o", str(target), "-c", "SELECT text MATCHING 'a(b|c)'; SELECT 1 AS x MATCHING 'a'")
    assert code == 0 and err == f"note: {target} holds one JSON array per statement; --format jsonl writes rows " \
                                "that read as one stream\n"
    decoder, text, arrays = json.JSONDecoder(), target.read_text().strip(), []
    while text:
        value, end = decoder.raw_decode(text)
        arrays.append(value)
        text = text[end:].strip()
    assert [len(a) for a in arrays] == [2, 1]
    code, _, err = run(capsys, "-o", str(target), "-c", "SELECT text MATCHING 'a(b|c)'")
    assert code == 0 and err == "" and len(json.loads(target.read_text())) == 2
    # two -c (or two files) write two arrays too, and say so once
    code, _, err = run(capsys, "-o", str(target), "-c", "SELECT text MATCHING 'a(b|c)'",
                       "-c", "SELECT 1 AS x MATCHING 'a'", "-c", "SELECT 2 AS y MATCHING 'a'")
    assert code == 0 and err.count("holds one JSON array per statement") == 1
    # tables of two -c are apart, as those of one
    code, out, _ = run(capsys, "--format", "table", "-c", "SELECT 1 AS x MATCHING 'a'",
                       "-c", "SELECT 2 AS y MATCHING 'a'")
    assert code == 0 and "(1 row)\n\n┌" in out


def test_json_says_when_it_writes_an_infinity_as_null(capsys):
    query = "SELECT text, ln(0) AS l, 1 AS one MATCHING 'a(b|c)';"
    for fmt in ("json", "jsonl"):
        code, out, err = run(capsys, "--format", fmt, "-c", query)
        rows = json.loads(out) if fmt == "json" else [json.loads(line) for line in out.splitlines()]
        assert code == 0 and [(r["l"], r["one"]) for r in rows] == [(None, 1), (None, 1)]
        assert err == "note: JSON has no infinity or NaN: written as null in 2 rows\n"
    code, out, err = run(capsys, "--format", "csv", "-c", query)
    assert "-inf" in out and err == ""


def test_a_read_that_reads_itself_stops_the_script(capsys, tmp_path):
    loop = tmp_path / "loop.rql"
    loop.write_text(f".read {loop}\n", encoding="utf-8")
    script = tmp_path / "script.rql"
    script.write_text(f".read {loop}\nSELECT 'after' AS f MATCHING 'a';\n", encoding="utf-8")
    code, out, err = run(capsys, "--format", "jsonl", str(script))
    assert code == 1 and out == "" and "after" not in out
    assert err == f"{loop}:1: error: .read nested more than 16 deep (does {loop} read itself?)\n"

def test_ctrl_c_in_a_scripts_read_stops_the_script(capsys, monkeypatch, tmp_path):
    """In the shell Ctrl-C cancels the statement and the shell goes on; in a script it stops the
    script, in a ``.read`` file as in the script itself."""
    from relmql.repl import shell as shell_module
    inner = tmp_path / "inner.rql"
    inner.write_text(f"{QUERY};\n", encoding="utf-8")
    script = tmp_path / "script.rql"
    script.write_text(f".read {inner}\nSELECT 'after' AS f MATCHING 'a';\n", encoding="utf-8")
    real, pressed = shell_module.time.sleep, []

    def sleep(seconds):  # Ctrl-C while the shell waits for the .read file's statement
        if not pressed:
            pressed.append(seconds)
            raise KeyboardInterrupt
        real(seconds)
    monkeypatch.setattr(shell_module.time, "sleep", sleep)
    code, out, err = run(capsys, "--format", "jsonl", str(script))
    assert pressed and code == 130
    assert "after" not in out and "cancelled" in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("fmt", ["table", "jsonl"])
def test_a_full_disk_is_one_message(monkeypatch, fmt):
    query = "SELECT text MATCHING 'a(b|c)';"
    with open("/dev/full", "w", encoding="utf-8") as full:
        monkeypatch.setattr(sys, "stdout", full)
        err = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        assert main([*TINY, "--format", fmt, "-c", query]) == 1
        assert err.getvalue() == "error: cannot write standard output: No space left on device\n"
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    assert main([*TINY, "--format", fmt, "-o", "/dev/full", "-c", query]) == 1
    assert err.getvalue() == "error: cannot write /dev/full: No space left on device\n"


def test_a_plot_into_a_missing_folder_fails_before_the_query_runs(capsys, tmp_path):
    path = tmp_path / "no" / "x.png"
    code, out, err = run(capsys, "--plot", str(path), "-c", QUERY + ";")
    assert code == 1 and out == ""
    assert err.splitlines() == [f"error: cannot write {path}: no folder {path.parent}", "hint: the folder must exist"]


def test_what_is_alive_once_a_model_is_loaded_leaves_the_cycle_collector(capsys):
    """The shell freezes the objects alive after loading a model (gc.freeze), so that a long
    search's full collections do not walk torch's and the model's objects again and again."""
    assert gc.get_freeze_count() == 0  # conftest unfreezes after every test
    code, out, _ = run(capsys, "-c", "SELECT text MATCHING 'The (cat|dog)' LIMIT 1")
    assert code == 0 and out
    assert gc.get_freeze_count() > 10_000


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_an_error_after_some_rows_keeps_them_in_a_whole_document(capsys, fmt):
    # ln(2 - rank): rows 1 and 2 are written, row 3 takes the logarithm of a negative number
    query = "SELECT rank, ln(2 - rank) AS y MATCHING 'a(b|c|d)' LIMIT 3;"
    code, out, err = run(capsys, "--format", fmt, "-c", query)
    assert code == 1 and "logarithm of a negative number" in err
    if fmt == "json":
        assert [r["rank"] for r in json.loads(out)] == [1, 2]  # the array is closed
    else:
        assert out.splitlines()[0].startswith("┌") and out.splitlines()[-2].startswith("└")
        assert out.splitlines()[-1] == "(2 rows)"


def test_tables_count_wide_characters_as_two_columns(capsys):
    code, out, _ = run(capsys, "--format", "table", "-c", "SELECT '日本語' AS s, 'x😀' AS \"名\" MATCHING 'a';")
    assert code == 0
    from relmql.errors import display_width
    lines = out.splitlines()[:-1]
    assert len({display_width(line) for line in lines}) == 1, lines  # every line as wide as the box
    assert "│ 日本語 │ x😀 │" in out


def test_json_objects_from_data_files_are_json_in_every_format(capsys, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"o": {"k": "é"}, "l": [1, "x"]}\n', encoding="utf-8")
    query = f"SELECT :o AS o, :l AS l MATCHING 'a' LIMIT 1 FOR EACH ROW IN '{data}';"
    code, out, _ = run(capsys, "--format", "csv", "-c", query)
    assert code == 0 and list(csv.reader(io.StringIO(out)))[1] == ['{"k": "é"}', '[1, "x"]']
    code, out, _ = run(capsys, "--format", "table", "-c", query)
    assert '│ {"k": "é"} │ [1, x] │' in out


def test_an_empty_data_file_says_so(capsys, tmp_path):
    data = tmp_path / "none.csv"
    data.write_text("q\n", encoding="utf-8")
    code, out, err = run(capsys, "-c", f"SELECT count(*) AS c MATCHING 'a' FOR EACH ROW IN '{data}';")
    assert code == 0 and jsonl(out) == [{"c": 0}]
    assert err == f"note: no data rows to run in {data}\n"
    # EXPLAIN says the same, where it was an error
    code, out, err = run(capsys, "-c", f"EXPLAIN SELECT count(*) AS c MATCHING 'a' FOR EACH ROW IN '{data}' "
                                       "WHERE :q <> 'x';")
    assert code == 0 and err == ""
    assert [r["plan"] for r in jsonl(out)] == [f"dataset  {data}: no data rows to run", "rows     WHERE :q <> 'x'"]


def test_ray_flags_without_the_ray_engine_say_they_do_nothing_yet(capsys):
    """--workers and --ray-address configure the Ray engine: given without it they would be
    ignored in silence, so the run says so, and still runs (a script may SET engine = 'ray')."""
    code, out, err = run(capsys, "--format", "jsonl", "--workers", "2", "-c", "SELECT text MATCHING 'z' LIMIT 1")
    assert code == 0 and jsonl(out) == [{"text": "z"}]
    assert err == ("note: --workers applies to the Ray engine (--engine ray, or SET engine = 'ray' in the script); "
                   "until then queries run in this process\n")
    code, out, err = run(capsys, "--format", "jsonl", "-c", "SELECT text MATCHING 'z' LIMIT 1")
    assert code == 0 and err == ""
