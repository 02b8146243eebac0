"""Every query is bounded: a search ends at max_nodes_per_row or max_memory with the rows it found
exact and in order, a warning that names the bound, and the bound on ``Result.stops``. The
memory cases run the real command in a subprocess under a resource limit and compare its peak
resident memory with a plain query's."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys

import pytest

import relmql
from relmql.automata import compile
from relmql.execute import SearchStats, ShortestPath, Stop, execute
from relmql.memory import DEFAULT_MAX_MEMORY

from conftest import fresh

URLS = r"SELECT rank, text, prob MATCHING 'https://www\.([a-zA-Z0-9]|_|-|#|%)+\.([a-zA-Z0-9]|_|-|#|%|/)+' " \
       r"PREFIX 'https://www\.' USING topk 40"

# runs relmql.cli under a limit on its address space, and reports its peak memory on stderr
LIMITED = """
import resource, sys
limit = int(sys.argv[1])
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from relmql.cli import main
try:
    code = main(sys.argv[2:])
finally:
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    print("peak-rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
          int(status["VmPeak"].split()[0]) * 1024, file=sys.stderr)
sys.exit(code)
"""


def run_limited(statement: str, limit: int = 0, model: str = "tiny-gpt2", timeout: float = 300):
    """(exit status, rows, stderr without the peak line, peak RSS, peak virtual size) of
    ``relmql -c statement`` (or of ``relmql statement``, the path of a script)."""
    where = [statement] if statement.endswith(".rql") else ["-c", statement]
    out = subprocess.run([sys.executable, "-c", LIMITED, str(limit), "--model", model, "--no-progress",
                          "--format", "jsonl", *where], capture_output=True, text=True, timeout=timeout)
    lines = out.stderr.splitlines()
    peak = [line for line in lines if line.startswith("peak-rss ")]
    assert peak, out.stderr
    _, rss, vm = peak[-1].split()
    err = "\n".join(line for line in lines if not line.startswith("peak-rss "))
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return out.returncode, rows, err, int(rss), int(vm)


@pytest.fixture(scope="module")
def baseline():
    """Peak RSS and virtual size of a small query on tiny-gpt2: the model, torch and relmql."""
    code, rows, err, rss, vm = run_limited("SELECT text MATCHING 'The (cat|dog)' PREFIX 'The';")
    assert code == 0 and len(rows) == 2, err
    return rss, vm


def test_a_flat_model_and_a_large_language_stop_within_the_memory_budget(baseline):
    # the case: a URL top-300 search on tiny-gpt2, whose distribution is nearly flat, held
    # 13.5 GB after 10 minutes; it now stops at the default max_nodes_per_row
    rss0, vm0 = baseline
    code, rows, err, rss, vm = run_limited(URLS + " LIMIT 300;", limit=vm0 + DEFAULT_MAX_MEMORY + 2 ** 30)
    assert code == 0, err
    assert "Traceback" not in err and err.count("warning:") == 1, err
    assert "without finding another row (max_nodes_per_row)" in err and "raise max_nodes_per_row" in err
    assert len(rows) < 300 and [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    assert rss - rss0 < DEFAULT_MAX_MEMORY, (rss, rss0)


def test_an_unescaped_pattern_without_a_prefix_ends_with_a_message(baseline):
    # '(' and '.' are regex syntax here; from the start of text the model never reaches the
    # language's strings: the search gives up at max_nodes_per_row instead of running on
    rss0, vm0 = baseline
    code, rows, err, rss, vm = run_limited("""SELECT text MATCHING '__import__("os").system("echo PWNED")' LIMIT 1;""",
                                           limit=vm0 + DEFAULT_MAX_MEMORY + 2 ** 30)
    assert code == 0 and "Traceback" not in err, err
    assert rows == [] and ("stopped after expanding 10,000 nodes without finding another row (max_nodes_per_row) "
                           "with 0 rows; more may exist") in err, err
    assert rss - rss0 < DEFAULT_MAX_MEMORY, (rss, rss0)


def test_the_unescaped_pattern_on_the_default_model_ends_with_a_message():
    """The same query on SmolLM2, the default model: it ends at max_nodes_per_row (about 36 s
    alone on two cores; no answer in 300 s beside other work before a small call ran on one
    thread), within max_memory of the plain query's memory."""
    code, rows, err, rss0, vm0 = run_limited("SELECT text MATCHING 'The (cat|dog)' PREFIX 'The';", model="smollm2-135m")
    assert code == 0 and len(rows) == 2, err
    code, rows, err, rss, vm = run_limited("""SELECT text MATCHING '__import__("os").system("echo PWNED")' LIMIT 1;""",
                                           limit=vm0 + DEFAULT_MAX_MEMORY + 2 ** 30, model="smollm2-135m")
    assert code == 0 and "Traceback" not in err, err
    assert rows == [] and "stopped after expanding 10,000 nodes without finding another row (max_nodes_per_row)" \
        in err, err
    assert rss - rss0 < DEFAULT_MAX_MEMORY, (rss, rss0)


