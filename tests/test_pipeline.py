"""The pipelined search (a model call in flight while the host works) against the serial one."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from relmql.automata import CompileOptions, compile
from relmql.execute import Decoding, ShortestPath, shortest_path
from relmql.execute.pipeline import pipelined
from relmql.records import Cancelled

from benchmarks.executor_bench import StubModel

PHONE = "My phone number is ([0-9]{3}) ([0-9]{3}) ([0-9]{4})"


def rows(automaton, model, rules=Decoding(), **opts):
    return [(r.tokens, r.logprob, r.total_logprob, r.edits) for r in
            shortest_path(automaton, model, rules, ShortestPath(**opts))]


@pytest.fixture(scope="module")
def stub(gpt2_vocab):
    # each sequence's distribution depends on the sequence alone, so the two searches read the
    # same numbers whatever batches their calls make
    return StubModel(gpt2_vocab, latency=0.0)


@pytest.mark.parametrize("batch_size", [1, 3, 32, 256])
@pytest.mark.parametrize("tokenization", ["canonical", "all"])
def test_pipelined_rows_are_the_serial_rows_bit_for_bit(stub, batch_size, tokenization):
    ta = compile(PHONE, stub.vocabulary, "My phone number is", CompileOptions(tokenization=tokenization))
    for rules, order in ((Decoding(topk=5000), "prob"), (Decoding(), "total_prob")):
        serial = rows(ta, stub, rules, order=order, limit=60, batch_size=batch_size, pipeline=False)
        piped = rows(ta, stub, rules, order=order, limit=60, batch_size=batch_size, pipeline=True)
        assert len(serial) == 60 and piped == serial


def test_pipelined_rows_with_edits_and_a_growing_batch(stub):
    # every edit of the prefix: thousands of nodes between rows, calls growing past batch_size
    ta = compile("The man sat (here|there|down)", stub.vocabulary, "The man sat",
                 CompileOptions(edits=1, edit_scope="prefix"))
    for order in ("prob", "total_prob"):
        serial = rows(ta, stub, Decoding(topk=5000), order=order, limit=5, batch_size=4, max_batch_size=64,
                      pipeline=False)
        piped = rows(ta, stub, Decoding(topk=5000), order=order, limit=5, batch_size=4, max_batch_size=64,
                     pipeline=True)
        assert len(serial) == 5 and piped == serial


def test_a_node_budget_keeps_the_rows_exact(stub):
    # the pipelined search picks a batch before the last one's children are in: under a node
    # budget it may expand other nodes and find fewer or more rows, each the serial search's
    ta = compile(PHONE, stub.vocabulary, "My phone number is")
    full = rows(ta, stub, Decoding(topk=5000), limit=200, batch_size=32, pipeline=False)
    for nodes in (100, 400, 1500):
        piped = rows(ta, stub, Decoding(topk=5000), batch_size=32, max_nodes=nodes, pipeline=True)
        assert piped == full[:len(piped)]


@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_pipelined_rows_on_a_real_model(tiny, batch_size):
    # a real model's numbers depend on how a call's sequences are batched within float32's
    # rounding, as between batch sizes
    ta = compile("The (man|woman) (ran|sat|is|was) (here|there|now)", tiny.vocabulary, "The (man|woman)")
    serial = rows(ta, tiny, batch_size=batch_size, pipeline=False)
    piped = rows(ta, tiny, batch_size=batch_size, pipeline=True)
    assert len(serial) == 24 and [r[0] for r in piped] == [r[0] for r in serial]
    assert np.allclose([r[1] for r in piped], [r[1] for r in serial], atol=1e-5)


@pytest.mark.parametrize("batch_size", [1, 4, 32])
def test_a_row_waits_for_the_call_in_flight(smol, batch_size):
    # "Paris" is read with one token and "the city of Paris" with near-certain ones after "the":
    # a row released while the call that reads "the city" is in flight would come too early
    pattern = "The capital of France is (Paris|Lyon|Marseille|Nice|a city|the city of Paris)"
    ta = compile(pattern, smol.vocabulary, "The capital of France is")
    for rules in (Decoding(), Decoding(topk=40)):
        serial = rows(ta, smol, rules, batch_size=batch_size, pipeline=False)
        piped = rows(ta, smol, rules, batch_size=batch_size, pipeline=True)
        assert len(serial) >= 4 and [r[0] for r in piped] == [r[0] for r in serial]
        assert np.allclose([r[1] for r in piped], [r[1] for r in serial], atol=1e-5)


def test_a_cancelled_pipelined_search_stops_and_ends_its_thread(stub):
    ta = compile(PHONE, stub.vocabulary, "My phone number is")
    cancel = threading.Event()
    before = {t.name for t in threading.enumerate()}
    search = shortest_path(ta, stub, Decoding(topk=5000), ShortestPath(batch_size=8, pipeline=True), cancel)
    next(search)
    cancel.set()
    with pytest.raises(Cancelled):
        list(search)
    assert not {t.name for t in threading.enumerate()} - before


def test_a_search_closed_early_ends_its_thread(stub):
    ta = compile(PHONE, stub.vocabulary, "My phone number is")
    before = {t.name for t in threading.enumerate()}
    search = shortest_path(ta, stub, Decoding(topk=5000), ShortestPath(batch_size=8, pipeline=True))
    next(search)
    search.close()
    assert not {t.name for t in threading.enumerate()} - before


def test_a_model_error_in_flight_reaches_the_reader(stub, monkeypatch):
    ta = compile(PHONE, stub.vocabulary, "My phone number is")
    calls = []

    def failing(states, tokens):
        calls.append(len(states))
        if len(calls) == 3:
            raise RuntimeError("CUDA error: device-side assert triggered")
        return StubModel.extend(stub, states, tokens)
    monkeypatch.setattr(stub, "extend", failing)
    with pytest.raises(RuntimeError, match="device-side assert"):
        list(shortest_path(ta, stub, Decoding(topk=5000), ShortestPath(batch_size=8, pipeline=True)))


def test_the_default_is_off_on_a_cpu_and_on_elsewhere(stub):
    class OnGPU:
        device = "cuda:0"
    assert not pipelined(ShortestPath(), stub) and pipelined(ShortestPath(), OnGPU())
    assert pipelined(ShortestPath(pipeline=True), stub) and not pipelined(ShortestPath(pipeline=False), OnGPU())


def test_using_pipeline_reaches_the_search_and_explain(con):
    plan = con.execute("EXPLAIN SELECT text MATCHING 'The (cat|dog)' USING pipeline true").fetchall()
    text = "\n".join(str(r) for r in plan)
    assert "the next batch is picked while a model call is in flight (pipeline on)" in text
    got = con.execute("SELECT text, prob MATCHING 'The (cat|dog) (sat|ran)' USING pipeline true").fetchall()
    want = con.execute("SELECT text, prob MATCHING 'The (cat|dog) (sat|ran)' USING pipeline false").fetchall()
    assert [r[0] for r in got] == [r[0] for r in want] and len(got) == 4
    assert np.allclose([r[1] for r in got], [r[1] for r in want], rtol=1e-5)
