"""Smoke runs of the paper's experiments (benchmarks/paper/): a few examples each, checked
against independent oracles (the data file read here, re.fullmatch, scipy, the domain list)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from benchmarks.paper import bias, common, lambada, memorization

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"

pytestmark = pytest.mark.skipif(not (DATA / "lambada_test.jsonl").exists(), reason="../shared/data is missing")


def _args(tmp_path, model="smollm2-135m", **extra):
    return argparse.Namespace(model=model, dtype="float32", smoke=True, out=str(tmp_path), threads=None, **extra)


def test_statements_are_named_and_complete():
    names = [n for n, _ in common.statements(common.HERE / "lambada.rql")]
    assert names == ["baseline", "words", "terminated", "no stop", "terminated (newline)", "no stop (newline)"]
    bias_names = [n for n, _ in common.statements(common.HERE / "bias.rql")]
    assert sum(n.startswith("sampled") for n in bias_names) == 12
    assert sum(n.startswith("exact") for n in bias_names) == 5
    (name, text), = common.statements(common.HERE / "memorization.rql")
    assert name == "urls" and "topk 40" in text


def test_lambada_smoke(tmp_path):
    section = lambada.run(_args(tmp_path, rows=500, slow_rows=100, eos_rows=20))
    saved = json.loads((tmp_path / "lambada.json").read_text())
    lines = [json.loads(line)["text"] for line in (DATA / "lambada_test.jsonl").read_text().splitlines()[:3]]
    stop = set((DATA / "nltk_stopwords_english.txt").read_text().split())
    for name, res in saved["results"].items():
        rows = res["rows"]
        assert [r["row"] for r in rows] == [1, 2]
        for r, text in zip(rows, lines):
            context, last = text.rsplit(" ", 1)
            assert r["answer"] == last
            if r["prediction"] is None:  # a search stopped at max_nodes
                continue
            assert re.fullmatch(r"[a-zA-Z]+", r["prediction"])
            if name == "words":
                assert r["prediction"] in re.findall(r"\w+", context)
            if name.startswith("no stop"):
                assert r["prediction"].lower() not in stop
        hits = sum(r["answer"] == r["prediction"] for r in rows)
        assert f"| {name} | 2 | {100 * hits / 2:.1f} |" in section
    assert set(saved["ranks"]) == {"end of text", "line break"}
    assert all(len(v) == 3 and min(v) >= 0 for v in saved["ranks"].values())
    assert (tmp_path / "lambada.png").stat().st_size > 10_000


def test_bias_smoke(tmp_path):
    from scipy.stats import chi2_contingency
    section = bias.run(_args(tmp_path, model="tiny-gpt2"))
    out = json.loads((tmp_path / "bias.json").read_text())
    fields = {"art", "science", "business", "medicine", "computer science", "engineering", "humanities",
              "social sciences", "information systems", "math"}
    for name, rows in out.items():
        assert {r["gender"] for r in rows} <= {"man", "woman"} and {r["field"] for r in rows} <= fields
        if name.startswith("sampled"):
            expected = 80 if name in ("sampled | canonical | no prefix",
                                      "sampled | canonical, edits | no prefix") else 40
            assert sum(r["n"] for r in rows) == expected
            if "| prefix |" in name:
                assert {r["gender"] for r in rows} == {name.rsplit(" | ", 1)[1]}
        else:
            assert all(r["p_low"] <= r["p"] <= r["p_high"] for r in rows)
    # the sampled p-value of the first configuration, recomputed with scipy from the counts
    rows = out["sampled | canonical | no prefix"]
    genders, cols = sorted({r["gender"] for r in rows}), sorted({r["field"] for r in rows})
    table = [[sum(r["n"] for r in rows if r["gender"] == g and r["field"] == f) for f in cols] for g in genders]
    if len(genders) == 2 and len(cols) > 1:
        p = chi2_contingency(table, correction=False)[1]
        from relmql.stats import format_p
        line, = [x for x in section.splitlines() if x.startswith("| canonical | no prefix |")]
        assert f"| {format_p(p)} |" in line
    assert (tmp_path / "bias.png").stat().st_size > 10_000


def test_memorization_smoke(tmp_path):
    section = memorization.run(_args(tmp_path, seconds=4.0))
    saved = json.loads((tmp_path / "memorization.json").read_text())
    domains = set((DATA / "opendns-top-domains.txt").read_text().split())
    urls = [u for _, u in saved["attempts"]["relmql"]]
    assert urls and len(set(urls)) == len(urls)  # every row a new string
    assert all(re.fullmatch(r"https://www\.([a-zA-Z0-9]|_|-|#|%)+\.([a-zA-Z0-9]|_|-|#|%|/)+", u) for u in urls)
    for name, res in saved["results"].items():
        for url in res["examples"]:  # validated: its host ends with one of the listed domains
            host = url[len("https://www."):].split("/")[0]
            assert any(host == d or host.endswith("." + d) for d in domains), url
        assert res["unique"] <= res["valid"] <= res["attempts"]
    assert set(saved["results"]) == {"relmql", "generate n=1", "generate n=4"}
    assert "as fast as the best baseline" in section


def test_results_page_holds_every_section():
    """docs/paper-results.md is the template filled with the sections the drivers wrote."""
    from benchmarks.paper import run
    page = (ROOT / "docs" / "paper-results.md").read_text(encoding="utf-8")
    assert "{{" not in page
    for name in run.EXPERIMENTS:
        section = (ROOT / "docs" / "paper" / f"{name}.md").read_text(encoding="utf-8").strip("\n")
        assert section in page, name
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", section):
            assert (ROOT / "docs" / image).is_file(), image
