"""The Python API: ``connect()``, ``Connection.sql()`` and the lazy ``Result``."""

from __future__ import annotations

import io
import re
import sys
import threading
import time

import pytest

import relmql
from conftest import fresh
from relmql.execute import Cancelled
from relmql.plan import OPTIONS, PlanError

SMALL = "SELECT rank, text, prob MATCHING '(The|A) (cat|dog|bird) (sat|ran)' PREFIX '(The|A)'"  # 12 rows
LONG = "SELECT text MATCHING '[a-z]{1,30}' USING topk 50 LIMIT 100000"  # runs for minutes


# -- laziness

def test_a_result_runs_nothing_until_it_is_read(con, model):
    before = model.stats.calls
    start = time.monotonic()
    result = con.sql(LONG)
    assert time.monotonic() - start < 1.0
    assert model.stats.calls == before
    assert result.columns == ("text",)
    first = result.fetchone()
    assert first is not None and re.fullmatch("[a-z]{1,30}", first[0])
    used = model.stats.calls - before
    assert 0 < used < 100  # the first row, not the whole search
    result.fetchmany(2)
    assert model.stats.calls - before < 200


def test_truth_of_a_result_reads_one_row(con, model):
    before = model.stats.calls
    assert con.sql(LONG)  # not the whole search, as len() would be
    assert model.stats.calls - before < 100
    assert not con.sql(SMALL + " WHERE prob < 0")


def test_the_model_loads_on_first_read():
    con = relmql.connect(model="tiny-gpt2", dtype="float32")
    loaded = lambda: dict((m, l) for m, _, l in con.sql("SHOW MODELS"))["tiny-gpt2"]  # noqa: E731, E741
    result = con.sql(SMALL)
    assert loaded() is False
    assert len(result.fetchmany(2)) == 2
    assert loaded() is True


# -- reading rows

def test_fetch_methods_agree(con):
    everything = con.sql(SMALL).fetchall()
    assert len(everything) == 12 and all(isinstance(r, tuple) and len(r) == 3 for r in everything)
    r = con.sql(SMALL)
    for bad in ("2", -1, 1.5, True, None):  # (a str was a TypeError, -1 an empty list)
        with pytest.raises(relmql.Error, match=r"fetchmany\(n\) takes a whole number of rows, 0 or more"):
            r.fetchmany(bad)
    assert r.fetchmany(0) == []
    one = r.fetchone()
    some = r.fetchmany(4)
    rest = r.fetchall()
    assert [one] + some + rest == everything
    assert r.fetchone() is None and r.fetchmany(3) == [] and r.fetchall() == []
    # iteration starts from the first row whatever was fetched
    assert list(r) == everything and len(r) == 12
    dicts = con.sql(SMALL).to_dicts()
    assert dicts == [dict(zip(("rank", "text", "prob"), row)) for row in everything]
    assert [d["rank"] for d in dicts] == list(range(1, 13))


def test_iterating_twice_gives_the_same_rows_without_running_again(con, model):
    r = con.sql(SMALL.replace("SELECT", "SELECT completion,") + " USING seed 4 SAMPLE 9")
    first = list(r)
    calls = model.stats.calls
    assert list(r) == first and len(first) == 9
    assert model.stats.calls == calls
    # two iterators over one result, interleaved, see the same rows
    a, b = iter(r), iter(r)
    assert [next(a), next(a)] == [next(b), next(b)] == first[:2]


def test_repr_is_a_bounded_table(con):
    text = repr(con.sql(SMALL))
    body = [line for line in text.splitlines() if line.startswith("│")]
    assert [c.strip() for c in body[0].split("│")[1:-1]] == ["rank", "text", "prob"]
    assert len(body) == 1 + 10
    assert text.splitlines()[-1] == "(first 10 rows shown; more not fetched)"
    few = repr(con.sql(SMALL + " LIMIT 3"))
    assert few.splitlines()[-1] == "(3 rows)"
    assert len([line for line in few.splitlines() if line.startswith("│")]) == 4
    assert "The" in few


def test_repr_html(con):
    page = con.sql(SMALL)._repr_html_()
    assert page.startswith("<table>") and "</table>" in page
    assert "<th>rank</th><th>text</th><th>prob</th>" in page
    assert page.count("<tr>") == 1 + 10 and "more not fetched" in page
    few = con.sql(SMALL + " LIMIT 2")._repr_html_()
    assert few.count("<tr>") == 3 and "more not fetched" not in few
    assert "<pre>" in con.sql("SET topk = NULL")._repr_html_()


