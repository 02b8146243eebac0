"""memory.Lru against a plain list model of least-recently-used eviction, over random operations."""

import random

from relmql.memory import Lru


def _model_shrink(entries, budget, keep):
    evicted = []
    while sum(s for _, _, s in entries) > budget and len(entries) > keep:
        k, v, _ = entries.pop(0)
        evicted.append((k, v))
    return evicted


def test_lru_matches_a_list_model():
    rng = random.Random(7)
    for keep in (0, 1, 2):
        lru, entries = Lru(budget=20, keep=keep), []  # entries: oldest first, (key, value, size)
        for step in range(3000):
            key, op = rng.randrange(12), rng.random()
            if op < 0.5:
                size, value = rng.randrange(0, 9), step
                entries = [e for e in entries if e[0] != key] + [(key, value, size)]
                assert lru.put(key, value, size) == _model_shrink(entries, 20, keep)
            elif op < 0.8:
                hit = [e for e in entries if e[0] == key]
                assert lru.get(key, "none") == (hit[0][1] if hit else "none")
                if hit:
                    entries = [e for e in entries if e[0] != key] + hit
            elif op < 0.9:
                hit = [e for e in entries if e[0] == key]
                assert lru.pop(key, "none") == (hit[0][1] if hit else "none")
                entries = [e for e in entries if e[0] != key]
            else:
                assert lru.shrink(10) == _model_shrink(entries, 10, keep)
            assert list(lru.items) == [k for k, _, _ in entries]
            assert lru.total == sum(s for _, _, s in entries) and len(lru) == len(entries)
            assert all((k in lru) for k, _, _ in entries) and lru.peek(99) is None
