"""`relmql test --report FILE.html`, opened in a real headless Chromium (Debian's package): what the
browser parsed (--dump-dom) and what it drew (a screenshot's pixels)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from relmql.runner.run import main

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    BROWSER is None and not os.environ.get("RELMQL_BROWSER_TESTS"),
    reason="needs Chromium (Debian: apt-get install chromium); .ci/run installs it and requires this test")

SUITE = """\
SELECT month, probability() AS p
MATCHING 'George Washington was born on (?P<month>January|February|March|July)'
PREFIX 'George Washington was born on' GROUP BY month
EXPECT p < 0.9 AS 'no month takes it all';
SELECT text MATCHING 'The capital of France is (Paris|London|Berlin)' PREFIX 'The capital of France is' LIMIT 1
EXPECT text = 'The capital of France is Rome' AS 'a wrong answer <b>escaped</b>';
"""
GREEN, RED, BLUE = (0x1a, 0x7f, 0x37), (0xcf, 0x22, 0x2e), (0x1f, 0x77, 0xb4)  # pass, fail, matplotlib's bars


def _browser(*args: str) -> subprocess.CompletedProcess:
    assert BROWSER is not None, "RELMQL_BROWSER_TESTS is set, and no chromium is installed"
    return subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def page(tmp_path_factory, smol):
    folder = tmp_path_factory.mktemp("html")
    (folder / "test_page.rql").write_text(SUITE, encoding="utf-8")
    out = folder / "report.html"
    code = main([str(folder / "test_page.rql"), "--model", "smollm2-135m", "--report", str(out),
                 "--report", str(folder / "report.md")])
    assert code == 1 and (folder / "report.md").is_file()  # one fail; both reports written
    return out


def test_the_page_is_self_contained(page):
    html = page.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)=["'](?!#)""", html)  # nothing loaded from beside it or afar
    assert "<script" not in html and "&lt;b&gt;escaped&lt;/b&gt;" in html


def test_chromium_parses_the_verdicts_table_and_the_plot(page):
    dom = _browser("--dump-dom", page.as_uri()).stdout
    table = re.search(r'<table id="verdicts">(.*?)</table>', dom, re.S).group(1)
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
    assert len(rows) == 3  # the header and one row per expectation
    assert 'class="status pass">pass' in rows[1] and "no month takes it all" in rows[1]
    assert 'class="status fail">fail' in rows[2] and "The capital of France is Paris" in rows[2]
    assert "1 passed, 1 failed, 0 inconclusive, 0 errors" in dom
    figure = re.search(r'<figure class="plot">(.*?)</figure>', dom, re.S).group(1)
    assert "<svg" in figure and all(m in figure for m in ("January", "February", "March", "July"))


def test_chromium_draws_the_badges_and_the_bars(page, tmp_path):
    shot = tmp_path / "page.png"
    _browser("--window-size=1200,1400", f"--screenshot={shot}", page.as_uri())
    import matplotlib.image
    pixels = (matplotlib.image.imread(str(shot))[..., :3] * 255).round().astype(int)

    def count(colour) -> int:
        return int((np.abs(pixels - np.array(colour)).sum(axis=2) <= 6).sum())
    assert count(GREEN) > 200 and count(RED) > 200  # the pass and fail badges
    assert count(BLUE) > 20_000  # four bars of the grouped result
