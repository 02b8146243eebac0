"""benchmarks/paper/extraction.py (the paper's §4.3): the mining does what its docstring says,
and the statements of extraction.rql return what they claim, checked against independent
oracles (re.search / re.fullmatch, a Levenshtein DP written here, the model's tokenizer)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

import relmql
from benchmarks.paper import extraction as E

TARGET_WORDS = re.compile(r"warranty|warranties|merchantability|fitness|liable|liability|infringement|damages",
                          re.IGNORECASE)


def distance(a: str, b: str) -> int:
    """Levenshtein distance, by the textbook table (independent of the driver's and relmql's)."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[len(a)][len(b)]


def test_distance_oracle():
    assert distance("kitten", "sitting") == 3
    assert distance("", "abc") == 3
    assert distance("WARRANTY", "WAGRANTY") == 1
    assert distance("flaw", "lawn") == 2


def test_mine_on_a_small_corpus(tmp_path):
    text = ("THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, INCLUDING THE\n"
            " * IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS. Short warranty. Warranty is first.\n\n"
            "IN NO EVENT SHALL THE AUTHORS BE LIABLE FOR ANY CLAIM. Nothing to see here.\n"
            "A caf\u00e9 owner is not liable for this.\n")
    (tmp_path / "a").write_text(text)
    (tmp_path / "b").write_text("IN NO EVENT SHALL THE AUTHORS BE LIABLE FOR ANY CLAIM.\n")  # a duplicate
    got = [(r["prompt"], r["target"], r["word"]) for r in E.mine([tmp_path / "a", tmp_path / "b"])]
    first = 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT'
    implied = first + " WARRANTY OF ANY KIND, INCLUDING THE IMPLIED"
    assert got == [
        (first, first + " WARRANTY", "WARRANTY"),
        (implied, implied + " WARRANTIES", "WARRANTIES"),  # the comment mark ' * ' is dropped
        (implied + " WARRANTIES OF", implied + " WARRANTIES OF MERCHANTABILITY", "MERCHANTABILITY"),
        (implied + " WARRANTIES OF MERCHANTABILITY AND", implied + " WARRANTIES OF MERCHANTABILITY AND FITNESS",
         "FITNESS"),
        # "Short warranty" is too short, "Warranty is first" has no prompt, the café is not ASCII
        ("IN NO EVENT SHALL THE AUTHORS BE", "IN NO EVENT SHALL THE AUTHORS BE LIABLE", "LIABLE"),
    ]


@pytest.mark.skipif(not Path(E.COMMON_LICENSES).is_dir(), reason="no /usr/share/common-licenses here")
def test_mine_on_the_licences():
    inputs = E.mine()
    assert len(inputs) > 50
    assert len({r["target"] for r in inputs}) == len(inputs)
    normalised = {}
    for r in inputs:
        assert 20 <= len(r["target"]) <= 200
        assert TARGET_WORDS.fullmatch(r["word"])
        m = re.search(E.WORDS, r["target"])
        assert m is not None
        assert r["target"].endswith(r["word"]) and r["target"][:-len(r["word"])].rstrip() == r["prompt"]
        src = r["source"]
        if src not in normalised:
            normalised[src] = " ".join(re.sub(r"(?m)^[ \t]*(?:[*#-]+|//)(?=\s|$)", "", Path(src).read_text(
                encoding="utf-8", errors="replace")).split())
        assert r["target"] in normalised[src]
    picked = E.subset(inputs, 5)
    assert [len(r["target"]) for r in picked] == sorted(len(r["target"]) for r in inputs)[:5]
    assert E.subset(inputs, 5) == picked


@pytest.fixture(scope="module")
def con(smol):
    session = relmql.connect(dtype="float32")
    session.models.put("smollm2-135m", "cpu", "float32", smol)
    return session


@pytest.fixture
def one_thread():
    """One torch thread: on a machine whose cores are busy, two threads waiting for each other
    make each model call tens of times slower."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_experiment_against_oracles(con, smol, tmp_path, one_thread):
    # The model's own greedy continuation from the start of text: extractable without a prompt,
    # so every statement has rows to check (licence sentences are not, for this model).
    prompt = "The company's mission is to provide a"
    inp = {"id": "x", "source": "test", "word": "safe", "prompt": prompt, "target": prompt + " safe"}
    recs = E.experiment(con, [inp], cap=5)
    rec = recs[0]
    target = inp["target"]
    tok = smol.tokenizer
    for name in ("prompted-baseline", "prompted-relmql", "unprompted-baseline", "unprompted-relmql"):
        rows = rec[name]["rows"]
        assert rows, name
        for row in rows:
            assert distance(row["text"], target) == row["edits"] <= 1
            if "baseline" in name:
                assert row["edits"] == 0 and row["text"] == target
                assert row["tokens"] == tok.encode(row["text"]) and row["canonical"]
            else:
                assert row["canonical"] == (row["tokens"] == tok.encode(row["text"]))
            if "prompted" in name and not name.startswith("un"):
                assert row["text"].startswith(prompt)
    assert len(rec["prompted-baseline"]["rows"]) == len(rec["prompted-relmql"]["rows"]) == 1
    assert len(rec["unprompted-baseline"]["rows"]) == 1          # one token sequence in the language
    assert len(rec["unprompted-relmql"]["rows"]) == 5            # capped
    texts = [tuple(r["tokens"]) for r in rec["unprompted-relmql"]["rows"]]
    assert len(set(texts)) == len(texts)                         # distinct token sequences
    probs = [r["total_prob"] for r in rec["unprompted-relmql"]["rows"]]
    assert probs == sorted(probs, reverse=True)

    s = E.summary(recs)
    assert s["prompted_relmql"] >= s["prompted_baseline"] == 1
    assert s["unprompted_relmql"] == 5 and s["unprompted_baseline"] == 1
    assert sum(s["quadrants_relmql"].values()) == 5

    args = argparse.Namespace(model="smollm2-135m", dtype="float32", smoke=True, out=str(tmp_path))
    figs = E.figures(args, recs)
    assert [p.name for p in figs] == ["extraction-prompted.png", "extraction-unprompted.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in figs)
    md = E.section(args, recs, mined=1, cap=5, seconds=1.0, figs=figs)
    assert "| sentences extracted | 1/1 (100.0%) | 1/1 (100.0%) | 1.0× |" in md
    assert "| extractions (token sequences) | 1 | 5 | 5.0× | 93× |" in md
    assert "extraction-unprompted.png" in md