# patterns of a random fuzz whose compile ran out of memory after 22 s, or built 57,048 states in
# 109 s before its expansion to bytes did: each atom state's \w became 310 byte states
COSTLY = [r"(?s)(?:(?:\w??(a)?(?(1)b|[^ab\n])(?:.{,2}+){3})+){1,3}",
          r"(?ms)(?:(?:(?:(?>\w))??((?P<g2>[]a]))?(?(1)[^\W\d]|[^ab\n])(?:.{,2}+){3})+){1,3}"]


@pytest.mark.parametrize("pattern", COSTLY)
def test_a_costly_backtracking_pattern_is_refused_within_the_budget(baseline, pattern):
    rss0, vm0 = baseline
    code, rows, err, rss, vm = run_limited(f"EXPLAIN SELECT text MATCHING '{pattern}' LIMIT 1;", limit=vm0 + 2 ** 30)
    assert code == 1 and "Traceback" not in err, err
    lines = err.splitlines()
    assert lines[0] in ("compile error: the automaton has more than 100,000 states",
                        "compile error: the automaton is too costly to build within the limit of 100,000 states "
                        "(the work allowed grows with the limit)"), err
    start = lines[1].index("'") + 1
    carets = lines[2][start:]
    assert lines[2].index("^") == start and carets == "^" * len(carets) and len(carets) >= min(len(pattern), 60)
    assert "raise the limit (max_states)" in lines[3]
    assert rss - rss0 < 256 * 2 ** 20, (rss, rss0)


def test_a_pattern_over_the_limit_is_refused_before_the_model_loads():
    """The byte automaton needs no vocabulary: its errors come before a model loads (seconds, and
    half a minute the first time), as the regex's syntax errors do."""
    con = relmql.connect(model="tiny-gpt2")
    with pytest.raises(relmql.Error, match="too costly to build within the limit of 1,000 states") as info:
        con.sql(f"EXPLAIN SELECT text MATCHING '{COSTLY[0]}' USING max_states 1000").fetchall()
    assert info.value.span is not None
    with pytest.raises(relmql.Error, match="more than 1,000 states"):
        con.sql("SELECT text MATCHING '(a|b)*a(a|b){12}' USING max_states 1000").fetchall()
    assert con.models.names() == []


def test_a_10_mb_alternation_is_refused_at_once_in_a_small_multiple_of_its_size(tmp_path):
    """A million words in one MATCHING (a 10 MB script): refused from the size of its source before
    the model loads. Its string literal was read by a lexer regex that took 620 bytes a character,
    and re compiled the whole pattern for its group names: 56 s and 6.45 GB."""
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(4, 14))) for _ in range(1_000_000)})
    script = tmp_path / "words.rql"
    script.write_text(f"SELECT text, prob MATCHING 'The ({'|'.join(words)})' PREFIX 'The' LIMIT 3;\n")
    size = script.stat().st_size
    code, _, err, rss0, vm0 = run_limited("SELECT text MATCHING 'The (ab' PREFIX 'The';")  # refused alike
    assert code == 1 and "missing )" in err, err
    code, rows, err, rss, vm = run_limited(str(script), limit=vm0 + 2 ** 30)
    assert code == 1 and "Traceback" not in err, err
    lines = err.splitlines()
    assert re.fullmatch(r".*words\.rql:1: compile error: this pattern needs an automaton of at least [\d,]+ states, "
                        r"more than the limit of 100,000", lines[0]), lines[0]
    assert lines[2].strip().startswith("^^^") and lines[3].startswith("hint: use fewer or shorter alternatives")
    assert rss - rss0 < 20 * size, (rss, rss0, size)


