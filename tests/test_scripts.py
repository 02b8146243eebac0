"""Scripts of many statements: their text read as UTF-8 with an error at the line of a byte that is
not, progress over the statements when the results go elsewhere, and a statement of a few strings
that costs one small model call."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import pytest
import torch

from relmql.cli import main
from relmql.output.progress import StatementProgress

from conftest import fresh
from oracle import step_logprobs, tolerance

TINY = ["--model", "tiny-gpt2", "--dtype", "float32", "--no-progress"]
BAD = b"SELECT text\nMATCHING 'The (cat|d\xffog)' PREFIX 'The';\n"


def run(capsys, *args):
    code = main([*TINY, *args])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


def _says_where(err: str, origin: str):
    lines = err.splitlines()
    assert lines[0] == (f"{origin}:2: " if origin else "") + \
        "error: byte 0xFF (byte 21 of line 2) is not UTF-8: statements are read as UTF-8 text", err
    assert lines[1] == "LINE 2: MATCHING 'The (cat|d\ufffdog)' PREFIX 'The';"
    assert lines[2].index("^") == lines[1].index("\ufffd")  # the caret under the byte


def test_a_file_with_a_byte_that_is_not_utf8_names_its_line_and_byte(capsys, tmp_path):
    script = tmp_path / "bad.rql"
    script.write_bytes(b"\xef\xbb\xbf" + BAD)  # after a byte order mark, as an editor saves it
    code, out, err = run(capsys, str(script))
    assert code == 1 and out == ""
    _says_where(err, str(script))
    assert err.splitlines()[-1] == "hint: save the file as UTF-8"


def test_standard_input_with_a_byte_that_is_not_utf8(tmp_path):
    """Standard input was decoded by Python, which keeps a bad byte as a lone surrogate ("U+DCFF
    is a surrogate code point"): it is read as bytes, as a file is."""
    for args in (["-"], []):
        proc = subprocess.run([sys.executable, "-m", "relmql.cli", *TINY, *args], input=BAD, capture_output=True,
                              timeout=300)
        err = proc.stderr.decode("utf-8")
        assert proc.returncode == 1 and proc.stdout == b"" and "Traceback" not in err, err
        _says_where(err, "<stdin>")


def test_a_command_line_statement_with_a_byte_that_is_not_utf8(capsys):
    code, out, err = run(capsys, "-c", BAD.decode("utf-8", "surrogateescape"))
    assert code == 1
    _says_where(err, "")
    assert err.splitlines()[-1] == "hint: write the statement as UTF-8 text"


def test_a_read_of_a_file_that_is_not_utf8_stops_the_script(capsys, tmp_path):
    bad = tmp_path / "bad.rql"
    bad.write_bytes(BAD)
    script = tmp_path / "main.rql"
    script.write_text(f".read {bad}\nSELECT text MATCHING 'a';\n", encoding="utf-8")
    code, out, err = run(capsys, str(script))
    assert code == 1 and out == ""  # the statement after the .read did not run
    _says_where(err, str(bad))


QUERIES = "".join(f"SELECT text, prob MATCHING 'The ({a}|{b}) sat' PREFIX 'The ({a}|{b})' LIMIT 1;\n"
                  for a, b in (("cat", "dog"), ("cow", "pig"), ("owl", "hen"), ("fox", "elk")))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_over_a_scripts_statements_as_notes_where_nothing_is_a_terminal(capsys, tmp_path, monkeypatch):
    """stdout to a file and stderr to a log: a note line every EVERY seconds (here every
    statement), with the statements run and an estimate of the time left."""
    monkeypatch.setattr(StatementProgress, "EVERY", 0.0)
    script = tmp_path / "many.rql"
    script.write_text(QUERIES, encoding="utf-8")
    code = main([*TINY[:-1], "--format", "jsonl", str(script)])  # progress on, as a user runs it
    out = capsys.readouterr()
    assert code == 0 and len(out.out.splitlines()) == 4
    notes = out.err.splitlines()
    assert [n.split(" statements")[0] for n in notes] == ["note: 2 of 4", "note: 3 of 4"], notes
    assert all(n.endswith(" left") and "(50%)" in notes[0] for n in notes)
    code = main([*TINY, "--format", "jsonl", str(script)])
    assert code == 0 and capsys.readouterr().err == ""  # --no-progress


def test_progress_over_a_scripts_statements_as_a_bar_on_a_terminal():
    err = _Terminal()
    p = StatementProgress(err, out_is_terminal=False)
    p.DELAY = 0.0
    p.add(3)
    for _ in range(3):
        p.step()
    p.bar.refresh()  # (tqdm redraws at most every 0.1 s)
    assert "statements: 100%" in err.getvalue() and "3/3" in err.getvalue()
    p.close()
    assert StatementProgress(_Terminal(), out_is_terminal=True).mode is None  # the rows show it
    assert StatementProgress(io.StringIO(), out_is_terminal=False).mode == "notes"
    assert StatementProgress(_Terminal(), out_is_terminal=False, enabled=False).mode is None


def test_a_prefix_of_a_few_strings_is_read_in_one_model_call(con, tiny, monkeypatch):
    """Under ORDER BY prob every prefix's distribution comes before the first row: a small prefix
    tree is read in one call (level by level it took one per token of the longest prefix), with
    the rows of the level-by-level search and the probabilities of a plain forward pass."""
    from relmql.execute import shortest
    query = ("SELECT text, tokens, prob, total_prob MATCHING 'The (cat|dog|bird) (sat|ran)' "
             "PREFIX 'The (cat|dog|bird)'")
    calls = tiny.stats.calls
    rows = fresh(con).sql(query).fetchall()
    assert tiny.stats.calls - calls == 1 and len(rows) == 6
    for text, tokens, prob, total in rows:
        lp = step_logprobs(tiny, tokens)
        picked = [lp[i, t] for i, t in enumerate(tokens)]
        pre = len(tiny.vocabulary.encode(text.rsplit(" ", 1)[0]))
        assert abs(math.log(prob) - sum(picked[pre:])) <= tolerance(tiny, len(tokens) - pre, from_start=False)
        assert abs(math.log(total) - sum(picked)) <= tolerance(tiny, len(tokens))
    monkeypatch.setattr(shortest, "prefix_chains", lambda *a, **k: None)
    calls = tiny.stats.calls
    level = fresh(con).sql(query).fetchall()
    assert tiny.stats.calls - calls >= 2
    assert [r[:2] for r in rows] == [r[:2] for r in level]


@pytest.mark.parametrize("new, threads", [(1, 1), (8, 1), (9, 2)])
def test_a_small_model_call_runs_on_one_thread(tiny, new, threads):
    """A pass of at most eight new tokens is bound by reading the weights, and beside other work two
    threads wait on each other: it runs on one; a larger one on the session's threads."""
    seen = []
    handle = tiny.model.register_forward_hook(lambda *a: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        tiny.extend([None], [[464] * (new - 1)])  # the start token and new - 1 more
    finally:
        handle.remove()
        torch.set_num_threads(before)
    assert seen == [threads]
