"""The Ray engine (relmql.cluster) on a local Ray instance of 2 CPUs, against in-process runs of
the same statements: same rows, same order, same values; a killed worker loses no row."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import ray
import torch

import relmql
from relmql.cli import main, run_script
from relmql.cluster import Cluster, cpu_share
from relmql.cluster.worker import Worker
from relmql.errors import Error
from relmql.execute import Cancelled

ANIMALS = ["cat", "dog", "cow", "owl", "fox", "bee", "ant", "elk", "yak", "hen", "ram", "eel",
           "bat", "pig", "emu", "gnu", "doe", "koi", "asp", "cod", "jay", "ape", "boa", "tit"]


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray") / "animals.jsonl"
    path.write_text("".join(json.dumps({"animal": a, "n": i}) + "\n" for i, a in enumerate(ANIMALS)))
    return str(path)


@pytest.fixture(scope="module")
def local():
    # one torch thread, as each worker has: the thread count changes how float sums are split,
    # and with it the last bits of a probability (measured: about 1e-7 relative)
    threads = torch.get_num_threads()
    with relmql.connect(model="tiny-gpt2", threads=1) as con:
        yield con
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def remote(local_ray):
    with relmql.connect(model="tiny-gpt2", engine="ray", workers=2, threads=1) as con:
        yield con


def ranked(data, limit=3, rows=None):
    return (f"SELECT :row_number AS row, :animal AS animal, text, prob, tokens, rank "
            f"MATCHING 'The ' || :animal || ' [a-z]{{1,12}}' PREFIX 'The ' || :animal USING topk 50 LIMIT {limit} "
            f"FOR EACH ROW IN '{data}'" + (f" LIMIT {rows}" if rows else ""))


def both(local, remote, sql):
    return local.sql(sql).fetchall(), remote.sql(sql).fetchall()


def test_dataset_query_gives_the_in_process_rows_in_order(local, remote, data):
    want, got = both(local, remote, ranked(data))
    assert len(want) == 3 * len(ANIMALS)
    assert got == want  # texts, tokens and float probabilities all equal
    assert [r[0] for r in got] == sorted(r[0] for r in got)


def test_seeded_samples_and_aggregates_match(local, remote, data):
    sample = (f"SELECT :row_number AS row, text, weight MATCHING 'The ' || :animal || ' (sat|ran|ate)' "
              f"USING seed 7 SAMPLE 40 FOR EACH ROW IN '{data}' WHERE :n % 2 = 0")
    want, got = both(local, remote, sample)
    assert len(want) == 40 * len(ANIMALS) // 2 and got == want
    grouped = (f"SELECT group(1) AS verb, count(*) AS n, avg(prob) AS p "
               f"MATCHING 'The ' || :animal || ' (sat|ran|ate)' USING seed 3 SAMPLE 25 GROUP BY verb "
               f"FOR EACH ROW IN '{data}'")
    want, got = both(local, remote, grouped)
    assert sum(r[1] for r in got) == 25 * len(ANIMALS) and got == want


def test_rows_without_results_still_count(local, remote, data, capsys):
    # 'zz' never follows under top-k 5: each data row gives one row of NULLs, as in-process, and
    # one note says why, for all of them; a single query, its own
    sql = f"SELECT :animal AS animal, text MATCHING 'The ' || :animal || ' zz' USING topk 5 FOR EACH ROW IN '{data}'"
    notes = []
    for con in (local, remote):
        assert con.sql(sql).fetchall() == [(a, None) for a in ANIMALS]
        assert con.sql("SELECT text MATCHING 'The zz' USING topk 5").fetchall() == []
        stopped = con.sql("SELECT text MATCHING 'x([a-z]{200}|~{32})' PREFIX 'x' USING max_tokens 2, "
                          "max_nodes_per_row 300")
        assert stopped.fetchall() == []
        assert con.sql("SELECT text MATCHING 'x[a-z]{200}' PREFIX 'x' USING max_tokens 2").fetchall() == []
        notes.append("".join(line for line in capsys.readouterr().err.splitlines(True)
                             if not line.startswith("ray: ")))  # the workers starting, the first time
    assert notes[0] == notes[1] == (
        f"note: {len(ANIMALS)} of {len(ANIMALS)} data rows have no rows: topk 5 kept none of the tokens MATCHING "
        "allows next where the search needed one (raise or drop it, or put the text's beginning in PREFIX)\n"
        "note: no rows: topk 5 kept none of the tokens MATCHING allows next where the search needed one (raise "
        "or drop it, or put the text's beginning in PREFIX: the rules apply to the completion only)\n"
        "note: no rows before the search stopped, and perhaps none within the bounds: the completions reached "
        "max_tokens (2 tokens) where MATCHING goes on (raise it)\n"
        "warning: the search stopped after expanding 300 nodes without finding another row (max_nodes_per_row) "
        "with 0 rows; more may exist (raise max_nodes_per_row to search further)\n"
        "note: no rows: each string of MATCHING takes at least 7 tokens after PREFIX, and max_tokens is 2 "
        "(raise it)\n")


def test_single_query_runs_on_a_worker(local, remote):
    sql = "SELECT text, prob MATCHING 'The [a-z]{1,10} [a-z]{1,8}' PREFIX 'The' USING topk 40 LIMIT 300"
    want, got = both(local, remote, sql)
    assert len(want) == 300 and got == want


def test_several_models_with_a_prompt_give_the_in_process_rows(local, remote, data):
    """FROM's models go to the workers (one model a worker where there is room); the prompt's text
    and logprob_under() come back with the rows, scored on the workers."""
    sql = ("SELECT model, text, logprob, prompt, logprob_under('tiny-gpt2') AS under FROM tiny-gpt2, smollm2-135m "
           "MATCHING ' (a|the|an|one)' PROMPT 'Once upon a time there was' LIMIT 3")
    want, got = both(local, remote, sql)
    assert [r[0] for r in want] == ["tiny-gpt2"] * 3 + ["smollm2-135m"] * 3
    assert got == want and all(r[3] == "Once upon a time there was" for r in got)
    rows = (f"SELECT model, :animal AS animal, text FROM tiny-gpt2, smollm2-135m MATCHING ' [a-z]{{1,8}}' "
            f"PROMPT 'The ' || :animal || ' is' USING topk 20 LIMIT 2 FOR EACH ROW IN '{data}' LIMIT 2")
    want, got = both(local, remote, rows)
    assert len(want) == 8 and got == want
    chat = ("SELECT text, prob, prompt FROM smollm2-135m MATCHING '(Paris|Rome)\\.?' "
            "PROMPT chat('user', 'What is the capital of France?') USING eos")
    want, got = both(local, remote, chat)
    assert len(want) == 4 and got == want and "<|im_start|>assistant\n" in got[0][2]


def test_user_errors_from_workers_render_as_in_process(local, remote, data):
    sql = f"SELECT text MATCHING 'The ' || :animal || ' [a-z]' FROM 'no/such/model' FOR EACH ROW IN '{data}'"
    rendered = []
    for con in (local, remote):
        with pytest.raises(Error) as e:
            con.sql(sql).fetchall()
        rendered.append(e.value.render())
    assert rendered[0] == rendered[1]
    assert "^" in rendered[1] and "no/such/model" in rendered[1]
    assert remote.sql("SELECT text MATCHING 'The cat' LIMIT 1").fetchall() == [("The cat",)]  # still usable
    # an error the sampler raises on a worker before its first draw (no string fits in max_tokens)
    rendered = []
    for con in (local, remote):
        with pytest.raises(Error) as e:
            con.sql("SELECT text MATCHING 'x[a-z]{200}' PREFIX 'x' USING max_tokens 2 SAMPLE 3").fetchall()
        rendered.append(e.value.render())
    assert rendered[0] == rendered[1] and "sampling cannot draw a string" in rendered[1]


def test_a_killed_worker_is_replaced_and_no_row_is_lost_or_repeated(local, remote, data):
    sql = ranked(data, limit=300)
    want = local.sql(sql).fetchall()
    pool = remote.cluster().pool
    replaced, retried, resumed = pool.replaced, pool.retried, pool.resumed
    rows = iter(remote.sql(sql))
    got = []

    def partial():
        with pool.lock:
            return {(c.actor, u) for c in pool.calls.values() for u in c.units
                    if 0 < c.job.units[u].received and not c.job.units[u].done}

    killed = False
    while not killed:  # read until a worker is part-way through a data row, then kill it
        got.append(next(rows))
        for actor, unit in sorted(partial())[:1]:
            # freeze it first and take in the pieces it sent before it stopped (the pool reads
            # them only when pumped): the row may have ended meanwhile, and only a row still
            # part-way through when it dies is resumed
            pid = pool.info()[actor]["pid"]
            os.kill(pid, signal.SIGSTOP)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                pool.pump(0.1)
            killed = (actor, unit) in partial()
            os.kill(pid, signal.SIGKILL if killed else signal.SIGCONT)
    got.extend(rows)
    assert pool.replaced == replaced + 1
    assert pool.retried > retried  # the dead worker's data rows ran again, on its replacement
    assert pool.resumed > resumed  # one of them had sent rows already: they were not sent twice
    assert len(got) == len(want) and got == want
    assert len({w["pid"] for w in pool.info()}) == 2  # the replacement is up


def test_a_retried_plan_skips_the_rows_already_received(local):
    # what a replacement worker sends for a plan whose first rows came from the dead one
    from relmql.plan import plan
    from relmql.syntax import parse
    text = "SELECT text MATCHING 'The [a-z]{1,10} [a-z]{1,8}' PREFIX 'The' USING topk 40 LIMIT 50"
    p = plan(parse(text)[0], text, local.settings)
    worker = Worker(threads=1)
    full = [r for piece in worker.run(1, [(p, 0)]) for r, _ in piece.rows]
    rest = [r for piece in worker.run(2, [(p, 17)]) for r, _ in piece.rows]
    assert len(full) == 50
    assert rest == full[17:]


def test_cancel_stops_a_running_query_and_the_workers_stay_usable(local, remote):
    result = remote.sql("SELECT text MATCHING '[a-z]{1,30}' USING topk 50 LIMIT 1000000")
    threading.Timer(1.0, result.cancel).start()
    with pytest.raises(Cancelled):
        for _ in result:
            pass
    # a row the workers had sent before the cancel is not read after it, as in process
    for con in (local, remote):
        r = con.sql("SELECT text MATCHING 'The [a-z]{1,8}' PREFIX 'The' LIMIT 500")
        first = r.fetchone()
        r.cancel()
        with pytest.raises(Cancelled, match="the query was cancelled"):
            r.fetchone()
        assert r.rows_so_far == [first]
    # two queries at once: one of them goes to the worker that ran the cancelled query, and
    # finishes only if that worker really stopped (a million rows would take many minutes)
    queries = [remote.sql(f"SELECT text MATCHING 'The {w}' LIMIT 1") for w in ("dog", "cat")]
    for q in queries:
        q.start()
    out = []
    reader = threading.Thread(target=lambda: out.extend(q.fetchall()[0][0] for q in queries), daemon=True)
    reader.start()
    reader.join(timeout=90)
    assert out == ["The dog", "The cat"]


def test_the_bar_shows_how_far_a_worker_s_search_has_gone(local, remote, monkeypatch):
    """While a worker searches for its next row it sends how many nodes it has expanded, as an
    in-process search shows them (a row can take minutes); and the rows it holds go out then,
    not with the next row: here rows 1 and 2 come at once and row 3 a while later."""
    from test_api import _on_terminal
    sql = "SELECT text MATCHING '(a|b|[q-z]{12})' USING batch_size 1, max_nodes_per_row 5000 LIMIT 3"
    monkeypatch.setattr(remote, "progress", True)
    err = _on_terminal(monkeypatch)
    rows = remote.sql(sql)
    first_two = rows.fetchmany(2)
    before = err.getvalue()
    rest = rows.fetchall()
    assert first_two + rest == local.sql(sql).fetchall()
    noting = re.compile(r"([\d,]+) nodes, ([\d,]+) of max_nodes_per_row 5,000 for row (\d)")
    assert not [n for n in noting.findall(before) if n[2] == "3"]  # row 2 was not held back until row 3
    after = [int(n.replace(",", "")) for n, _, row in noting.findall(err.getvalue()[len(before):]) if row == "3"]
    assert len(after) >= 2 and after == sorted(after)


class _Out(io.StringIO):
    """Output that notes how many jobs the pool had been given when the first row was written."""

    def __init__(self, pool):
        super().__init__()
        self.pool, self.jobs_at_first_write = pool, None

    def write(self, text):
        if self.jobs_at_first_write is None and self.pool is not None:
            self.jobs_at_first_write = self.pool.jobs
        return super().write(text)


def script_output(con, text, out=None):
    out, err = io.StringIO() if out is None else out, io.StringIO()
    code = run_script(con, text, "s.rql", {}, "jsonl", out, err)
    return code, out.getvalue(), err.getvalue()


def test_a_script_runs_its_queries_ahead_with_the_same_output(local, remote, data):
    draws = "SELECT text MATCHING 'The [a-z]{1,6}' PREFIX 'The' SAMPLE 4"
    script = (f"{ranked(data, 2, 6)};\n{draws};\nSET seed = 5;\n{draws};\n"
              "SELECT text MATCHING 'The [a-z]{1,6}' PREFIX 'The' LIMIT 5;\n")
    pool = remote.cluster().pool
    before = pool.jobs
    out = _Out(pool)
    try:
        want, got = script_output(local, script), script_output(remote, script, out)
    finally:
        for con in (local, remote):
            con.set("seed", 0)
    assert want[0] == got[0] == 0
    assert got[1] == want[1]
    lines = want[1].splitlines()
    assert len(lines) == 12 + 4 + 4 + 5
    assert lines[12:16] != lines[16:20]  # the query after SET seed was planned with it
    assert out.jobs_at_first_write - before == 2  # the first query and the one after it, not past the SET
    assert pool.jobs - before == 4


@pytest.fixture(scope="module")
def bad_rows(tmp_path_factory):
    path = tmp_path_factory.mktemp("ray") / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        {"animal": "cat", "k": 50}, {"animal": "dog", "k": 50}, {"animal": "(cow", "k": "many"},
        {"animal": "owl", "k": 50})))
    return str(path)


@pytest.mark.parametrize("what", ["a regex that does not compile", "an option that does not plan"])
def test_a_script_error_comes_after_the_rows_before_it(local, remote, bad_rows, what):
    # data row 3 fails: in the worker (its regex) or in the driver (its USING value); rows 1-2
    # are written first, as in-process, and the query started ahead of the failure never shows
    using = "" if what.startswith("a regex") else "USING topk :k"
    matching = "'The ' || :animal" if what.startswith("a regex") else "'The ' || replace(:animal, '(', '')"
    script = (f"SELECT :animal AS animal, text MATCHING {matching} {using} FOR EACH ROW IN '{bad_rows}';\n"
              "SELECT text MATCHING 'The dog' LIMIT 1;\n")
    want, got = script_output(local, script), script_output(remote, script)
    assert got == want
    assert got[0] == 1 and [json.loads(x)["animal"] for x in got[1].splitlines()] == ["cat", "dog"]
    assert "s.rql:1:" in got[2] and "^" in got[2]


def test_probability_over_many_pieces_counts_each_measurement_once(local, remote):
    # 600 draws come back in several pieces; they are one measurement, as in-process
    sql = ("SELECT probability() AS p, ci_low(probability()) AS lo, count(*) AS n "
           "MATCHING 'The [a-z]{1,6}' PREFIX 'The' USING seed 3 SAMPLE 600")
    want, got = both(local, remote, sql)
    assert got == want and want[0][2] == 600


def test_the_engine_is_a_session_option(remote):
    with pytest.raises(Error, match="cannot be set per query"):
        remote.sql("SELECT text MATCHING 'a' USING engine 'local'")
    shown = dict((r[0], r[1]) for r in remote.sql("SHOW OPTIONS").fetchall())
    assert shown["engine"] == "ray" and shown["workers"] == 2


def test_without_ray_the_engine_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if it were not installed
    with pytest.raises(Error) as e:
        relmql.connect(model="tiny-gpt2", engine="ray")
    assert "pip install 'relmql[ray]'" in e.value.render()
    assert main(["--model", "tiny-gpt2", "--engine", "ray", "-c", "SELECT text MATCHING 'a';"]) == 1
    err = capsys.readouterr().err
    assert "needs Ray" in err and "relmql[ray]" in err and "Traceback" not in err
    assert main(["--model", "tiny-gpt2", "-c", "SET engine = 'ray';"]) == 1
    err = capsys.readouterr().err
    assert "needs Ray" in err and "^" in err


def test_ray_started_from_a_statement_thread_outlives_it():
    # the shell runs each statement in a thread of its own: a local Ray instance that the first
    # query starts there must still serve the next query, from another thread
    code = """