def test_show(con, capsys):
    con.sql(SMALL).show(max_rows=3)
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "(first 3 rows shown; more not fetched)"
    assert sum(line.startswith("│") for line in out.splitlines()) == 4
    con.sql(SMALL + " LIMIT 2").show()
    assert capsys.readouterr().out.splitlines()[-1] == "(2 rows)"
    con.sql("SELECT text MATCHING '(a|b|c|d|e)(f|g|h|i|j)' LIMIT 23").show(max_rows=None)  # every row
    assert capsys.readouterr().out.splitlines()[-1] == "(23 rows)"
    con.sql("EXPLAIN " + SMALL).show()
    assert capsys.readouterr().out.startswith("model ")
    fresh(con).sql("SET topk = 5").show()
    assert capsys.readouterr().out == "SET topk = 5\n"


def test_explain(con):
    r = con.sql(SMALL + " USING topk 40 LIMIT 4")
    plan = r.explain()
    assert plan == "\n".join(line for (line,) in con.sql("EXPLAIN " + SMALL + " USING topk 40 LIMIT 4"))
    assert re.search(r"^decoding +topk 40", plan, re.M) and "stops after 4 rows" in plan
    assert re.search(r"^strings +12$", plan, re.M)
    assert r._rows == []  # explaining compiles, it does not run the query
    # with WHERE, LIMIT ends the search once that many rows pass (it reads until then, not to the end)
    filtered = con.sql(SMALL + " WHERE prob > 0 LIMIT 4")
    assert "stops once 4 rows passed WHERE" in filtered.explain() and len(filtered.fetchall()) == 4
    assert "runs until the language is exhausted" in con.sql(SMALL + " WHERE prob > 0").explain()
    with pytest.raises(relmql.Error, match="only queries have a plan"):
        fresh(con).sql("SET topk = 3").explain()
    explained = con.sql("EXPLAIN " + SMALL)  # its rows are the plan; explain() says so
    with pytest.raises(relmql.Error, match="this is the result of EXPLAIN") as info:
        explained.explain()
    assert "fetchall()" in info.value.hint and any(r[0].startswith("strings") for r in explained.fetchall())


# -- cancel

def test_cancel_from_another_thread(con):
    r = con.sql(LONG)
    timer = threading.Timer(0.5, r.cancel)
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(Cancelled) as info:
            for _ in r:
                pass
    finally:
        timer.cancel()
    assert time.monotonic() - start < 10
    assert isinstance(info.value, relmql.Error)
    assert "cancelled" in info.value.render()
    # the rows computed before the cancel stay readable; a read past them raises again
    computed = r.rows_so_far
    assert [r.fetchone() for _ in computed] == computed
    with pytest.raises(Cancelled):
        r.fetchone()
    # the connection still works
    assert len(con.sql(SMALL + " LIMIT 1").fetchall()) == 1


def test_cancel_reaches_a_compile_that_a_row_runs(con, model, monkeypatch):
    """Work that compiles while a row is computed (outside the statement's own compile: an
    automaton built lazily for the vocabulary) checks the result's cancel at its checkpoints, as
    the shell's Ctrl-C does, not only the search between model calls."""
    from relmql.records import checkpoint
    r = con.sql(LONG)
    seen = []
    extend = type(model).extend

    def cancel_then_compile(self, states, tokens):
        r.cancel()
        try:
            checkpoint()  # where a lazily built automaton checks
        except Cancelled:
            seen.append("checkpoint")
            raise
        return extend(self, states, tokens)

    monkeypatch.setattr(type(model), "extend", cancel_then_compile)
    with pytest.raises(Cancelled):
        r.fetchone()
    assert seen == ["checkpoint"]


def test_ctrl_c_stops_a_long_compile_in_python(con, monkeypatch):
    """Ctrl-C (KeyboardInterrupt in the main thread) during a determinization that takes minutes
    ends it at once, its child process too; the connection goes on."""
    import _thread

    from relmql.automata import primitives
    children = []
    spawn = primitives._spawn
    monkeypatch.setattr(primitives, "_spawn", lambda args: children.append(spawn(args)) or children[-1])
    timer = threading.Timer(1.0, _thread.interrupt_main)
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            con.sql("EXPLAIN MATCHING '(a|b)*a(a|b){20}' USING max_states 3000000")
    finally:
        timer.cancel()
    assert time.monotonic() - start < 20  # the compile alone takes minutes
    assert len(children) == 1 and children[0].returncode is not None
    assert len(con.sql(SMALL + " LIMIT 1").fetchall()) == 1