def test_max_memory_stops_the_search_and_keeps_its_rows_exact(baseline):
    rss0, vm0 = baseline
    budget = 64 * 2 ** 20
    code, rows, err, rss, vm = run_limited(URLS + " , max_memory '64MiB', max_nodes_per_row 10000000 LIMIT 300;",
                                           limit=vm0 + DEFAULT_MAX_MEMORY)
    assert code == 0 and "Traceback" not in err, err
    assert "when its queue and stored children reached their share of 64 MiB (max_memory)" in err, err
    # the resident memory grew by the budget and the transient tensors of a model call, not more
    assert rss - rss0 < budget + 256 * 2 ** 20, (rss, rss0)


FINITE = ("SELECT text, prob MATCHING 'The (cat|dog|bird|fish|cow|pig|owl|ant) (sat|ran|ate|hid|sang) "
          "(here|there|today)' PREFIX 'The'")


def test_a_stopped_search_is_on_the_result(con):
    full = fresh(con).sql(FINITE)
    assert len(full.fetchall()) == 120 and full.stops == [] and full.stopped is None
    # on tiny-gpt2 the first row needs about 50 nodes, the others follow
    r = fresh(con).sql(FINITE + " USING max_nodes_per_row 40, batch_size 4")
    assert r.fetchall() == []
    assert r.stopped == Stop("max_nodes_per_row", 40, 0) and r.stops == [r.stopped]
    r = fresh(con).sql(FINITE + " USING max_nodes_per_row 100, batch_size 4")
    assert len(r.fetchall()) == 120 and r.stopped is None


def test_a_search_stopped_with_no_row_names_the_bounds_that_had_cut_it_short(con):
    """Of 'x([a-z]{200}|~{32})' only the 32 tildes fit in 2 completion tokens (two of GPT-2's
    16-tilde tokens), behind thousands of likelier letters: the search gives up at
    max_nodes_per_row, and the note says that max_tokens had cut ways on short, not only that
    the search could go further. A search that a bound stops while every way on is within the
    bounds has no such note."""
    s = fresh(con)
    short = s.sql("SELECT text MATCHING 'x([a-z]{200}|~{32})' PREFIX 'x' USING max_tokens 2, max_nodes_per_row 300")
    assert short.fetchall() == [] and short.stopped.bound == "max_nodes_per_row"
    assert short.notes == ["note: no rows before the search stopped, and perhaps none within the bounds: the "
                           "completions reached max_tokens (2 tokens) where MATCHING goes on (raise it)",
                           f"warning: {short.stopped.message()}"]
    roomy = s.sql("SELECT text MATCHING 'x[a-z]{200}' PREFIX 'x' USING max_tokens 64, max_nodes_per_row 300")
    assert roomy.fetchall() == [] and roomy.notes == [f"warning: {roomy.stopped.message()}"]


