"""Patterns that once ran for minutes or took gigabytes: each must end, in a process limited to
about 2.5 GB, with its automaton or with one clear error."""

from __future__ import annotations

import json
import random
import resource
import subprocess
import sys
import textwrap

import pytest

MEMORY = 2_500 * 2 ** 20
HANG_GUARD = 300  # seconds; not a timing assertion, only so that a hang fails instead of blocking CI

SCRIPT = textwrap.dedent("""
    import json, sys
    from relmql.automata.language import LanguageSpec, compile_language
    from relmql.errors import Error

    out = []
    for kind, arg, max_states in json.loads(sys.argv[1]):
        pattern = {"words": lambda n: "|".join(f"w{i}x{i * 7919 % 100003}" for i in range(n)),
                   "pattern": lambda p: p}[kind](arg)
        try:
            lang = compile_language(LanguageSpec(pattern, max_states=max_states))
        except Error as e:
            out.append({"error": e.message, "hint": e.hint, "span": e.span, "length": len(pattern)})
            continue
        samples = [] if kind != "words" else ["w0x0", f"w{arg - 1}x{(arg - 1) * 7919 % 100003}", "w0x1", "w"]
        out.append({"strings": lang.num_strings, "states": lang.dfa.num_states,
                    "accepts": [bool(lang.dfa.accepts(s, 0)) for s in samples]})
    print(json.dumps(out))
""")


