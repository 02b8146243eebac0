"""pynini (OpenFST) primitives over byte labels: small acceptors, set operations, optimization
within a size limit, and OpenFST's binary format as numpy arrays.

Labels: OpenFST reserves 0 for epsilon, so byte ``b`` is label ``b + 1``; ``SPLIT`` (257) marks
the boundary between the prefix and the completion; labels from ``TAG`` up carry the edit count
of a final state until it is moved into ``ByteDFA.final``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import signal
import struct
import subprocess
import sys
import tempfile
from typing import Iterator, Optional, Tuple

import numpy as np
import pynini

from ..errors import CompileError
from ..memory import format_size
from ..records import checkpoint
from .charset import CodepointSet, utf8_sequences

EPS = 0
SPLIT = 257
TAG = 300
NBYTES = 256

ONE = pynini.Weight.one("tropical")
SUBSET_BUDGET = 100  # subset-construction elements per allowed state, in repetitions
IN_PROCESS_STATES = 20_000  # a larger determinization is redone in a child process (``determinized``)
_MEMORY: contextvars.ContextVar[Optional[int]] = contextvars.ContextVar("relmql_compile_memory", default=None)


@contextlib.contextmanager
def memory_bound(nbytes: Optional[int]) -> Iterator[None]:
    """Within this block, a determinization done in a child process may take at most ``nbytes``
    of memory beyond what the child starts with (a query's ``max_memory``); past it the child
    fails and the compile is a ``CompileError`` that names the bound. None: no bound."""
    token = _MEMORY.set(nbytes)
    try:
        yield
    finally:
        _MEMORY.reset(token)


def lab(byte: int) -> int:
    """The label of ``byte``."""
    return byte + 1


# ---------------------------------------------------------------- small builders


def new_fst(nstates: int = 1) -> pynini.Fst:
    """An acceptor with ``nstates`` states, no arcs and start state 0."""
    f = pynini.Fst()
    f.add_states(nstates)
    f.set_start(0)
    return f


def epsilon_fst() -> pynini.Fst:
    """The empty string."""
    f = new_fst()
    f.set_final(0)
    return f


def empty_fst() -> pynini.Fst:
    """No string."""
    return new_fst()


def bytes_fst(data: bytes) -> pynini.Fst:
    """The one string ``data``."""
    f = new_fst(len(data) + 1)
    for k, b in enumerate(data):
        f.add_arc(k, pynini.Arc(lab(b), lab(b), ONE, k + 1))
    f.set_final(len(data))
    return f


def concat_all(parts) -> pynini.Fst:
    """The concatenation of ``parts``, joined pairwise so that long sequences stay fast."""
    parts = list(parts) or [epsilon_fst()]
    while len(parts) > 1:
        parts = [parts[i].concat(parts[i + 1]) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def sigma_star() -> pynini.Fst:
    """Every byte string (no SPLIT)."""
    f = new_fst()
    for b in range(NBYTES):
        f.add_arc(0, pynini.Arc(lab(b), lab(b), ONE, 0))
    f.set_final(0)
    return f


@functools.lru_cache(maxsize=256)
def ranges_fst(ranges: Tuple[Tuple[int, int], ...]) -> pynini.Fst:
    """One character of the code point ``ranges`` as its UTF-8 bytes, optimized. Cached and
    shared: copy it before changing it."""
    f = new_fst(2)
    f.set_final(1)
    for lo, hi in ranges:
        for seq in utf8_sequences(lo, hi):
            state = 0
            for k, (blo, bhi) in enumerate(seq):
                nxt = 1 if k == len(seq) - 1 else f.add_state()
                for b in range(blo, bhi + 1):
                    f.add_arc(state, pynini.Arc(lab(b), lab(b), ONE, nxt))
                state = nxt
    return f.optimize()


def chars_fst(chars: CodepointSet) -> pynini.Fst:
    """One character of ``chars`` as its UTF-8 bytes."""
    return ranges_fst(chars.ranges).copy()


def is_final(fst: pynini.Fst, state: int) -> bool:
    """Whether ``state`` is final."""
    return fst.final(state) != pynini.Weight.zero("tropical")


# ---------------------------------------------------------------- operations


def intersect(a: pynini.Fst, b: pynini.Fst) -> pynini.Fst:
    """The strings of both acceptors."""
    return pynini.intersect(a.copy().arcsort("olabel"), b.copy().arcsort("ilabel"))


def difference(a: pynini.Fst, b: pynini.Fst) -> pynini.Fst:
    """The strings of ``a`` that ``b`` lacks (``b`` deterministic)."""
    return pynini.difference(a.copy().arcsort("olabel"), b.copy().arcsort("ilabel"))


def apply(fst: pynini.Fst, transducer: pynini.Fst) -> pynini.Fst:
    """The output language of ``transducer`` on the strings of ``fst``."""
    fst = fst.copy().arcsort("olabel")
    out = pynini.compose(fst, transducer.copy().arcsort("ilabel"))
    return out.project("output")


def optimize(fst: pynini.Fst, max_states: int, span=None, source: Optional[str] = None,
             minimal: bool = False, copies: int = 0) -> pynini.Fst:
    """Remove epsilons, determinize and minimize an unweighted acceptor, within ``max_states``
    (``minimal``: the caller knows that a deterministic result is minimal already; ``copies``:
    the acceptor chains that many copies of one item, and a state of the subset construction
    holds about one state per copy, so its memory is bounded to ``SUBSET_BUDGET * max_states``)."""
    checkpoint()
    fst = fst.rmepsilon().connect()
    if fst.properties(pynini.I_DETERMINISTIC, True) == pynini.I_DETERMINISTIC:
        if fst.num_states() > max_states:  # e.g. bounded repetitions of a character class
            raise _over(max_states, span, source)
        return fst if minimal else fst.minimize()
    affordable = SUBSET_BUDGET * max_states // copies if copies else max_states
    det = determinized(fst, min(max_states, affordable))
    if affordable < max_states and det.num_states() > affordable:
        raise CompileError("this repetition is too costly to build (a string can be split into its "
                           "copies in too many ways)", span, source,
                           hint="lower the repetition counts, or raise the limit (max_states)")
    if det.num_states() > max_states:
        raise _over(max_states, span, source)
    return det


# In a child process: the acceptor in argv[1] determinized (at most argv[3] + 1 states) and, within
# argv[3] states, minimized, written to argv[2]. Only pynini is imported (it starts in ~0.1 s); on
# Linux the child dies with its parent (argv[4]), whatever kills the parent. With argv[5] > 0 its
# address space may grow by that many bytes at most: OpenFST's failed allocation then aborts it.
_CHILD = """import os, signal, sys
try:
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
except Exception:
    pass
if os.getppid() != int(sys.argv[4]):
    sys.exit(3)
import pynini
fst, limit, grow = pynini.Fst.read(sys.argv[1]), int(sys.argv[3]), int(sys.argv[5])
if grow > 0:
    import resource
    size = [int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmSize")]
    if size:
        resource.setrlimit(resource.RLIMIT_AS, (size[0] + grow, resource.RLIM_INFINITY))
det = pynini.determinize(fst, nstate=limit + 1)
(det if det.num_states() > limit else det.minimize()).write(sys.argv[2])
"""


def determinized(fst: pynini.Fst, limit: int) -> pynini.Fst:
    """``fst`` determinized and minimized, or where that has more than ``limit`` states, its first
    ``limit + 1`` unminimized. OpenFST holds the GIL and has no cancel point, and a large subset
    construction takes minutes, so one that outgrows ``IN_PROCESS_STATES`` here is redone in a
    child process, which a cancelled statement (``records.cancelling``) or Ctrl-C kills."""
    det = pynini.determinize(fst, nstate=min(limit, IN_PROCESS_STATES) + 1)
    if limit > IN_PROCESS_STATES and det.num_states() > IN_PROCESS_STATES:
        apart = _determinized_apart(fst, limit)
        if apart is not None:
            return apart
        checkpoint()  # no child could do it: here, where nothing can stop it, only if not cancelled
        det = pynini.determinize(fst, nstate=limit + 1)
    return det if det.num_states() > limit else det.minimize()


def _spawn(args) -> subprocess.Popen:
    """The child process of ``_determinized_apart``, in a session of its own: a Ctrl-C at the
    terminal reaches this process, which then kills the child, rather than the child alone."""
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _determinized_apart(fst: pynini.Fst, limit: int) -> Optional[pynini.Fst]:
    """``determinized`` in a child process, at a checkpoint every 50 ms while it runs; None where
    no child could do it (no interpreter, no room for its files, a failed start): the caller
    does it here. A child killed by a signal (the kernel's, out of memory) is a ``CompileError``:
    done here, the same work would take this process down."""
    if not sys.executable:
        return None
    with tempfile.TemporaryDirectory(prefix="relmql-") as tmp:
        src, dst = os.path.join(tmp, "in.fst"), os.path.join(tmp, "out.fst")
        child = None
        try:
            fst.write(src)
            bound = _MEMORY.get()
            child = _spawn([sys.executable, "-c", _CHILD, src, dst, str(limit), str(os.getpid()), str(bound or 0)])
            while True:
                try:
                    child.wait(timeout=0.05)
                    break
                except subprocess.TimeoutExpired:
                    checkpoint()
            if child.returncode == -signal.SIGABRT and bound:  # OpenFST's allocation failed at the bound
                raise CompileError(f"building the automaton needed more memory than max_memory "
                                   f"({format_size(bound)}) on the way to {limit:,} states",
                                   hint="simplify the pattern, lower the limit (max_states), or raise max_memory")
            if child.returncode < 0:
                raise CompileError(f"building the automaton was stopped by signal {-child.returncode} "
                                   f"(out of memory, most likely) on the way to {limit:,} states",
                                   hint="simplify the pattern, or lower the limit (max_states)")
            return pynini.Fst.read(dst) if child.returncode == 0 else None
        except OSError:
            return None
        finally:  # cancelled, Ctrl-C (KeyboardInterrupt in this thread) or an error: the child goes too
            if child is not None and child.returncode is None:
                child.kill()
                child.wait()


def _over(max_states: int, span, source) -> CompileError:
    return CompileError(f"the automaton has more than {max_states:,} states", span, source,
                        hint="simplify the pattern, or raise the limit (max_states)")


# ---------------------------------------------------------------- OpenFST's binary format as arrays


_FST_MAGIC = 2125659606


def fst_arrays(fst: pynini.Fst):
    """(start, final weight, src, ilabel, weight, dst) of an acceptor (a final weight of inf:
    not final), read from OpenFST's binary vector format (one vectorized pass; the text format
    is the fallback)."""
    data = fst.write_to_string()
    try:
        o = 0
        magic, = struct.unpack_from("<i", data, o)
        o += 4
        kinds = []
        for _ in range(2):
            n, = struct.unpack_from("<i", data, o)
            kinds.append(data[o + 4:o + 4 + n])
            o += 4 + n
        _, flags = struct.unpack_from("<ii", data, o)
        o += 8
        _, start, nstates, _ = struct.unpack_from("<Qqqq", data, o)
        o += 32
        if magic != _FST_MAGIC or kinds != [b"vector", b"standard"] or flags & 3:
            raise ValueError("unexpected FST format")
        final = np.empty(nstates, np.float32)
        offsets = np.empty(nstates, np.int64)
        counts = np.empty(nstates, np.int64)
        for st in range(nstates):
            final[st], n = struct.unpack_from("<fq", data, o)
            offsets[st], counts[st] = o + 12, n
            o += 12 + 16 * n
        # arc records (ilabel, olabel, weight, nextstate) all start at the same offset modulo 4
        shift = int(offsets[0]) % 4 if nstates else 0
        words = np.frombuffer(data, np.int32, count=(len(data) - shift) // 4, offset=shift)
        first = (np.repeat(offsets, counts) - shift) // 4
        first += 4 * (np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts))
        src = np.repeat(np.arange(nstates), counts)
        return (int(start), final, src, words[first].astype(np.int64), words[first + 2].view(np.float32),
                words[first + 3].astype(np.int64))
    except (struct.error, ValueError):  # pragma: no cover - a different OpenFST build
        return _fst_arrays_text(fst)


def _fst_arrays_text(fst: pynini.Fst):
    n = fst.num_states()
    final = np.array([float(fst.final(s)) for s in range(n)], np.float32)
    rows = [(s, a.ilabel, a.nextstate, float(a.weight)) for s in range(n) for a in fst.arcs(s)]
    arr = np.array(rows, np.float64).reshape(-1, 4)
    ints = arr[:, :3].astype(np.int64)
    return fst.start(), final, ints[:, 0], ints[:, 1], arr[:, 3].astype(np.float32), ints[:, 2]


def fst_from_arrays(nstates: int, start: int, final: np.ndarray, src: np.ndarray, ilabel: np.ndarray,
                    dst: np.ndarray) -> pynini.Fst:
    """An unweighted acceptor from its arrays, written in the binary format ``fst_arrays`` reads."""
    order = np.argsort(src, kind="stable")
    src, ilabel, dst = src[order], ilabel[order], dst[order]
    counts = np.bincount(src, minlength=nstates)
    before = np.cumsum(counts) - counts
    at = 3 * np.arange(nstates) + 4 * before  # each state: final weight, int64 number of arcs
    words = np.zeros(3 * nstates + 4 * len(src), np.int32)
    words[at] = np.where(final, 0, 0x7F800000)  # float32 0 and inf
    words[at + 1] = counts
    arc = np.repeat(at + 3, counts) + 4 * (np.arange(len(src)) - np.repeat(before, counts))
    words[arc] = words[arc + 1] = ilabel
    words[arc + 3] = dst
    kind = b"".join(struct.pack("<i", len(k)) + k for k in (b"vector", b"standard"))
    header = (struct.pack("<i", _FST_MAGIC) + kind + struct.pack("<ii", 2, 0)
              + struct.pack("<Qqqq", 3, start, nstates, len(src)))  # properties: expanded, mutable
    return pynini.Fst.read_from_string(header + words.tobytes())