import threading, relmql
con = relmql.connect(model="tiny-gpt2", engine="ray", workers=2)
out = []
for sql in ("SELECT text MATCHING 'a(b|c)'", "SELECT text MATCHING 'The (cat|dog)'"):
    t = threading.Thread(target=lambda: out.append(sorted(con.sql(sql).fetchall())))
    t.start(); t.join()
print(out)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[[('ab',), ('ac',)], [('The cat',), ('The dog',)]]"


def test_one_worker_per_gpu():
    # a Ray instance told it has 2 GPUs: with device auto, one worker per GPU, each given its own
    # (device auto resolves to the CPU on this machine, so the model still runs)
    code = """
import ray, relmql
ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="ERROR")
con = relmql.connect(model="tiny-gpt2", engine="ray", device="auto")
rows = con.sql("SELECT text MATCHING 'a(b|c)'").fetchall()
print(con.cluster().where)
print(sorted(w["gpus"] for w in con.cluster().pool.info()), sorted(rows))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    where, workers = done.stdout.strip().splitlines()
    assert where.startswith("2 workers (1 GPU each)")
    assert workers == "['0', '1'] [('ab',), ('ac',)]"


def test_cpu_shares_fit_the_nodes():
    assert cpu_share([2], 2) == 1 and cpu_share([2], 1) == 2
    assert cpu_share([8, 8], 1) == 8  # one worker cannot use two nodes' CPUs
    assert cpu_share([8, 8], 4) == 4 and cpu_share([16, 4], 5) == 4
    assert cpu_share([3, 3], 5) == 1  # 1.5 each would fit only 4
    assert cpu_share([2], 4) == 0.5  # more workers than CPUs share them


def test_more_cpu_workers_than_cpus_are_refused(local_ray):
    # each worker loads a model of its own: 1,000 on 2 CPUs would exhaust memory, not run faster
    with pytest.raises(Error, match="workers = 3 on CPUs: the Ray cluster has 2 CPUs") as info:
        Cluster("", workers=3)
    assert "one worker per CPU" in info.value.hint
    assert ray.is_initialized()  # the test's instance, not the refused cluster's, stays


def test_ray_client_addresses_are_refused_with_a_reason():
    with pytest.raises(Error, match="cannot stream rows"):
        Cluster("ray://head:10001")


def test_results_of_stopped_workers_fail_cleanly(remote):
    # (last: it stops the module's workers; a later query would start new ones)
    result = remote.sql("SELECT text MATCHING '[a-z]{1,30}' USING topk 50 LIMIT 1000000")
    rows = iter(result)
    next(rows)
    remote.close()
    with pytest.raises(Error, match="stopped before it finished"):
        for _ in rows:
            pass