def _limit():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def compile_in_child(*cases):
    """Compile ``(kind, argument, max_states)`` cases in a memory-limited child process."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(cases)], capture_output=True, text=True,
                          timeout=HANG_GUARD, preexec_fn=_limit)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_a_million_words_are_refused_before_parsing():
    (got,) = compile_in_child(("words", 1_000_000, 100_000))
    assert got["error"].startswith("this pattern needs an automaton of at least 12,777,")
    assert "more than the limit of 100,000" in got["error"] and "max_states" in got["hint"]
    assert got["span"] == [0, got["length"]]


def test_a_large_word_list_compiles_under_a_raised_limit():
    refused, (compiled) = compile_in_child(("words", 20_000, 100_000), ("words", 20_000, 300_000))
    assert "more than the limit of 100,000" in refused["error"]
    assert compiled["strings"] == 20_000
    assert compiled["accepts"] == [True, True, False, False]


REPETITIONS = [
    ("X?(R||){3335}", 2 * 3336),
    ("(?:a|b?){400}", 2 ** 401 - 1),
    ("(a|ab){0,500}", None),
    ("((ab)?c?){300}", None),
    ("(?:a?b?){500}", None),
    ("(?:a{2,3}){0,10000}", 30_000),
    (r"(\w+\s?){0,100}", "infinite"),
    ("a?b?" * 2000, None),  # written out: folded into a repetition
]


def test_repetitions_of_overlapping_items_compile():
    results = compile_in_child(*[("pattern", p, 100_000) for p, _ in REPETITIONS])
    for (pattern, count), got in zip(REPETITIONS, results):
        assert "error" not in got, (pattern, got)
        if count == "infinite":
            assert got["strings"] is None
        elif count is not None:
            assert got["strings"] == count, pattern
        assert got["states"] <= 100_000


_rng = random.Random(0)
ROW = "x" + "".join(_rng.choice(["a?", "b?", "c?"]) for _ in range(6000))  # no block repeats throughout

COSTLY = [
    ("(a|aa){20000}", "too costly to build"),  # exact counts of an ambiguous item
    ("(a*b|a){0,3000}", "too costly to build"),
    (ROW, "optional items in a row"),
    ("(ab|cd){60000}", "more than the limit of 100,000"),
]


def test_costly_patterns_end_with_one_clear_error():
    results = compile_in_child(*[("pattern", p, 100_000) for p, _ in COSTLY])
    for (pattern, message), got in zip(COSTLY, results):
        assert message in got.get("error", ""), (pattern[:40], got)
        assert got["span"] is not None and got["span"][1] <= got["length"]
        assert "max_states" in got["hint"]


def test_many_edits_are_refused_in_proportion_to_their_cost():
    """The strings within j edits are built within max_states / j states: a subset-construction
    state costs more as j grows (within 7 edits of "The cat sat": 24 s for 36,000 states, and 8
    edits ran for minutes under the plain bound). Under max_states 2,000, 4 edits need 1,949
    states, more than 2,000 / 4; 3 edits need 601, within 2,000 / 3."""
    from relmql.automata.language import LanguageSpec, compile_language
    from relmql.errors import CompileError
    assert compile_language(LanguageSpec("The cat sat", edits=3, max_states=2000)).num_strings > 10 ** 9
    with pytest.raises(CompileError, match=r"64 edits make too large an automaton: the strings within 4 edits of the "
                                           r"query need more than 500 states \(max_states / 4\)") as info:
        compile_language(LanguageSpec("The cat sat", edits=64, max_states=2000))
    assert "max_states" in info.value.hint


# -- a large determinization runs apart, where a cancel can stop it

def _last_but(n: int, alphabet: str = "ab"):
    """An acceptor of the strings whose n-th symbol from the end is 'a' (as nondeterministic as
    acceptors come: its deterministic automaton has 2^(n+1) states)."""
    import pynini
    sigma = pynini.union(*alphabet)
    fst = pynini.closure(sigma) + "a"
    for _ in range(n):
        fst = fst + sigma
    return fst.rmepsilon().connect()


def test_a_determinization_done_apart_is_the_one_done_here(monkeypatch):
    """``determinized`` in a child process (past IN_PROCESS_STATES) gives the automaton OpenFST
    gives in this process, state for state, and the same over-limit answer."""
    import pynini
    from relmql.automata import primitives

    def arcs(fst):  # the automaton state for state, arc for arc
        return fst.start(), [(str(fst.final(s)), [(a.ilabel, a.nextstate) for a in fst.arcs(s)]) for s in fst.states()]

    fsts = [_last_but(8), _last_but(3, "abc"), pynini.union(_last_but(2), _last_but(5) + "q").rmepsilon()]
    here = [pynini.determinize(f, nstate=100_001).minimize() for f in fsts]  # as optimize does it here
    apart = []
    real = primitives._determinized_apart
    monkeypatch.setattr(primitives, "IN_PROCESS_STATES", 3)
    monkeypatch.setattr(primitives, "_determinized_apart", lambda f, n: apart.append(real(f, n)) or apart[-1])
    for fst, want in zip(fsts, here):
        got = primitives.determinized(fst, 100_000)
        assert arcs(got) == arcs(want) and pynini.equivalent(got, pynini.determinize(fst))
        assert primitives.determinized(fst, 6).num_states() == 7  # over the limit: its first limit + 1 states
    assert len(apart) == 2 * len(fsts) and all(a is not None for a in apart)  # each done by a child


def _spied(monkeypatch):
    """The child processes ``_determinized_apart`` starts, as it starts them."""
    from relmql.automata import primitives
    children = []
    spawn = primitives._spawn
    monkeypatch.setattr(primitives, "_spawn", lambda args: children.append(spawn(args)) or children[-1])
    return children


def test_a_cancel_kills_a_long_determinization(monkeypatch):
    """A 2,097,152-state determinization takes minutes: a cancel a second in ends it with
    Cancelled, and its child process with it (OpenFST holds the GIL and has no cancel point)."""
    import threading

    from relmql.automata import primitives
    from relmql.records import Cancelled, cancelling
    children = _spied(monkeypatch)
    stop = threading.Event()
    timer = threading.Timer(1.0, stop.set)
    timer.start()
    try:
        with cancelling(stop), pytest.raises(Cancelled, match="cancelled"):
            primitives.optimize(_last_but(20), 3_000_000)
    finally:
        timer.cancel()
    assert len(children) == 1 and children[0].returncode is not None  # killed, and waited for


def test_a_child_killed_by_a_signal_is_an_error_not_a_redo_here(monkeypatch):
    """A child the kernel kills (out of memory, most likely) is not redone in this process, where
    the same work could take the session down and nothing could stop it."""
    import signal
    import threading

    from relmql.automata import primitives
    from relmql.errors import CompileError
    children = _spied(monkeypatch)
    done = threading.Event()

    def kill():  # half a second after the child starts (on a busy machine it can take longer)
        while not children and not done.wait(0.05):
            pass
        if not done.wait(0.5):
            children[0].send_signal(signal.SIGKILL)
    killer = threading.Thread(target=kill)
    killer.start()
    try:
        with pytest.raises(CompileError, match="stopped by signal 9"):
            primitives.optimize(_last_but(20), 3_000_000)
    finally:
        done.set()
        killer.join()
    assert len(children) == 1


def test_a_determinization_apart_stays_within_max_memory(monkeypatch):
    """A query that raises max_states far past what its memory holds (.*a.{20} has millions of
    states deterministic): the child determinizing it may grow by max_memory at most, and the
    compile is then one error that names max_memory, under MATCHING, not gigabytes; a
    determinization that fits is done apart under the same bound as here."""
    import signal

    import relmql
    from relmql.automata import memory_bound, primitives
    children = _spied(monkeypatch)
    con = relmql.connect(model="tiny-gpt2")
    query = "SELECT text MATCHING '.*a.{20}' USING max_states 100000000, max_memory '64MiB' LIMIT 1"
    with pytest.raises(relmql.Error) as got:
        con.sql(query).fetchall()
    e = got.value
    assert e.kind == "compile error" and "more memory than max_memory (64 MiB)" in e.message
    assert "raise max_memory" in e.hint and e.span == (query.index("'.*"), query.index(" USING"))
    assert len(children) == 1 and children[0].returncode == -signal.SIGABRT  # OpenFST's allocation failed
    monkeypatch.setattr(primitives, "IN_PROCESS_STATES", 3)
    with memory_bound(64 * 2 ** 20):
        got = primitives.determinized(_last_but(8), 100_000)
    assert len(children) == 2 and children[1].returncode == 0 and got.num_states() == 2 ** 9