def test_ctrl_c_is_not_lost_when_it_lands_in_a_finalizer(con, monkeypatch):
    """Python drops a KeyboardInterrupt raised inside a finalizer ("Exception ignored in ...", as a
    garbage collection can run one at any moment); the statement is cancelled too, so a compile
    that takes minutes stops at its next checkpoint and Ctrl-C still raises KeyboardInterrupt."""
    import signal

    from relmql.automata import primitives

    class PressedDuringFinalizer:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside __del__

    children = []
    spawn = primitives._spawn

    def spawn_then_press(args):
        children.append(spawn(args))
        PressedDuringFinalizer()  # made and dropped at once
        return children[-1]

    monkeypatch.setattr(primitives, "_spawn", spawn_then_press)
    watchdog = threading.Timer(20, lambda: [c.kill() for c in children])  # a lost press: a failure, not minutes
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # a test worker may ignore SIGINT
    watchdog.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            con.sql("EXPLAIN MATCHING '(a|b)*a(a|b){20}' USING max_states 3000000")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        watchdog.cancel()
        signal.signal(signal.SIGINT, before)
    assert len(children) == 1 and children[0].returncode is not None
    assert len(con.sql(SMALL + " LIMIT 1").fetchall()) == 1



def test_ctrl_c_lost_in_a_finalizer_still_stops_a_query(con, monkeypatch):
    """The same for a query's rows: the press cancels the query, which stops at its next model
    call (here: rather than at the end of a 20 s wait), and reading raises KeyboardInterrupt."""
    import signal

    import relmql.engine

    class PressedDuringFinalizer:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)

    def stuck(plan, models, listener, *args, **kwargs):
        PressedDuringFinalizer()
        listener.cancel.wait(20)
        raise Cancelled("the query was cancelled")
        yield

    monkeypatch.setattr(relmql.engine, "run", stuck)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = con.sql(SMALL)
        t0 = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            result.fetchall()
        assert time.perf_counter() - t0 < 10
    finally:
        signal.signal(signal.SIGINT, before)
    with pytest.raises(Cancelled, match="interrupted after 0 rows"):
        result.fetchall()


# -- pandas

def test_df_with_pandas(con):
    pd = pytest.importorskip("pandas")
    frame = con.sql(SMALL).df()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == ["rank", "text", "prob"] and len(frame) == 12
    assert list(frame["rank"]) == list(range(1, 13))