def test_a_language_that_cannot_fit_in_max_tokens_is_told_at_once(con, tiny):
    """Each string of 'x[a-z]{200}' takes at least 7 GPT-2 tokens after 'x' (its canonical
    encodings take more): with max_tokens 2 a ranking query has no rows and says why without a
    model call (before, it searched until max_nodes_per_row); probability() is exactly 0 with
    the same words; SAMPLE is an error naming max_tokens; EXPLAIN shows it. With room for the
    strings, the search runs as before."""
    s = fresh(con)
    text = "x" + "ab" * 100
    assert len(tiny.vocabulary.encode(text[1:])) >= 7 and re.fullmatch("x[a-z]{200}", text)
    said = "each string of MATCHING takes at least 7 tokens after PREFIX, and max_tokens is 2 (raise it)"
    read = tiny.stats.tokens
    r = s.sql("SELECT text MATCHING 'x[a-z]{200}' PREFIX 'x' USING max_tokens 2")
    assert r.fetchall() == [] and r.notes == [f"note: no rows: {said}"] and r.stopped is None
    assert tiny.stats.tokens == read  # no model call
    p = s.sql("SELECT probability() MATCHING 'x[a-z]{200}' PREFIX 'x' USING max_tokens 2")
    assert p.fetchall() == [(0.0,)]
    assert p.notes == [f"note: probability() measures only the strings within the bounds: {said}"]
    with pytest.raises(relmql.Error, match="sampling cannot draw a string: each string of the language takes at "
                                           "least 7 tokens, and max_tokens is 2") as e:
        s.sql("SELECT text MATCHING 'x[a-z]{200}' PREFIX 'x' USING max_tokens 2 SAMPLE 3").fetchall()
    assert e.value.hint == "raise max_tokens to 7 or more"
    plan = dict(line.split(None, 1) for (line,) in
                s.sql("EXPLAIN SELECT text MATCHING 'x[a-z]{200}' PREFIX 'x' USING max_tokens 2").fetchall())
    assert plan["length"] == ("no string fits: each takes at least 7 completion tokens, and max_tokens is 2 "
                              "(the search gives no rows, at once)")
    fits = s.sql("SELECT text MATCHING 'x(ab|cd)' PREFIX 'x' USING max_tokens 2")
    assert sorted(t for (t,) in fits.fetchall()) == ["xab", "xcd"] and fits.notes == []
    assert tiny.stats.tokens > read


def test_a_results_notes_are_what_it_wrote_on_stderr_and_its_own(con, capsys):
    """``Result.notes``: the notes and warnings a query wrote on stderr, line for line, each
    result its own even when two are read in turns; a dataset query's, once for all its rows."""
    s = fresh(con)
    stopped = s.sql(FINITE + " USING max_nodes_per_row 40, batch_size 4")
    empty = s.sql("SELECT text MATCHING 'zq(a|b)' USING max_tokens 1")
    full = s.sql(FINITE)
    assert next(iter(full)) and stopped.fetchall() == [] and empty.fetchall() == [] and len(full.fetchall()) == 120
    err = capsys.readouterr().err.splitlines()
    assert stopped.notes == [f"warning: {stopped.stopped.message()}"] and stopped.notes[0] in err
    assert empty.notes == ["note: no rows: each string of MATCHING takes at least 2 tokens, and max_tokens is 1 "
                           "(raise it)"] and empty.notes[0] in err
    assert full.notes == [] and len(err) == 2
    # EXPLAIN compiles the query: the compiler's warning is on its result
    plan = s.sql("EXPLAIN SELECT text MATCHING 'a|<\\|endoftext\\|>' LIMIT 3")
    assert len(plan.notes) == 1 and plan.notes[0].startswith("warning: strings of this query that hold the text of")
    assert plan.notes[0] in capsys.readouterr().err.splitlines()


def test_the_models_context_bounds_the_text_as_max_tokens_does(tiny, monkeypatch):
    """A model reads at most its context (tiny-gpt2: 512 positions; past them its position
    embedding raised a raw IndexError): the search reads no node past it, its rows are those of
    an unbounded search that fit, in the same order, and sampling stops its draws there."""
    from relmql.execute import Sample
    ta = compile("a( a){0,30}", tiny.vocabulary)  # a string of k+1 tokens for each k
    full = list(execute(ta, tiny, ShortestPath()))
    assert len(full) == 31
    monkeypatch.setattr(tiny, "max_length", 12)
    stats = SearchStats()
    cut = list(execute(ta, tiny, ShortestPath(), stats=stats))
    assert [r.tokens for r in cut] == [r.tokens for r in full if len(r.tokens) <= 12]
    drawn = list(execute(compile("[a-z ]+", tiny.vocabulary), tiny, Sample(n=20, seed=1, max_tokens=1000)))
    assert len(drawn) == 20 and max(len(r.tokens) for r in drawn) == 12  # the last one scored, unread
    assert all(re.fullmatch("[a-z ]+", r.text) for r in drawn)
    long = compile("a( a){20,30}", tiny.vocabulary)
    stats = SearchStats()
    assert list(execute(long, tiny, ShortestPath(), stats=stats)) == [] and stats.no_row == ("context",)


