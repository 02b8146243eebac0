"""The reference search and the command line, on real models, against direct scoring."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from relmql.automata import CompileOptions, compile
from relmql.cli import main
from relmql.execute import search

from conftest import enumerate_paths


def conditional_logprob(model, tokens, n_prefix, topk=None):
    """log P(completion tokens | prefix tokens) scored directly with transformers."""
    ids = torch.tensor([[model.bos_id] + list(tokens)])
    with torch.no_grad():
        lp = torch.log_softmax(model.model(ids).logits[0, :-1].float(), -1)
    total = 0.0
    for i in range(n_prefix, len(tokens)):
        row = lp[i]
        if topk is not None:
            vals, idx = torch.topk(row, topk)
            if tokens[i] not in idx.tolist():
                return -math.inf
            row = row - torch.logsumexp(vals, 0)
        total += float(row[tokens[i]])
    return total


@pytest.mark.parametrize("topk", [None, 50])
@pytest.mark.parametrize("tokenization", ["canonical", "all"])
def test_search_order_equals_brute_force(tiny, topk, tokenization):
    prefix = "A (cat|dog)" if tokenization == "all" else "The (man|woman) was trained in"
    pattern = prefix + " (art|sat|math|law)"
    opts = CompileOptions(tokenization=tokenization, prefix_tokenization=tokenization)
    ta = compile(pattern, tiny.vocabulary, prefix, opts)
    brute = sorted(((conditional_logprob(tiny, t, n, topk), t) for t, n in enumerate_paths(ta)), reverse=True)
    brute = [(lp, t) for lp, t in brute if lp > -math.inf]
    got = list(search(ta, tiny, limit=None, topk=topk))
    assert len(got) == len(brute)
    assert all(a.logprob >= b.logprob - 1e-9 for a, b in zip(got, got[1:]))
    for m, (lp, toks) in zip(got, brute):
        assert abs(m.logprob - lp) < 1e-4
    assert {m.tokens for m in got} == {t for _, t in brute}


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
