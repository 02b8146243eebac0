"""The command line: ``relmql FILE.rql ...``, ``-c``, standard input, output formats and errors.

Most tests call ``relmql.cli.main(argv)`` in-process; two run the real command in a subprocess.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import subprocess
import sys
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


@pytest.mark.parametrize("bad", ["who", "=x", "1a=x"])
def test_bad_param_is_an_error(capsys, bad):
    code, _, err = run(capsys, "--param", bad, "-c", "SELECT text MATCHING 'a';")
    assert code == 1 and "--param takes NAME=VALUE" in err


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
    (["-c", "SELECT text MATCHING 'a' FOR EACH ROW IN 'no/such/rows.jsonl';"], "no data file"),
    (["-c", "SELECT text MATCHING '(a)\\1';"], "back-references"),
    (["-c", "SET topk = 'x';"], "topk is a number"),
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