def test_a_draw_at_the_context_ends_a_string_there_as_the_search_does(tiny, monkeypatch):
    """At the model's context a draw takes a last token (scored by the last read) that ends a
    string of the language, even one that could go on: cut there, as max_tokens cuts a string,
    and as the search finds it. (Draws that took only a token after which nothing could follow
    all gave up here: every string of ( [a-z]+){2} goes on.)"""
    from relmql.execute import Sample
    monkeypatch.setattr(tiny, "max_length", 12)
    pre = "a( a){8}"  # 9 tokens, the start token before them
    ta = compile(pre + "( [a-z]+){2}", tiny.vocabulary, pre)
    best = list(execute(ta, tiny, ShortestPath(limit=3)))
    assert len(best) == 3 and {len(r.tokens) for r in best} <= {11, 12}
    drawn = list(execute(ta, tiny, Sample(n=8, seed=3)))
    assert len(drawn) == 8 and all(re.fullmatch(pre + "( [a-z]+){2}", r.text) for r in drawn)
    assert 12 in {len(r.tokens) for r in drawn} and {len(r.tokens) for r in drawn} <= {11, 12}


def test_a_prefix_longer_than_the_models_context_is_one_message(con):
    prefix = "a" + " a" * 600  # 601 tokens; tiny-gpt2 reads 512
    query = f"SELECT text MATCHING '{prefix}( b| c)' PREFIX '{prefix}'"
    session = fresh(con)
    calls = session.model().stats.calls
    ranked = session.sql(query + " LIMIT 1")
    assert ranked.fetchall() == []
    assert session.model().stats.calls == calls  # refused before the model reads 511 tokens it cannot use
    assert [n for n in ranked.notes if n.startswith("note: no rows")] == [
        "note: no rows: the prefix filled the model's context length (the most tokens it reads) before the "
        "completion began (shorten PREFIX, or use a model with a longer context)"]
    # with room for the prefix, where the completion runs into the context
    fits = "a" + " a" * 505
    ranked = session.sql(f"SELECT text MATCHING '{fits}( b){{8}}' PREFIX '{fits}' LIMIT 1")
    assert ranked.fetchall() == [] and any("where MATCHING goes on" in n for n in ranked.notes)
    with pytest.raises(relmql.ModelError, match="tiny-gpt2 reads at most 512 tokens .* this query needs 602 "
                                                "for a prefix") as info:
        session.sql(query + " SAMPLE 1 USING max_prefix_tokens 1000").fetchall()
    assert info.value.hint == "shorten PREFIX, or use a model with a longer context"  # not max_tokens


def test_max_nodes_per_row_counts_from_the_last_row_where_kept(con):
    """Rows that WHERE drops are not rows: a search whose every row WHERE drops ends at
    max_nodes_per_row (it ran until max_memory, reset by every row it found)."""
    result = fresh(con).sql("SELECT text MATCHING '.*' WHERE prob > 2 USING max_nodes_per_row 300, max_nodes 20000 "
                            "LIMIT 1")
    assert result.fetchall() == []
    assert result.stopped == Stop("max_nodes_per_row", 300, 0)