def test_df_without_pandas_is_a_clean_error(con, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now raises ImportError
    with pytest.raises(relmql.Error, match="pandas") as info:
        con.sql(SMALL).df()
    assert "Traceback" not in info.value.render()


# -- statements and sessions

def test_several_statements_give_the_last_result_with_sets_applied(con):
    session = fresh(con)
    got = session.sql("SET topk = 30000; SET seed = 2;\n" + SMALL + " SAMPLE 6").fetchall()
    assert got == con.sql(SMALL + " USING topk 30000, seed 2 SAMPLE 6").fetchall()
    options = {name: value for name, value, _, _ in session.sql("SHOW OPTIONS")}
    assert options["topk"] == 30000 and options["seed"] == 2
    # an error in any statement raises; statements before it have run
    with pytest.raises(PlanError, match="did you mean topp"):
        session.sql("SET topk = 7; SET topq = 1; SET seed = 9")
    options = {name: value for name, value, _, _ in session.sql("SHOW OPTIONS")}
    assert options["topk"] == 7 and options["seed"] == 2
    # a syntax error anywhere: nothing runs
    with pytest.raises(relmql.ParseError):
        session.sql("SET topk = 8; SELECT text MATCHING 'a' LIMT 3")
    assert {n: v for n, v, _, _ in session.sql("SHOW OPTIONS")}["topk"] == 7
    empty = session.sql("  -- nothing\n")
    assert empty.kind == "status" and empty.fetchall() == []


def test_show_statements(con):
    models = con.sql("SHOW MODELS")
    assert models.columns == ("model", "default", "loaded")
    rows = {m: (d, l) for m, d, l in models}  # noqa: E741
    assert rows["tiny-gpt2"] == (True, True) and rows["smollm2-135m"][0] is False
    options = con.sql("show options").to_dicts()
    assert [o["option"] for o in options] == list(OPTIONS)
    session = fresh(con)
    session.sql('SET "topk" = 3')  # a quoted name is a name, here too
    assert session.sql('SHOW "topk"').fetchall() == session.sql("SHOW topk").fetchall() == [
        ("topk", 3, None, OPTIONS["topk"].doc)]
    for o in options:
        assert o["default"] == OPTIONS[o["option"]].default and o["meaning"]
    assert {o["option"]: o["value"] for o in options}["model"] == "tiny-gpt2"
    functions = {f: k for f, k, _ in con.sql("SHOW FUNCTIONS")}
    for name in ("escape", "words", "any_of", "lines", "last_word", "drop_last_word"):
        assert functions[name] == "scalar"
    for name in ("count", "sum", "avg", "min", "max"):
        assert functions[name] == "aggregate"
    assert functions["group"] == "row"
    with pytest.raises(PlanError, match="SHOW MODLES is not known") as info:
        con.sql("SHOW MODLES")
    assert info.value.hint == "did you mean SHOW MODELS?"
    # one option, as psql's SHOW name
    assert con.sql("SHOW topk").fetchall() == [("topk", None, None, OPTIONS["topk"].doc)]
    assert con.sql("show MODEL").to_dicts()[0]["value"] == "tiny-gpt2"
    with pytest.raises(PlanError, match="SHOW TOPQ is not known") as info:
        con.sql("SHOW topq")
    assert info.value.hint == "did you mean SHOW topp?"


def test_set_takes_a_bare_word_as_from_takes_a_model_name(con):
    session = fresh(con)
    session.sql("SET model = tiny-gpt2; SET tokenization = all")
    assert session.sql("SHOW model").fetchall()[0][1] == "tiny-gpt2"
    assert session.sql("SHOW tokenization").fetchall()[0][1] == "all"
    # words that begin or go on with digits, which a query would read as a number and a name
    session.sql("SET model = gemma3-270m; SET max_memory = 512MiB; SET seed = 1e3")
    assert session.sql("SHOW model").fetchall()[0][1] == "gemma3-270m"
    assert session.settings["max_memory"] == 512 * 2 ** 20 and session.settings["seed"] == 1000
    session.sql("SET model = smollm2-135m; SET model = tiny-gpt2; SET topk = 2 * 20")  # numbers stay numbers
    assert session.settings["topk"] == 40 and session.settings["model"] == "tiny-gpt2"
    with pytest.raises(PlanError, match="cannot refer to the result column 'tiny'"):
        session.sql("SET model = tiny - gpt2")  # spaces: an expression, as in a query
    with pytest.raises(PlanError, match="topk is a whole number, not 'a-b'"):
        session.sql("SET topk = a-b")
    session.sql("SET topk = 5; SET model = DEFAULT; SET topk TO default")  # as PostgreSQL's SET ... DEFAULT
    assert session.settings["topk"] is None and session.settings["model"] == OPTIONS["model"].default


def test_set_param_is_a_default_the_caller_s_value_overrides(con, tmp_path):
    session = fresh(con)
    assert session.sql("SET :n = 1 + 2").message == "SET :n = 3"
    q = "SELECT :n AS n, :w AS w, count(*) AS c MATCHING 'The (cat|dog)' SAMPLE :n"
    session.sql("SET :w TO :n * 2")  # a value may use the parameters set before it
    assert session.sql(q).fetchall() == [(3, 6, 3)]
    said = session.sql("SET :n = 4", params={"n": 2}).message
    assert said == "SET :n = 4 (the caller's :n = 2 wins)"
    assert session.sql(q, params={"n": 2}).fetchall() == [(2, 6, 2)]  # the caller's value wins
    assert session.sql(q).fetchall() == [(4, 6, 4)]  # and the default holds where it binds none
    # a data row's fields win too: each row's :n is its own
    (tmp_path / "rows.jsonl").write_text('{"n": 7}\n{"n": 8}\n')
    rows = session.sql("SELECT :n AS n MATCHING 'a' FOR EACH ROW IN :data",
                       params={"data": str(tmp_path / "rows.jsonl")}).fetchall()
    assert rows == [(7,), (8,)]
    # SHOW PARAMETERS: each value and where it comes from, the caller's winning as in a query
    assert session.sql("SHOW PARAMETERS").fetchall() == [("n", "4", "SET"), ("w", "6", "SET")]
    assert session.sql("SHOW parameters", params={"n": "x", "k": 1}).fetchall() == \
        [("k", "1", "caller"), ("n", "'x'", "caller"), ("w", "6", "SET")]
    assert session.sql("SET :n = DEFAULT").message == "SET :n = DEFAULT (no value unless the caller binds one)"
    with pytest.raises(PlanError, match="parameter :n has no value") as info:
        session.sql(q)
    assert info.value.hint.endswith("or SET :n = value (a script's default)")
    with pytest.raises(PlanError, match="parameter :x has no value"):
        session.sql("SET :m = :x")
    assert con.param_defaults == {}  # a session's own: the shared connection has none of them
    # a bare word is text, as in SET option = word: a model for FROM :model
    assert session.sql("SET :model = tiny-gpt2").message == "SET :model = 'tiny-gpt2'"
    assert session.sql("SELECT text FROM :model MATCHING 'The (cat|dog)' LIMIT 1").fetchall() == \
        con.sql("SELECT text FROM 'tiny-gpt2' MATCHING 'The (cat|dog)' LIMIT 1").fetchall()
    assert session.sql("SET :n = 2", params={1: "x"}).message == "SET :n = 2"  # keys that are not names


def test_approximate_numbers_are_said_with_the_first_rows(con):
    """A reduced dtype's numbers are approximate: the first query of a session that reads them
    says so on standard error (and in its notes), once; float32's exact numbers say nothing."""
    half = relmql.connect(model="tiny-gpt2", dtype="bfloat16")
    try:
        first = half.sql("SELECT text, prob MATCHING 'The (cat|dog)' PREFIX 'The'")
        assert (len(first.fetchall()) == 2
                and first.approximate.startswith("approximate: the model computes in bfloat16"))
        assert first.notes == [f"note: the numbers are {first.approximate}"]
        again = half.sql("SELECT text, prob MATCHING 'The (cat|dog)' PREFIX 'The'")
        assert len(again.fetchall()) == 2 and again.notes == []
    finally:
        half.close()
    exact = fresh(con).sql("SELECT text, prob MATCHING 'The (cat|dog)' PREFIX 'The'")
    assert len(exact.fetchall()) == 2 and exact.approximate is None and exact.notes == []


def test_connect_takes_options_as_keywords(con):
    session = fresh(con, topk=30000, seed=3)
    assert "topk 30000;" in session.sql(SMALL).explain()
    assert session.sql(SMALL).fetchall() == con.sql(SMALL + " USING topk 30000").fetchall()
    assert session.sql(SMALL + " SAMPLE 5").fetchall() == \
        con.sql(SMALL + " USING topk 30000, seed 3 SAMPLE 5").fetchall()
    assert "eos (the end-of-text token must follow" in fresh(con, eos=True).sql(SMALL).explain()
    # a query's USING wins over the session's setting, for that query only
    assert session.sql(SMALL + " USING topk 1").fetchall() == []
    assert len(session.sql(SMALL).fetchall()) > 0


@pytest.mark.parametrize("options, words", [
    ({"topq": 5}, "unknown option 'topq'; did you mean topp?"),
    ({"topk": "x"}, "topk is a whole number"),
    ({"topk": 0}, "topk must be at least 1"),
    ({"tokenization": "some"}, "tokenization is one of canonical, all"),
    ({"dtype": "float8"}, "dtype is one of"),
    ({"seed": -1}, "seed must be at least 0"),
    ({"device": "tpu"}, "device is cpu, cuda, cuda:N or auto, not 'tpu'"),
    ({"temperature": 1e-45}, "temperature must be at least 1e-30"),  # the logits overflowed: no row, no word
    ({"test_draws": 1e300}, "test_draws must be at most 1e+12, not 1e+300"),  # past it scipy's sums overflow
])
def test_bad_connect_options_are_clean_errors(options, words):
    with pytest.raises(PlanError) as info:
        relmql.connect(model="tiny-gpt2", **options)
    assert words in info.value.message
    assert "Traceback" not in info.value.render()


def test_set_refuses_a_model_or_device_that_names_nothing(con, tmp_path):
    session = fresh(con)
    (tmp_path / "file").write_text("")
    for statement, error, words in (("SET model = smolm2", relmql.ModelError, "unknown model 'smolm2'; did you mean"),
                                    ("SET model = './nodir'", relmql.ModelError, "no model directory './nodir' "),
                                    (f"SET model = '{tmp_path}/file'", relmql.ModelError, "directory .*: it is a file"),
                                    ("SET device = 'gpu'", PlanError, "device is cpu, cuda, cuda:N or auto")):
        with pytest.raises(error, match=words) as info:  # at the SET, not at every query after it
            session.sql(statement)
        assert statement[info.value.span[0]:info.value.span[1]] in ("smolm2", "'gpu'", "'./nodir'",
                                                                    f"'{tmp_path}/file'")
    assert session.settings["model"] == "tiny-gpt2" and session.settings["device"] == con.settings["device"]
    with pytest.raises(relmql.ModelError, match="unknown model 'nosuch'"):
        relmql.connect(model="nosuch")


def test_a_gpu_this_machine_lacks_is_refused_at_the_set_unless_ray_runs_the_queries(con, monkeypatch):
    """In-process, a CUDA device torch cannot see fails where it is set (with a caret), not at
    every query after it; the Ray engine's workers may have the GPUs the driver lacks."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on CI, GPU or not
    session = fresh(con)
    statement = "SET device = 'cuda:0'"
    with pytest.raises(relmql.ModelError, match="torch sees no CUDA GPU on this machine") as info:
        session.sql(statement)
    assert statement[info.value.span[0]:info.value.span[1]] == "'cuda:0'" and "DEFAULT" in info.value.hint
    assert session.settings["device"] == con.settings["device"]
    with pytest.raises(relmql.ModelError, match="no CUDA GPU"):
        relmql.connect(model="tiny-gpt2", device="cuda")
    ray = relmql.connect(model="tiny-gpt2", device="cuda", engine="ray")  # no worker starts before a query
    assert ray.settings["device"] == "cuda"
    with pytest.raises(relmql.ModelError, match="no CUDA GPU"):  # back in this process
        ray.sql("SET engine = 'local'")


def test_connection_is_a_context_manager(con):
    with fresh(con) as session:
        assert len(session.sql(SMALL + " LIMIT 1").fetchall()) == 1
    assert session.models.names() == []


def test_a_closed_connection_cannot_be_used(con):
    session = fresh(con)
    waiting = session.sql(SMALL)
    session.close()
    for use in (lambda: session.sql(SMALL), waiting.fetchall, lambda: session.set("topk", 3),
                lambda: session.sql("SHOW options")):
        with pytest.raises(relmql.Error, match="the connection is closed"):
            use()


def test_default_connection_uses_the_embedded_model():
    # the one query on smollm2-135m: the module-level relmql.sql()
    rows = relmql.sql("SELECT text, prob MATCHING 'a(b|c)' LIMIT 1").fetchall()
    assert len(rows) == 1 and rows[0][0] in ("ab", "ac") and 0 < rows[0][1] <= 1
    assert {m: d for m, d, _ in relmql.sql("SHOW MODELS")}["smollm2-135m"] is True


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def _on_terminal(monkeypatch) -> _Terminal:
    """Standard error as a terminal, where bars are drawn at once and at every change (in the
    test's body: pytest's capture sets sys.stderr again between a fixture and the test)."""
    from relmql.output import bars
    monkeypatch.setattr(bars.RowBar, "DELAY", 0)
    monkeypatch.setattr(bars.RowBar, "MININTERVAL", 0)
    err = _Terminal()
    monkeypatch.setattr(sys, "stderr", err)
    return err


def test_progress_bar_on_a_terminal_only(monkeypatch):
    con = relmql.connect(model="tiny-gpt2", progress=True)
    query = "SELECT text MATCHING '(a|b)(c|d)' USING seed 3 SAMPLE 20"
    err = _on_terminal(monkeypatch)
    assert len(con.sql(query).fetchall()) == 20
    assert "/20" in err.getvalue()
    quiet = io.StringIO()  # not a terminal: no bar
    monkeypatch.setattr(sys, "stderr", quiet)
    assert len(con.sql(query).fetchall()) == 20
    assert quiet.getvalue() == ""


def _current_line(raw: str) -> str:
    """What the terminal shows on the line of its cursor after ``raw`` (a carriage return goes
    back to the line's start; what follows overwrites)."""
    line = ""
    for part in raw.rsplit("\n", 1)[-1].split("\r"):
        line = part + line[len(part):]
    return line


def test_each_row_is_handed_out_with_the_progress_bar_cleared(con, monkeypatch):
    err = _on_terminal(monkeypatch)
    seen = [err.getvalue() for _ in fresh(con, progress=True).sql("SELECT text MATCHING '(a|b)(c|d)(e|f)' LIMIT 8")]
    assert len(seen) == 8
    for i, raw in enumerate(seen):
        # the bar was drawn since the row before (the wait is when it shows)...
        assert re.search(r"\d+row \[", raw[len(seen[i - 1]) if i else 0:]), raw
        # ...and is off the screen, the cursor at the start of its line, as the row is handed out
        assert raw.endswith("\r") and _current_line(raw).strip() == "", repr(raw[-200:])
    assert _current_line(err.getvalue()).strip() == ""  # closed: nothing left behind


def test_a_bar_that_showed_only_notes_is_taken_off_when_the_query_ends(monkeypatch):
    """A search that finds no row before a bound ends it shows the nodes it read (notes, no row
    count yet) once it has run for DELAY; its end takes the bar off the line, so that the warning
    (or the shell's "cancelled") is not written after it."""
    from relmql.output import bars
    con = relmql.connect(model="tiny-gpt2", progress=True)
    err = _on_terminal(monkeypatch)
    monkeypatch.setattr(bars.RowBar, "DELAY", 0.05)  # tqdm draws nothing itself before it
    rows = con.sql("SELECT text MATCHING 'a( [a-z]+){3}' PREFIX 'a' USING max_nodes_per_row 200 LIMIT 1")
    assert rows.fetchall() == []
    raw = err.getvalue()
    assert re.search(r"0row \[.*nodes", raw)  # the bar was drawn, with its note
    shown = [_current_line(line) for line in raw.split("\n")]  # what each line of the terminal shows
    assert not any("row [" in line for line in shown), shown


def test_the_bar_counts_a_search_s_nodes_before_its_row(monkeypatch):
    """A search that reads many nodes for a row says how many after each model call, against the
    bound that would end it: the rows alone would show nothing for minutes."""
    con = relmql.connect(model="tiny-gpt2", progress=True)
    err = _on_terminal(monkeypatch)
    noting = re.compile(r"([\d,]+) nodes of max_nodes 900, ([\d,]+) of max_nodes_per_row 10,000 for row (\d)")
    rows = con.sql("SELECT text MATCHING '[q-z]{8}' USING batch_size 2, max_nodes 900 LIMIT 2")
    first = rows.fetchone()
    before = err.getvalue()
    second = rows.fetchone()
    assert first and second
    noted = noting.findall(before)
    counts = list(dict.fromkeys(int(n.replace(",", "")) for n, _, _ in noted))  # each drawn once or more
    assert len(counts) >= 3 and counts == sorted(counts) and counts[-1] <= 900  # one a model call
    # the first row's: every node so far but the root (the start-of-text token, of the prefix)
    assert all(row == "1" and int(since.replace(",", "")) == int(n.replace(",", "")) - 1 for n, since, row in noted)
    after = noting.findall(err.getvalue()[len(before):])
    assert after and all(row == "2" for _, _, row in after)
    n, since, _ = after[-1]
    assert int(n.replace(",", "")) - int(since.replace(",", "")) >= counts[-1]  # counted from the first row on
    quiet = io.StringIO()  # not a terminal: no bar, no count
    monkeypatch.setattr(sys, "stderr", quiet)
    assert con.sql("SELECT text MATCHING '[q-z]{8}' USING batch_size 2 LIMIT 2").fetchall() == [first, second]
    assert quiet.getvalue() == ""


def test_the_bar_says_when_the_automaton_compiles(monkeypatch):
    """A compile runs for minutes under a raised max_states, with no model call: the bar says so,
    and says it no more once the search has begun."""
    con = relmql.connect(model="tiny-gpt2", progress=True)
    err = _on_terminal(monkeypatch)
    rows = con.sql("SELECT text MATCHING '(a|b)*b(a|b){12}' USING max_states 1000000, batch_size 2 LIMIT 1")
    assert len(rows.fetchall()) == 1
    out = err.getvalue()
    assert "compiling the automaton]" in out
    last = out.rindex("compiling the automaton]")
    assert "nodes, " in out[last:] and "compiling" not in out[out.index("nodes, ", last):]


def test_the_bar_counts_a_sampler_s_draws_before_its_row(con, monkeypatch):
    """A rejection-heavy SAMPLE draws thousands of times for a row, most of them without a model
    call: the bar says how many against max_draws, and how many were thrown away."""
    err = _on_terminal(monkeypatch)
    with pytest.raises(relmql.Error, match="gave up after 5,000 draws"):
        fresh(con, progress=True).sql("SELECT text MATCHING 'zq[0-9]{2}' USING sampling exact, max_draws 5000 "
                                      "SAMPLE 3").fetchall()
    noted = [(int(d.replace(",", "")), int(x.replace(",", "")))
             for d, x in re.findall(r"([\d,]+) draws of max_draws 5,000, ([\d,]+) rejected", err.getvalue())]
    assert len(noted) >= 3 and noted == sorted(noted) and noted[-1][0] <= 5000
    assert all(0 < x <= d for d, x in noted)
    # local sampling: its draws, and its dead ends as such
    err = _on_terminal(monkeypatch)
    rows = fresh(con, progress=True).sql("SELECT text MATCHING '(a|b)(c|d)' USING seed 3 SAMPLE 20").fetchall()
    assert len(rows) == 20 and re.search(r"\d+ draws of max_draws 20,000[,\]]", err.getvalue())
    assert "rejected" not in err.getvalue()


def test_a_result_that_failed_fails_every_later_read(con):
    """An error, cancel() or Ctrl-C part way: no later read passes the rows so far off as all."""
    r = con.sql("SELECT text MATCHING 'zq[0-9]{6}' USING sampling exact, max_draws 1 SAMPLE 20")
    for read in (r.fetchall, r.fetchall, lambda: len(r), r.to_dicts):
        with pytest.raises(relmql.Error, match="gave up after 1 draws"):
            read()

    def interrupted(result):
        yield ("a",)
        yield ("b",)
        raise KeyboardInterrupt  # Ctrl-C while the third row is computed

    r = relmql.Result(("x",), interrupted)
    with pytest.raises(KeyboardInterrupt):
        r.fetchall()
    for read in (r.fetchall, lambda: list(r), r.show):
        with pytest.raises(relmql.Cancelled, match="interrupted after 2 rows"):
            read()
    assert r.rows_so_far == [("a",), ("b",)]

    r = con.sql(SMALL + " LIMIT 5")
    assert r.fetchone() is not None
    r.cancel()
    for read in (r.fetchall, r.fetchall):
        with pytest.raises(relmql.Cancelled):
            read()


def test_threads_reading_one_result_share_its_rows(con):
    import threading
    expected = con.sql(SMALL + " LIMIT 18").fetchall()
    r, got = con.sql(SMALL + " LIMIT 18"), []
    threads = [threading.Thread(target=lambda: got.append(r.fetchall())) for _ in range(3)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(row for rows in got for row in rows) == sorted(expected)  # each row fetched once
    assert list(r) == expected


def test_connect_and_params_take_what_python_code_has_at_hand(con):
    np = pytest.importorskip("numpy")
    c = relmql.connect(model="tiny-gpt2", topk=np.int64(5), topp=np.float32(0.5), ray_address="ray://h:1")
    assert (c.settings["topk"], c.settings["topp"], c.settings["ray_address"]) == (5, 0.5, "ray://h:1")
    assert type(c.settings["topk"]) is int
    assert relmql.connect(model="tiny-gpt2", address="ray://a:1").settings["ray_address"] == "ray://a:1"
    got = con.sql("SELECT text MATCHING 'a(b|c)' LIMIT :n", {"n": np.int64(1)}).fetchall()
    assert len(got) == 1  # numpy's integers are whole numbers (pandas gives them)
    with pytest.raises(relmql.PlanError, match="params is a mapping .* not list"):
        con.sql("SELECT text MATCHING :q", ["ab"])  # was read as {'a': 'b'}
    assert con.sql("SELECT text MATCHING :q", {":q": "ab"}).fetchall() == [("ab",)]  # the name as written
    with pytest.raises(relmql.PlanError, match="progress is True or False, not 'no'"):
        relmql.connect(model="tiny-gpt2", progress="no")
    assert fresh(con).sql("SET topk = NULL").message == "SET topk = NULL (the default)"
    assert fresh(con).sql("SET topk = DEFAULT").message == "SET topk = NULL (the default)"  # no top-k, as NULL
    assert fresh(con).sql("SET topk = 5").message == "SET topk = 5"


def test_rows_past_the_keep_budget_stream_through_and_are_not_kept(con):
    """A result keeps the rows read for a second read up to KEEP_BYTES; past that it streams on
    without keeping any (a long SAMPLE written to a file holds no more memory), and a read that
    needs the dropped rows says so instead of giving a part of them."""
    def numbers(result):
        for i in range(10_000):
            yield (i, "x" * 50)

    r = relmql.Result(("i", "s"), numbers)
    r.KEEP_BYTES = 100 * 200  # about 100 rows
    assert [row[0] for row in r] == list(range(10_000))  # one reader: every row, in order
    assert len(r._rows) < 200 and r._base > 0
    for read in (r.fetchall, lambda: list(r), lambda: r.rows_so_far, r.to_dicts):
        with pytest.raises(relmql.Error, match="rows were not kept") as info:
            read()
        assert "10,000 rows read" in info.value.message and "run the query again" in info.value.hint
    small = relmql.Result(("i", "s"), numbers)
    assert list(small) == list(small) and len(small.rows_so_far) == 10_000  # within the budget: kept
    s = con.sql("SELECT text MATCHING 'a|b' USING seed 3 SAMPLE 300")
    s.KEEP_BYTES = 2000
    got = [t for t, in s]
    assert len(got) == 300 and got == [t for t, in con.sql("SELECT text MATCHING 'a|b' USING seed 3 SAMPLE 300")]


@pytest.mark.parametrize("sql, says, under", [
    (r"SELECT text MATCHING '(a)\1'", "back-references are not regular", r"\1"),
    ("SELECT text MATCHING 'ab' PREFIX '(a'", "missing ), unterminated subpattern", "("),
    ("SELECT text MATCHING '[ab]+' WHERE text NOT MATCHING 'a{5,2}'", "min repeat greater than max repeat", "5"),
    ("SELECT :who AS w, text MATCHING 'a'", "parameter :who has no value", ":who"),
    ("SELECT text MATCHING 'a|b' WHERE text = :what", "parameter :what has no value", ":what"),
])
def test_errors_in_the_query_s_text_come_before_its_model_loads(sql, says, under):
    """A regex's syntax and a parameter without a value are the query's own errors, said with a
    caret before the model loads (seconds for a built-in model: they were said after it, and a
    parameter in the columns only at the first row)."""
    with relmql.connect(model="tiny-gpt2") as con:
        with pytest.raises(relmql.Error, match=re.escape(says)) as info:
            con.sql(sql).fetchall()
        assert con.models.names() == []  # no model loaded
        e = info.value
        assert e.source == sql and e.span is not None and sql[e.span[0]:e.span[1]].startswith(under), e.render()
        if ":" in under:  # EXPLAIN shows the plan of a query whose parameters are bound when it runs
            assert con.sql("EXPLAIN " + sql).fetchall() and con.models.names() == ["tiny-gpt2"]
