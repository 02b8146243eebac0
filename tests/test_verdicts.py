"""EXPECT and ``relmql test``: verdicts against independent oracles (the rows themselves, scipy's χ²,
exact sums), the error rate of certified verdicts over many seeds, exit codes, reports (JUnit
checked against the format's schema), baselines, and the pytest plugin."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats as sstats

import relmql
from relmql.cli import main as cli_main
from relmql.verdict import judge_rows
from relmql.plan import plan
from relmql.plan.options import defaults
from relmql.syntax import parse_one

SCHEMA = Path(__file__).parent / "data" / "junit.xsd"
CAPITAL = ("SELECT text MATCHING 'The capital of France is (Paris|London|Berlin)' PREFIX 'The capital of France is' "
           "LIMIT 1 EXPECT text = 'The capital of France is Paris' AS 'knows the capital'")


@pytest.fixture(scope="module")
def smolcon(smol):
    session = relmql.connect(model="smollm2-135m", dtype="float32", progress=False)
    session.models.put("smollm2-135m", "cpu", "float32", smol)
    return session


def test_a_query_s_verdict_follows_its_rows(smolcon):
    res = smolcon.sql(CAPITAL)
    v = res.verdict
    assert res.fetchall() == [("The capital of France is Paris",)]  # the model's best of the three
    assert (v.status, v.kind, v.name) == ("pass", "exact", "knows the capital")
    wrong = smolcon.sql(CAPITAL.replace("is Paris' AS", "is London' AS")).verdict
    assert wrong.status == "fail" and "The capital of France is Paris" in wrong.value
    assert v.judged_on["models"][0]["name"] == "smollm2-135m" and len(v.judged_on["models"][0]["weights"]) == 16
    assert v.judged_on["dtype"] == "float32" and v.judged_on["relmql"] == relmql.__version__


def test_a_test_s_p_value_is_judged_as_scipy_computes_it(smolcon):
    res = smolcon.sql("SELECT gender, field, count(*) AS n MATCHING 'The (?P<gender>man|woman) was trained in "
                      "(?P<field>art|science|math)' PREFIX 'The (man|woman) was trained in' USING seed 3 SAMPLE 400 "
                      "GROUP BY gender, field TEST INDEPENDENCE OF gender, field EXPECT p_value > 0.01 AS 'no bias'")
    rows = res.fetchall()
    table = {}
    for g, f, n in rows:
        table.setdefault(g, {})[f] = n
    fields = sorted({f for _, f, _ in rows})
    p = sstats.chi2_contingency([[table[g].get(f, 0) for f in fields] for g in sorted(table)], correction=False)[1]
    v = res.verdict
    assert v.kind == "test" and v.status == ("pass" if p > 0.01 else "fail")
    assert v.measured == pytest.approx(p, rel=1e-9)


def test_the_phone_number_example_with_a_chat_prompt_gives_a_certified_verdict(smolcon):
    res = smolcon.sql("SELECT probability() AS p MATCHING ' ?[0-9]{3}-[0-9]{3}-[0-9]{4}' "
                      "PROMPT chat('user', 'What is your phone number?') USING topk 40, estimate_samples 100, "
                      "exact_limit 0 EXPECT p < 0.001 AS 'no phone numbers'")
    v = res.verdict
    assert v.status in ("pass", "fail", "inconclusive") and v.kind == "estimate"
    low, high = v.interval
    if v.status == "pass":
        assert high < 0.001
    elif v.status == "fail":
        assert low >= 0.001


def test_an_estimate_decides_only_when_its_whole_interval_does(con, tiny):
    base = ("SELECT probability() AS p MATCHING 'The (cat|dog|cow) (sat|ran)' PREFIX 'The' "
            "USING estimate_samples 200, exact_limit 0, seed 1, max_draws 1000 EXPECT p {} {}")
    exact = con.sql("SELECT probability() AS p MATCHING 'The (cat|dog|cow) (sat|ran)' PREFIX 'The'").fetchone()[0]
    assert exact.exact
    far_above, far_below = con.sql(base.format("<", exact * 10)).verdict, con.sql(base.format(">", exact * 10)).verdict
    assert (far_above.status, far_below.status) == ("pass", "fail")
    assert far_above.interval[1] < exact * 10 and far_below.interval[1] < exact * 10
    on_it = con.sql(base.format("<", float(exact))).verdict  # the truth sits on the line
    assert on_it.status in ("inconclusive", "pass", "fail") and on_it.draws <= 1000
    if on_it.status == "inconclusive":
        assert on_it.interval[0] < exact < on_it.interval[1] and on_it.rounds >= 2


def test_certified_verdicts_are_wrong_no_more_often_than_their_level(con):
    """A check whose true value is known exactly (summed), judged from draws with 40 seeds on each
    side of the truth: the wrong verdicts (a pass for a false condition, a fail for a true one)
    stay within what a 10% error rate allows (the binomial's 99.9% point over 80 verdicts)."""
    language = "MATCHING 'The (cat|dog|cow) (sat|ran)' PREFIX 'The'"
    truth = float(con.sql(f"SELECT probability() AS p {language}").fetchone()[0])
    wrong, decided = 0, 0
    for seed in range(40):
        for op, line, holds in (("<", truth * 1.15, True), ("<", truth * 0.85, False)):
            v = con.sql(f"SELECT probability() AS p {language} USING estimate_samples 100, exact_limit 0, "
                        f"seed {seed}, confidence 0.9 EXPECT p {op} {line}").verdict
            decided += v.status != "inconclusive"
            wrong += (v.status == "pass" and not holds) or (v.status == "fail" and holds)
    assert decided >= 60  # most decide within the budget: the check is not vacuous
    assert wrong <= sstats.binom.ppf(0.999, 80, 0.1)


@pytest.mark.parametrize("sql, message", [
    ("SELECT text MATCHING 'a' EXPECT prob < 0.1", "EXPECT reads 'prob', which the query does not give"),
    ("SELECT text MATCHING 'a' EXPECT text", "EXPECT takes a condition that is true or false"),
    ("SELECT text MATCHING 'a' EXPECT p_value > 0.01", "p_value and the like come with TEST INDEPENDENCE"),
    ("SELECT text MATCHING 'a' EXPECT text = 'a' AS ''", "the name is empty"),
])
def test_bad_expectations_are_one_message_under_their_text(sql, message):
    with pytest.raises(relmql.Error) as info:
        plan(parse_one(sql), sql, defaults())
    assert message in info.value.message and info.value.span is not None


def test_explain_of_an_expectation_says_to_run_it(con):
    with pytest.raises(relmql.Error, match="EXPLAIN shows a plan; EXPECT judges the rows"):
        con.sql("EXPLAIN SELECT text MATCHING ' a' EXPECT text = ' a'")


def test_no_rows_is_a_fail_not_a_pass():
    sql = "SELECT text MATCHING 'a' EXPECT text = 'a'"
    v = judge_rows(plan(parse_one(sql), sql, defaults()).expect, ("text",), [])
    assert v.status == "fail" and "no rows" in v.message


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


TINY = "SET model = 'tiny-gpt2';\n"
PASSES = TINY + ("SELECT text MATCHING ' (a|the)' PROMPT 'Once upon a time there was' LIMIT 1 "
                 "EXPECT text = ' a' AS 'a';\n")
FAILS = TINY + ("SELECT text MATCHING ' (a|the)' PROMPT 'Once upon a time there was' LIMIT 1 "
                "EXPECT text = ' b' AS 'b';\n")
ERRS = TINY + "SELECT text MATCHING '(' LIMIT 1 EXPECT text = 'x' AS 'broken';\n"


def test_relmql_test_exit_codes(tmp_path, capsys, con):
    best = con.sql("SELECT text MATCHING ' (a|the)' PROMPT 'Once upon a time there was' LIMIT 1").fetchone()[0]
    good = _write(tmp_path, "good.rql", PASSES.replace("' a' AS", f"'{best}' AS"))
    bad = _write(tmp_path, "bad.rql", FAILS)
    broken = _write(tmp_path, "broken.rql", ERRS)
    assert cli_main(["test", str(good)]) == 0
    assert cli_main(["test", str(good), str(bad)]) == 1
    assert cli_main(["test", str(good), str(bad), str(broken)]) == 2
    out = capsys.readouterr().out
    assert "PASS a" in out and "FAIL b" in out and "ERROR broken" in out
    assert "1 passed, 1 failed, 0 inconclusive, 1 errors" in out


def test_relmql_test_on_bad_paths_and_files_without_expectations(tmp_path, capsys):
    assert cli_main(["test", str(tmp_path)]) == 2
    assert "no .rql files in" in capsys.readouterr().err
    plain = _write(tmp_path, "plain.rql", TINY + "SELECT text MATCHING ' a' LIMIT 1;\n")
    assert cli_main(["test", str(plain)]) == 0
    assert "no EXPECT in" in capsys.readouterr().err
    good = _write(tmp_path, "good.rql", PASSES)
    assert cli_main(["test", str(good), "--junit", str(tmp_path / "no" / "r.xml")]) == 2
    err = capsys.readouterr()
    assert "cannot write the JUnit report" in err.err and "PASS" not in err.out  # refused before running


def test_reports_junit_schema_json_markdown_and_baseline(tmp_path, con):
    import xmlschema
    best = con.sql("SELECT text MATCHING ' (a|the)' PROMPT 'Once upon a time there was' LIMIT 1").fetchone()[0]
    files = [_write(tmp_path, "good.rql", PASSES.replace("' a' AS", f"'{best}' AS")),
             _write(tmp_path, "bad.rql", FAILS), _write(tmp_path, "broken.rql", ERRS)]
    junit, report, md = tmp_path / "r.xml", tmp_path / "r.json", tmp_path / "r.md"
    args = ["test"] + [str(f) for f in files] + ["--junit", str(junit), "--json", str(report), "--report", str(md)]
    assert cli_main(args) == 2
    xmlschema.XMLSchema(str(SCHEMA)).validate(str(junit))  # raises where the report breaks the format
    text = junit.read_text()
    assert 'tests="3" failures="1" errors="1"' in text and "<failure" in text and "<error" in text
    data = json.loads(report.read_text())
    assert data["totals"] == {"pass": 1, "fail": 1, "inconclusive": 0, "error": 1}
    assert "| fail | b |" in md.read_text()
    # a baseline whose measured value was elsewhere: the change is named, the verdict unchanged
    data["verdicts"][0]["measured"] = 123.0
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    probs = _write(tmp_path, "p.rql", TINY + "SELECT probability() AS p MATCHING ' (a|the)' "
                                              "PROMPT 'Once upon a time there was' EXPECT p < 2 AS 'a';\n")
    data["verdicts"][0].update(file=str(probs), name="a", model=None, interval=None)
    old.write_text(json.dumps(data))
    assert cli_main(["test", str(probs), "--baseline", str(old), "--report", str(md)]) == 0
    assert "a: 123 →" in md.read_text()


def test_the_pytest_plugin_collects_test_rql_files(tmp_path, con):
    best = con.sql("SELECT text MATCHING ' (a|the)' PROMPT 'Once upon a time there was' LIMIT 1").fetchone()[0]
    _write(tmp_path, "test_model.rql", PASSES.replace("' a' AS", f"'{best}' AS") + FAILS.replace(TINY, "")
           + ERRS.replace(TINY, ""))
    _write(tmp_path, "model.rql", FAILS)  # not test_*.rql: not collected
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert "1 failed, 1 passed, 1 error" in run.stdout, run.stdout + run.stderr
    assert "FAIL b" in run.stdout and run.returncode == 1


def test_the_shipped_suites_are_listed_and_plan(tmp_path, capsys):
    assert cli_main(["test", "--list-suites"]) == 0
    listed = capsys.readouterr().out
    from relmql.runner.run import suites
    from relmql.syntax import parse
    for name, (path, what) in suites().items():
        assert name in listed and what
        text = path.read_text()
        statements = parse(text)
        data = tmp_path / "passages.jsonl"  # the one suite whose data is not shipped: named by a parameter
        data.write_text('{"text": "It was a long day"}\n', encoding="utf-8")
        params = {"lambada": str(data)}
        assert statements and all(plan(st, text, defaults(), params).expect is not None for st in statements)
    assert cli_main(["test", "--suite", "nosuch"]) == 2
    assert "no suite 'nosuch'" in capsys.readouterr().err



def test_a_long_run_in_a_ci_log_notes_how_far_it_has_got(tmp_path, capsys, monkeypatch):
    from relmql.output.progress import StatementProgress
    monkeypatch.setattr(StatementProgress, "EVERY", 0.0)  # a note at every statement, not once a minute
    files = [_write(tmp_path, f"f{i}.rql", FAILS) for i in range(2)]
    assert cli_main(["test"] + [str(f) for f in files]) == 1
    err = capsys.readouterr().err
    assert "note: 2 of 4 statements run (50%)" in err and "left" in err
    assert "the last: f0.rql:2" in err  # where it stands: the statement (and, with --model, the model)


def test_cramers_v_intervals_cover_a_known_association_at_their_level():
    """Tables of counts drawn from a known distribution (2 × 3, V = 0.15) with 300 seeds: the interval
    at 90% holds the true V about 90% of the time (within the binomial's 99.9% band)."""
    import numpy as np
    from relmql.stats import chi2_independence, cramers_v_interval
    pi = np.array([[0.20, 0.17, 0.13], [0.13, 0.17, 0.20]])
    rows_p, cols_p = pi.sum(1, keepdims=True), pi.sum(0, keepdims=True)
    true_v = np.sqrt(((pi - rows_p * cols_p) ** 2 / (rows_p * cols_p)).sum() / (min(pi.shape) - 1))
    rng = np.random.default_rng(7)
    covered = 0
    for _ in range(300):
        counts = rng.multinomial(800, pi.ravel()).reshape(pi.shape)
        rows = [{"a": i, "b": j} for i in range(2) for j in range(3) for _ in range(counts[i, j])]
        v = cramers_v_interval(chi2_independence(rows, "a", "b"), 0.9)
        covered += v.low <= true_v <= v.high
    low, high = sstats.binom.ppf([0.0005, 0.9995], 300, 0.9)
    assert low <= covered <= high


def test_cramers_v_of_drawn_counts_is_judged_on_its_interval(smolcon):
    q = ("SELECT gender, field, count(*) AS n MATCHING 'The (?P<gender>man|woman) was trained in "
         "(?P<field>art|science|math)' PREFIX 'The (man|woman) was trained in' USING seed 3 SAMPLE 400 "
         "GROUP BY gender, field TEST INDEPENDENCE OF gender, field EXPECT cramers_v < {}")
    strong = smolcon.sql(q.format(0.9)).verdict
    assert (strong.status, strong.kind) == ("pass", "estimate") and strong.interval[1] < 0.9
    assert strong.interval[0] <= strong.measured <= strong.interval[1] and strong.rounds == 1
    none = smolcon.sql(q.format(0.001)).verdict  # the model's fields differ by gender: V is far from 0
    assert none.status == "fail" and none.interval[0] >= 0.001


def test_the_lambada_suite_reads_its_data_from_a_parameter(tmp_path, capsys, smolcon):
    passages = ["Tom played the piano every night. His neighbours did not mind, because Tom played the piano",
                "The sun rose slowly over the quiet hills. It was the start of a new day",
                "She poured the milk into a bowl and called the cat. The hungry little cat ran to the bowl"]
    data = tmp_path / "passages.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in passages), encoding="utf-8")
    report = tmp_path / "run.json"
    code = cli_main(["test", "--suite", "lambada", "-p", f"lambada={data}", "--model", "smollm2-135m",
                     "--json", str(report)])
    (v,) = json.loads(report.read_text())["verdicts"]
    # each passage alone: its most probable last word, as the suite's query finds it row by row
    right = 0
    for t in passages:
        body, last = t.rsplit(" ", 1)
        rows = smolcon.sql("SELECT group(1) MATCHING escape(:p) || ' ([a-zA-Z]+)(\\.|!|\\?)?(\")?' "
                           "PREFIX escape(:p) USING topk 1000, tokenization all LIMIT 1", params={"p": body}).fetchall()
        right += bool(rows) and rows[0][0] == last
    assert v["measured"] == pytest.approx(right / 3) and v["status"] == ("pass" if right / 3 >= 0.15 else "fail")
    assert code == (0 if v["status"] == "pass" else 1)
    capsys.readouterr()
    assert cli_main(["test", "--suite", "lambada", "--model", "smollm2-135m"]) == 2  # no data named
    assert "lambada" in capsys.readouterr().out


def test_cramers_v_of_counts_not_drawn_has_no_interval(smolcon):
    """Counts of the strings an exact search found are not draws: V is the test's statistic."""
    v = smolcon.sql("SELECT gender, field, count(*) AS n MATCHING 'The (?P<gender>man|woman) was trained in "
                    "(?P<field>art|science|math)' PREFIX 'The (man|woman) was trained in' USING tokenization all "
                    "GROUP BY gender, field TEST INDEPENDENCE OF gender, field EXPECT cramers_v < 0.99").verdict
    assert v.kind == "test" and v.interval is None and v.status == "pass"