def test_a_large_batch_size_is_cut_to_what_max_memory_holds(baseline, tiny):
    """A model call's scores (8 bytes per token of the vocabulary, each node or sample) and,
    unless top-k keeps few tokens, its children (as many as the vocabulary) fit half of max_memory: a
    larger batch_size is cut to that, and the rows are those of a small batch. batch_size 100000
    on '.*' grew past 14 GB in a few minutes."""
    from relmql.execute import Sample
    from relmql.execute.sampling import Sampler
    from relmql.execute.shortest import ShortestPathSearch
    from relmql.memory import ARC_BYTES, batch_cap
    from relmql.records import Decoding
    ta = compile(".*", tiny.vocabulary)
    for rules, per in ((Decoding(), 8 + ARC_BYTES), (Decoding(topk=40), 8)):
        want = DEFAULT_MAX_MEMORY // 2 // (len(tiny.vocabulary) * per)
        assert batch_cap(DEFAULT_MAX_MEMORY, len(tiny.vocabulary), not rules.keeps_few(len(tiny.vocabulary))) \
            == want
        search = ShortestPathSearch(ta, tiny, rules, ShortestPath(batch_size=100_000, max_batch_size=200_000))
        assert search.opts.batch_size == search.opts.max_batch_size == want
        assert Sampler(ta, tiny, rules, Sample(n=5, batch_size=100_000)).opts.batch_size == want
    rss0, vm0 = baseline
    code, rows, err, rss, vm = run_limited("SELECT text, prob MATCHING '.*' USING batch_size 100000, "
                                           "max_nodes 600 LIMIT 20;", limit=vm0 + DEFAULT_MAX_MEMORY + 2 ** 30)
    assert code == 0 and len(rows) == 20, err
    assert rss - rss0 < DEFAULT_MAX_MEMORY, (rss, rss0)
    small = [(r.text, r.prob) for r in execute(ta, tiny, ShortestPath(limit=20, batch_size=8))]
    assert [r["text"] for r in rows] == [t for t, _ in small]


@pytest.mark.parametrize("order", ["prob", "total_prob"])
def test_rows_before_a_memory_stop_are_the_first_rows(model, order):
    # every string of [a-h]+ is a row: rows come steadily while the queue grows
    ta = compile("[a-h]+", model.vocabulary)
    peak = SearchStats()
    full = list(execute(ta, model, ShortestPath(order=order, limit=300), stats=peak))
    stats = SearchStats()
    # a budget whose traversal share (a quarter) holds half of what the search needs
    got = list(execute(ta, model, ShortestPath(order=order, limit=300, max_memory=2 * peak.held), stats=stats))
    assert stats.stop is not None and stats.stop.bound == "max_memory" and stats.stop.rows == len(got)
    assert 0 < len(got) < len(full) and peak.held // 2 < stats.held < peak.held
    assert [r.tokens for r in got] == [r.tokens for r in full[:len(got)]]


def test_a_dataset_query_lists_the_stop_of_each_data_row(con, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"p": p}) + "\n" for p in ("https://www\\.", "http://")), encoding="utf-8")
    q = ("SELECT text MATCHING :p || '([a-zA-Z0-9]|_|-)+\\.(com|org)' PREFIX :p "
         f"USING topk 40, max_nodes_per_row 30 LIMIT 5 FOR EACH ROW IN '{data}'")
    r = fresh(con).sql(q)
    r.fetchall()
    assert len(r.stops) == 2 and {s.bound for s in r.stops} == {"max_nodes_per_row"}


