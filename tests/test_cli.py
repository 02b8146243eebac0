"""The command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from relmql.cli import main


def test_cli_runs_a_query(capsys):
    code = main(["--model", "tiny-gpt2", "--matching", "The (man|woman) was trained in (art|science)",
                 "--prefix", "The (man|woman) was trained in", "--limit", "3"])
    out = capsys.readouterr()
    assert code == 0
    rows = [line.split(None, 2) for line in out.out.strip().splitlines()]
    assert [r[0] for r in rows] == ["1", "2", "3"]
    probs = [float(r[1]) for r in rows]
    assert probs == sorted(probs, reverse=True)
    assert all("was trained in" in r[2] for r in rows)
    assert "3 rows" in out.err


@pytest.mark.parametrize("args,needle,caret_col", [
    (["--matching", "a(b"], "missing ), unterminated subpattern", 1),
    (["--matching", "abc", "--prefix", "x(?=y)"], "look-ahead", 1),
    (["--matching", "abc", "--prefix", "x"], "no string of MATCHING starts with", 0),
    (["--matching", "[^\\x00-\\U0010ffff]"], "matches no string", 0),
])
def test_cli_errors_have_a_caret_and_no_traceback(capsys, args, needle, caret_col):
    code = main(["--model", "tiny-gpt2", *args])
    err = capsys.readouterr().err
    assert code == 1
    assert needle in err and "Traceback" not in err
    lines = err.splitlines()
    caret = next(line for line in lines if line.strip() and set(line.strip()) == {"^"})
    assert caret.index("^") - 2 == caret_col


def test_cli_unknown_model(capsys):
    assert main(["--model", "smolm2", "--matching", "a"]) == 1
    assert "did you mean 'smollm2-135m'" in capsys.readouterr().err


def test_console_script_version():
    out = subprocess.run([sys.executable, "-m", "relmql.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("relmql ")


@pytest.mark.parametrize("flag", ["--topk", "--limit", "--max-tokens"])
@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_cli_rejects_bad_numbers(capsys, flag, value):
    with pytest.raises(SystemExit) as info:
        main(["--model", "tiny-gpt2", "--matching", "a", flag, value])
    assert info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_cli_explain_with_a_huge_language(capsys):
    assert main(["--model", "tiny-gpt2", "--matching", ".{0,2000}", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "strings: about" in out


def test_example_script_runs():
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "examples" / "birthdays.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert "strings" in lines[0] and len(lines) == 6
    assert all("George Washington was born on" in line for line in lines[1:])


def test_cli_samples(capsys):
    code = main(["--model", "tiny-gpt2", "--matching", "The (man|woman) was trained in (art|science)",
                 "--prefix", "The (man|woman) was trained in", "--sample", "5", "--seed", "3"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and [line.split()[0] for line in out] == ["1", "2", "3", "4", "5"]
