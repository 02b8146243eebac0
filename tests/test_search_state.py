"""The searches' state, read between rows: a best-first search's queue, stored children and
statistics agree with what it released, and a bound stops it with its ``Stop``; a sampler's
walkers, pending rows and cached states agree with what it drew. Real models and automata."""

from __future__ import annotations

import pytest

from relmql.automata import compile
from relmql.execute import Decoding, Sample, SampleStats, SearchStats, ShortestPath, Stop, sample, shortest_path
from relmql.execute.sampling import Sampler
from relmql.execute.frontier import CHILD, RESULT
from relmql.execute.shortest import ShortestPathSearch

PEOPLE = "The (man|woman|cat|dog) (ran|sat|is|was) (here|there|now)"


def check_queue(search: ShortestPathSearch, released: list) -> None:
    """What must hold whenever the search releases a row."""
    assert not search.batch  # a row is released only once every cheaper node is expanded
    parents = [node for _, _, _, kind, node, _ in search.queue if kind == CHILD]
    assert len({id(n) for n in parents}) == len(parents)  # one queued child per node that stores children
    assert all(n.kids is not None for n in parents)
    # stored children are views of one array per model call, counted while a node holds a view
    arrays = {id(a): a for a in (n.kids if n.kids.base is None else n.kids.base for n in parents)}
    assert search.kid_bytes == sum(a.nbytes for a in arrays.values()) >= sum(n.kids.nbytes for n in parents)
    # a row is counted as it goes out (its reader may take it back from stats: a WHERE that drops it)
    assert search.found == search.stats.rows == len(released) == released[-1].rank
    assert search.stats.row_at == search.stats.expanded
    # nothing left in the queue is cheaper than the row just released
    last = released[-1]
    assert all((tier, val) >= (0, -last.total_logprob) for tier, val, *_ in search.queue)


def test_the_queue_and_stored_children_agree_with_the_rows_released(smol):
    ta = compile(PEOPLE, smol.vocabulary, "The (man|woman|cat|dog)")
    search = ShortestPathSearch(ta, smol, Decoding(), ShortestPath(order="total_prob", batch_size=3))
    before = smol.stats.tokens
    released = []
    for row in search.rows():
        released.append(row)
        check_queue(search, released)
        assert smol.stats.tokens - before == search.stats.expanded  # one token per expanded node
    assert len(released) == 4 * 4 * 3 == len({r.text for r in released})
    assert not search.queue and not search.batch and search.kid_bytes == 0  # the language is exhausted
    assert search.found == 48
    assert search.stats.stop is None
    # the class is what shortest_path drives: the same rows, the same statistics
    stats = SearchStats()
    assert list(shortest_path(ta, smol, Decoding(), ShortestPath(order="total_prob", batch_size=3),
                              stats=stats)) == released
    assert stats == search.stats


def test_results_wait_in_the_queue_until_they_are_certain(tiny):
    ta = compile(PEOPLE, tiny.vocabulary, "The (man|woman|cat|dog)")
    search = ShortestPathSearch(ta, tiny, Decoding(), ShortestPath(batch_size=2))
    rows = search.rows()
    first = next(rows)
    results = [((tier, val), node, edits) for tier, val, _, kind, node, edits in search.queue if kind == RESULT]
    # ORDER BY prob: every prefix was expanded before the first row, and each result waiting in the
    # queue is a string of the language that the search will release later, in key order
    assert search.stats.prefix >= 4 and first.rank == 1
    later = {r.tokens: r for r in rows}
    for key, node, edits in results:
        row = later[tuple(node.tokens())]
        assert key == (1, -row.logprob) and edits == row.edits == 0
    assert len(later) + 1 == search.found


@pytest.mark.parametrize("bound, value", [("max_nodes", 7), ("max_nodes_per_row", 5), ("max_memory", 40_000)])
def test_a_bound_stops_the_search_with_its_stop(tiny, bound, value):
    ta = compile("[a-c]{4}", tiny.vocabulary)  # tiny-gpt2 is nearly flat: rows come after many nodes
    full = list(shortest_path(ta, tiny, Decoding(), ShortestPath(batch_size=4, max_nodes_per_row=None)))
    assert len(full) == 3 ** 4
    search = ShortestPathSearch(ta, tiny, Decoding(), ShortestPath(batch_size=4, **{bound: value}))
    rows = list(search.rows())
    stats = search.stats
    assert stats.stop == Stop(bound, value, search.found) and stats.stopped
    assert [r.tokens for r in rows] == [r.tokens for r in full[:len(rows)]] and len(rows) < len(full)
    assert search.batch  # stopped before the model call that would have expanded it
    if bound == "max_nodes":
        assert stats.expanded >= value
    elif bound == "max_nodes_per_row":
        assert stats.expanded - stats.row_at >= value
    else:
        assert stats.held == search.held() > search.budget.traversal == value // 4


def test_the_sampler_releases_rows_in_order_and_caches_within_its_share(tiny, monkeypatch):
    from relmql.execute import sampling
    monkeypatch.setattr(sampling, "batch_limit",
                        lambda *a: 10 ** 9)  # a batch of 4 in 100 kB (test_bounds tests the cap)
    ta = compile(PEOPLE, tiny.vocabulary, "The (man|woman|cat|dog)")
    opts = Sample(12, seed=3, batch_size=4, max_memory=100_000)
    sampler = Sampler(ta, tiny, Decoding(), opts)
    assert sampler.cached_states == 4  # no room beyond the batch's own states
    got = []
    for row in sampler.rows():
        got.append(row)
        assert sampler.next_out == len(got) - 1 == row.rank - 1  # moves on when the next row is asked for
        assert all(i > sampler.next_out for i in sampler.done)  # later samples wait for their turn
        assert len(sampler.seen) <= 4 and len(sampler.prefixes) <= 4
        assert len(sampler.active) + len(sampler.waiting) <= 4 and sampler.started <= 12
    assert sampler.started == 12 and not sampler.done and sampler.stats.draws >= 12
    # the class is what sample drives: the same rows, the same statistics
    stats = SampleStats()
    assert list(sample(ta, tiny, Decoding(), opts, stats=stats)) == got
    assert stats == sampler.stats


def test_every_draw_of_the_sampler_is_counted(tiny):
    # with misses, each sample is exactly one draw: a hit or a miss
    ta = compile("The (man|woman) (ran|sat)", tiny.vocabulary, "The")
    sampler = Sampler(ta, tiny, Decoding(), Sample(16, seed=1, mode="exact", misses=True, first_match=True))
    rows = list(sampler.rows())
    assert sampler.stats.draws == 16 == len(rows)
    assert sampler.stats.discarded == sum(r.miss for r in rows) > 0