def test_an_edited_prompt_s_nodes_count_against_max_prefix_nodes_not_max_nodes_per_row(con):
    """By total_prob the edited variants of a prompt take thousands of prefix nodes before the first
    row (more with every character of the prompt); they count against max_prefix_nodes, so that
    max_nodes_per_row, which bounds the completion's nodes between rows, does not cut a long
    prompt's search short. At max_prefix_nodes the search stops, its rows exact and in order."""
    q = ("SELECT text, prob MATCHING 'Shut up, you stupid (bitch|idiot)' PREFIX 'Shut up, you stupid' "
         "USING edits 1{} LIMIT 3")
    full = fresh(con).sql(q.format("")).fetchall()
    assert len(full) == 3 and all(t.endswith(" idiot") for t, _ in full)
    tight = fresh(con).sql(q.format(", max_nodes_per_row 5"))  # each row is one completion token after its prefix
    got = tight.fetchall()  # the same rows (probabilities within float32 rounding: other batches)
    assert [t for t, _ in got] == [t for t, _ in full] and not tight.stops
    assert [p for _, p in got] == pytest.approx([p for _, p in full], rel=1e-5)
    cut = fresh(con).sql(q.format(", max_prefix_nodes 4000"))  # the first row needs between 3,500 and 4,000
    assert [t for t, _ in cut.fetchall()] == [full[0][0]]
    assert [(s.bound, s.limit, s.rows) for s in cut.stops] == [("max_prefix_nodes", 4000, 1)]
    assert "raise max_prefix_nodes" in cut.stops[0].message()
    none = fresh(con).sql(q.format(", max_prefix_nodes 3500"))
    assert none.fetchall() == [] and [s.bound for s in none.stops] == ["max_prefix_nodes"]
    plan = "\n".join(line for (line,) in fresh(con).sql("EXPLAIN " + q.format(", max_prefix_nodes 4000")))
    assert "4,000 prefix nodes (max_prefix_nodes)" in plan


def test_the_bounds_are_options_and_in_explain(con):
    s = fresh(con)
    s.sql("SET max_memory = '1.5GB'")
    assert s.settings["max_memory"] == 1_500_000_000
    plan = "\n".join(line for (line,) in s.sql("EXPLAIN " + URLS))
    assert "10,000 completion nodes without a row (max_nodes_per_row)" in plan and "of 1.4 GiB" in plan
    assert "max_prefix_nodes" not in plan  # by prob a prefix with more is refused before the search
    with pytest.raises(relmql.Error, match="max_memory is a size such as '2GB'"):
        s.sql("SET max_memory = 'lots'")
    with pytest.raises(relmql.Error, match="max_memory must be at least 64 MiB"):
        s.sql(URLS + ", max_memory 1000")


def test_aggregates_hold_their_rows_within_the_share_of_max_memory(con, monkeypatch):
    """Aggregates read every row at the end, so the rows they hold count against the traversal's
    share of max_memory: a SAMPLE that cannot fit is refused before it runs, and rows that
    outgrow the share end the query with one message (before the machine's memory runs out)."""
    from relmql.engine.aggregate import _Held
    from relmql.memory import shares
    with pytest.raises(relmql.Error, match=r"SAMPLE 1,000,000,000,000 with aggregates .* \(512 MiB of 2 GiB\)") as info:
        con.sql("SELECT count(*) MATCHING 'a|b' SAMPLE 1000000000000").fetchall()  # at once: no model call
    assert info.value.hint == "lower SAMPLE"
    share = shares(64 * 2 ** 20).traversal
    fits = share // _Held.LEAST
    with pytest.raises(relmql.Error, match="with aggregates") as info:
        con.sql(f"SELECT count(*) MATCHING 'a|b' USING max_memory '64MiB' SAMPLE {fits + 1}").fetchall()
    assert "raise max_memory (USING max_memory '1GB')" in info.value.hint
    # the share runs out part way (here, rows made to weigh a 200th of it each)
    monkeypatch.setattr(_Held, "ROW_BYTES", share // 200 - _Held.LEAST + _Held.ROW_BYTES)
    with pytest.raises(relmql.Error, match=r"the aggregates hold every row until the end, and (\d+) rows came to") \
            as info:
        con.sql("SELECT text, count(*) MATCHING 'a|bc' USING max_memory '64MiB' SAMPLE 300 GROUP BY text").fetchall()
    assert 150 < int(info.value.message.split(" rows came")[0].split()[-1]) <= 200
    (n,), = con.sql("SELECT count(*) MATCHING 'a|b' USING max_memory '64MiB' SAMPLE 150").fetchall()
    assert n == 150  # within the share: as before
    # probability()'s estimate: its draws are known once the language is: refused at its first row
    (p,), = con.sql("SELECT probability() MATCHING 'a|b' USING exact_limit 0, estimate_samples 200").fetchall()
    assert 0 < p < 1
    with pytest.raises(relmql.Error, match=r"probability\(\) estimates from 1,000,000,000,000 draws "
                                           r"\(estimate_samples\), .* at least 559 TiB") as info:
        con.sql("SELECT probability() MATCHING 'a|b' USING exact_limit 0, estimate_samples 1e12").fetchall()
    assert info.value.hint == "lower estimate_samples"


def test_a_sampler_whose_draws_are_all_cut_at_max_tokens_gives_up_at_once(tiny, con):
    """'zivg' takes 3 GPT-2 tokens canonically (z iv g; two spell it otherwise, so it is drawn);
    with max_tokens 2 each draw is cut and thrown
    away. The sampler gives up after its first TOO_LONG draws, naming max_tokens, instead of
    spending its whole budget (1,000 draws a sample) the same way; the progress note counts the
    draws cut there. Once any sample has ended the rule no longer applies: with a prefix of b
    (a string at once) or c (11 tokens more), the draws cut after c pass TOO_LONG and every
    sample is b."""
    from relmql.execute import Sample, SampleStats
    from relmql.records import ExecutionError
    from relmql.execute.sampling import TOO_LONG
    from relmql.engine import draws_note
    ta = compile("zivg", tiny.vocabulary)
    assert len(tiny.vocabulary.encode("zivg")) == 3 and ta.too_long(2) is None
    stats = SampleStats()
    with pytest.raises(ExecutionError, match=f"its first {TOO_LONG} draws were all cut at max_tokens") as got:
        list(execute(ta, tiny, Sample(n=1, seed=2, max_tokens=2), stats=stats))
    assert "raise max_tokens" in got.value.hint
    assert stats.draws == stats.discarded == stats.too_long == TOO_LONG < Sample(n=1).draw_budget
    assert f"{TOO_LONG} dead ends ({TOO_LONG} cut at max_tokens 2)" in draws_note(stats, Sample(n=1, max_tokens=2))
    with pytest.raises(relmql.Error, match="cut at max_tokens") as got:
        fresh(con).sql("SELECT text MATCHING 'zivg' USING max_tokens 2 SAMPLE 1").fetchall()
    assert got.value.kind == "execution error"
    # some samples end: no give-up, however many draws are cut
    ta = compile("b|c( a){10}", tiny.vocabulary, "b|c")
    stats = SampleStats()
    rows = list(execute(ta, tiny, Sample(n=40, seed=1, max_tokens=4), stats=stats))
    assert [r.text for r in rows] == ["b"] * 40 and stats.too_long > TOO_LONG


def test_a_query_that_reads_tokens_again_for_want_of_memory_says_so(con, monkeypatch, capsys):
    """Where most of what the model read it read again because the keys and values of earlier
    tokens did not fit max_memory's share (here a share of one byte: every block goes after each
    call, and each call reads the 400-token prompt again), the query says so, with the count the
    model keeps; with room for them it says nothing."""
    from relmql.engine import REREAD_NOTE
    from relmql.models.hf import TransformersModel
    session = fresh(con)
    model = session.model()
    query = "SELECT text MATCHING 'a( a){400}( b| c){4}' PREFIX 'a( a){400}' LIMIT 8"
    assert len(session.sql(query).fetchall()) == 8
    assert "again" not in capsys.readouterr().err
    monkeypatch.setattr(TransformersModel, "set_cache_budget", lambda self, n: setattr(self.store, "budget", 1))
    before = (model.stats.tokens, model.stats.recomputed)
    assert len(session.sql(query).fetchall()) == 8
    tokens, again = model.stats.tokens - before[0], model.stats.recomputed - before[1]
    assert again >= REREAD_NOTE and 2 * again > tokens, (again, tokens)
    err = capsys.readouterr().err
    assert f"note: the model read {again:,} of its {tokens:,} tokens again" in err and "raise max_memory" in err
