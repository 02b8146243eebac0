"""The records that pass between the stages, below all of them.

Which model a query runs on (``ModelRef``), what the planner asks of the compiler (``CompileOptions``)
and of the executor (``Decoding`` and a traversal: ``ShortestPath``, ``Sample`` or ``Measure``), why a
search stopped (``Stop``), the errors of running a query, the result columns with their kinds, and the
defaults and ranges of these records, each written once as a named constant (``relmql.plan.options``
reads them). This module imports no stage:
planning a query loads neither torch nor pynini.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple, Union

from .errors import Cancelled, CompileError, ExecutionError
from .memory import DEFAULT_MAX_MEMORY, format_size
from .stats import DEFAULT_CONFIDENCE

# -- result columns and their kinds

KINDS = ("text", "number", "rank", "bool")  # how a column's values are shown (text: not known to be numbers)
COLUMN_KINDS: Dict[str, str] = {
    "text": "text", "prefix": "text", "completion": "text", "tokens": "text", "logprob": "number",
    "prob": "number", "total_logprob": "number", "total_prob": "number", "canonical": "bool", "edits": "number",
    "rank": "rank", "weight": "number"}
COLUMNS = tuple(COLUMN_KINDS)
# worked out from a row (or its query) when asked for; in SELECT * only where the query has them
COMPUTED_KINDS: Dict[str, str] = {"edit_position": "number", "model": "text", "prompt": "text"}
COMPUTED_COLUMNS = tuple(COMPUTED_KINDS)

# -- the model a query runs on

DEFAULT_DEVICE = "cpu"
DTYPES = ("float32", "bfloat16", "float16", "auto")  # float32 is exact; the others are faster and approximate
DEFAULT_DTYPE = "float32"


@dataclass(frozen=True)
class ModelRef:
    """Which model runs a query: a built-in name, a local directory or a hub id, on ``device`` in ``dtype``."""

    name: str
    device: str = DEFAULT_DEVICE
    dtype: str = DEFAULT_DTYPE


# -- the context a query's strings follow

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class Prompt:
    """``PROMPT``: what the model reads before the reply, given and never searched. Either ``text``
    (raw text, after the start-of-text token) or ``messages`` (``(role, content)`` turns, rendered by
    the model's chat template, or by ``template``, a Jinja text, where given)."""

    text: Optional[str] = None
    messages: Tuple[Tuple[str, str], ...] = ()
    template: Optional[str] = None

    @property
    def is_chat(self) -> bool:
        return self.text is None


# -- compiling: how a query's strings become token sequences

TOKENIZATIONS = ("canonical", "all")
EDIT_SCOPES = ("all", "prefix", "completion")
PRINTABLE_ASCII = "".join(chr(c) for c in range(0x20, 0x7F))  # the default edit alphabet
MAX_EDITS = 64
DEFAULT_MAX_STATES = 100_000


@dataclass(frozen=True)
class CompileOptions:
    """How a query's strings become token sequences.

    tokenization / prefix_tokenization: "canonical" (only what the tokenizer produces) or "all"
    (every token sequence spelling the text), for the completion and the prefix.
    edits: up to this many character edits (insert, delete, substitute) over ``edit_alphabet``,
    in ``edit_scope`` ("all", "prefix" or "completion").
    exclude: regexes whose strings are removed.
    max_states: the largest byte automaton allowed.
    """

    tokenization: str = "canonical"
    prefix_tokenization: str = "canonical"
    edits: int = 0
    edit_scope: str = "all"
    edit_alphabet: str = PRINTABLE_ASCII
    exclude: Tuple[str, ...] = field(default=())
    max_states: int = DEFAULT_MAX_STATES

    def __post_init__(self):
        """Check every field's type and range once, where the options are made (CompileError);
        ``exclude`` given as one pattern or a list becomes a tuple."""
        exclude = (self.exclude,) if isinstance(self.exclude, str) else tuple(self.exclude)
        if not all(isinstance(x, str) for x in exclude):
            raise CompileError("exclusions must be strings")
        object.__setattr__(self, "exclude", exclude)
        if not isinstance(self.edits, int) or isinstance(self.edits, bool) or not 0 <= self.edits <= MAX_EDITS:
            raise CompileError(f"edits must be a whole number from 0 to {MAX_EDITS}")
        if not isinstance(self.edit_alphabet, str) or not self.edit_alphabet:
            raise CompileError("the edit alphabet must be a non-empty string")
        try:
            self.edit_alphabet.encode("utf-8")
        except UnicodeEncodeError:
            raise CompileError("the edit alphabet has characters with no UTF-8 encoding (surrogates)") from None
        if not isinstance(self.max_states, int) or self.max_states < 1:
            raise CompileError("max_states must be a positive whole number")
        for name, mode in (("tokenization", self.tokenization), ("prefix_tokenization", self.prefix_tokenization)):
            if mode not in TOKENIZATIONS:
                raise CompileError(f"unknown {name} {mode!r}; use canonical or all")
        if self.edit_scope not in EDIT_SCOPES:
            raise CompileError(f"unknown edit scope {self.edit_scope!r}; use {', '.join(EDIT_SCOPES)}")


# -- the traversals' defaults and choices

ORDERS = ("prob", "total_prob")
SAMPLING_MODES = ("local", "exact")
MAX_TOKENS = 64  # the longest completion, in tokens
MAX_PREFIX_TOKENS = 1024  # prefixes such as a whole passage of text run to hundreds of tokens
MAX_NODES_PER_ROW = 10_000  # completion nodes: about 40 s of SmolLM2-135M on two CPU cores
MAX_PREFIX_NODES = 100_000  # the prompt's token sequences (tokenizations, edited variants): about 6 minutes
SEARCH_BATCH_SIZE = 32  # search nodes expanded per model call
SEARCH_MAX_BATCH_SIZE = 128  # ... growing to this many while rows are far apart (batch_size not given)
SAMPLE_BATCH_SIZE = 64  # draws per model call
EXACT_LIMIT = 10_000  # token sequences that probability() sums exactly; more are estimated
ESTIMATE_SAMPLES = 1000  # the draws behind an estimate of probability()
BOUND_NODES = 256  # nodes the search reads to bound probability() before it is estimated


_SCOPES: contextvars.ContextVar[tuple] = contextvars.ContextVar("relmql_cancel", default=())


class Listener:
    """How a running query reaches the one who watches it (a progress bar, a Ray worker, a
    result's notes); every method does nothing here. ``cancel``, once set, stops the query at its
    next checkpoint (a ``Cancelled`` error)."""

    cancel: Optional[threading.Event] = None

    def loaded(self, model) -> None:
        """A query's model is loaded: its compile and search come next."""

    def total(self, n: int, unit: str = "row") -> None:
        """How many rows (or data rows, sequences, draws) there will be."""

    def progress(self, n: int = 1) -> None:
        """``n`` more of them are done."""

    def note(self, text: str) -> None:
        """How far the work on the next row has gone ("" once it is over)."""

    def ended(self, report) -> None:
        """A query's rows are over (each model's, each data row's): its ``relmql.engine.QueryReport``."""


@contextlib.contextmanager
def cancelling(event: Optional[threading.Event], tick: Optional[Callable[[], None]] = None) -> Iterator[None]:
    """Within this block, ``checkpoint`` raises once ``event`` is set (a statement's compile, which
    takes no cancel argument of its own, stops at its next checkpoint) and calls ``tick`` (a
    progress display's redraw: a compile runs for minutes between model calls)."""
    if event is None and tick is None:
        yield
        return
    token = _SCOPES.set(_SCOPES.get() + ((event, tick),))
    try:
        yield
    finally:
        _SCOPES.reset(token)


def checkpoint() -> None:
    """Raise ``Cancelled`` where an enclosing ``cancelling`` block's event is set; else tell its
    ``tick`` that the work goes on."""
    scopes = _SCOPES.get()
    if any(e is not None and e.is_set() for e, _ in scopes):
        raise Cancelled("the query was cancelled")
    for _, tick in scopes:
        if tick is not None:
            tick()


@dataclass(frozen=True)
class Stop:
    """Why a traversal ended before its language (or its LIMIT) was exhausted: ``bound`` is the
    option that stopped it (max_nodes, max_nodes_per_row, max_prefix_nodes or max_memory), ``limit`` its value and
    ``rows`` how many rows had been released. The rows released are exact and in order."""

    bound: str
    limit: int
    rows: int

    def limit_text(self) -> str:
        return format_size(self.limit) if self.bound == "max_memory" else f"{self.limit:,} nodes"

    def message(self) -> str:
        """The warning a user sees."""
        what = {"max_nodes": f"after expanding {self.limit_text()} (max_nodes)",
                "max_nodes_per_row": f"after expanding {self.limit_text()} without finding another row "
                                     f"(max_nodes_per_row)",
                "max_prefix_nodes": f"after expanding {self.limit_text()} of the prefix, its tokenizations "
                                    f"and edited variants (max_prefix_nodes)",
                "max_memory": f"when its queue and stored children reached their share of "
                              f"{self.limit_text()} (max_memory)"}[self.bound]
        rows = f"{self.rows:,} row{'s' if self.rows != 1 else ''}"
        kept = "; those are exact and in order, and more may exist" if self.rows else "; more may exist"
        return f"the search stopped {what} with {rows}{kept} (raise {self.bound} to search further)"


@dataclass(frozen=True)
class Decoding:
    """The rules that make a completion token one the model "would produce".

    Logits are divided by ``temperature``; then, where set, only the ``topk`` most probable
    tokens and the smallest set of most probable tokens whose probability reaches ``topp`` are
    kept, and probabilities are renormalized over them. Prefix tokens are exempt: they take the
    model's own probability. With ``eos`` a string must be followed by the end-of-text token,
    whose probability (under the same rules) counts.
    """

    temperature: float = 1.0
    topk: Optional[int] = None
    topp: Optional[float] = None
    eos: bool = False

    def check(self) -> "Decoding":
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0
                and math.isfinite(self.temperature)):
            raise ExecutionError(f"temperature must be a positive number, not {self.temperature!r}")
        if self.topk is not None and not (isinstance(self.topk, int) and self.topk >= 1):
            raise ExecutionError(f"topk must be a whole number of at least 1, not {self.topk!r}")
        if self.topp is not None and not (isinstance(self.topp, (int, float)) and 0 < self.topp <= 1):
            raise ExecutionError(f"topp must be in (0, 1], not {self.topp!r}")
        return self

    @property
    def plain(self) -> bool:
        return self.temperature == 1 and not self.truncates

    @property
    def truncates(self) -> bool:
        """Whether top-k or top-p keep only some tokens (``RuleScores.kept`` lists them)."""
        return self.topk is not None or self.topp is not None

    def keeps_few(self, vocab: int) -> bool:
        """Whether top-k keeps at most an eighth of a vocabulary of ``vocab`` tokens (top-p alone
        may keep nearly all)."""
        return self.topk is not None and 8 * self.topk <= vocab

    def describe(self) -> List[str]:
        """The rules that are set, in words (EXPLAIN's decoding line)."""
        rules = [f"topk {self.topk}"] if self.topk is not None else []
        rules += [f"topp {self.topp:g}"] if self.topp is not None else []
        rules += [f"temperature {self.temperature:g}"] if self.temperature != 1 else []
        rules += ["eos (the end-of-text token must follow; its probability counts)"] if self.eos else []
        return rules

    def truncation(self) -> str:
        """The rules that keep only some tokens, in words: "topk 40", "topk 40 and topp 0.9"."""
        return " and ".join(r for r in self.describe() if r.startswith(("topk ", "topp ")))


@dataclass(frozen=True)
class ShortestPath:
    """Most probable strings first, exactly, by ``order``: "prob" (of the completion given the
    prefix) or "total_prob" (of the whole token sequence). ``limit``: stop after that many rows.
    ``max_tokens``: the longest completion, in tokens; ``max_prefix_tokens``: the longest
    prefix. ``max_nodes``: stop expanding after this many nodes (the rows released until then
    are still the most probable, in order; ``SearchStats.stopped`` tells). ``batch_size``: nodes
    expanded per model call; ``max_batch_size``: while rows are far apart the batch grows to a
    quarter of the nodes expanded since the last row, up to this many and to scores within a
    quarter of the search's memory share (None: ``batch_size`` always; ``batches`` gives both
    for a batch size a query may or may not have set). ``max_prefix_nodes``: how many prefix
    nodes a search may expand: "prob" order refuses a prefix with more at once (it needs every
    prefix's distribution before its first row), "total_prob" stops there. ``max_nodes_per_row``:
    stop after expanding this many completion nodes without releasing a row. ``max_memory``: the query's memory
    budget (``relmql.memory``); the search stops when its own structures outgrow their share. ``first_match``: the
    search does not go past a string of the language (without ``eos``): rows are then the
    shortest strings a generation can begin with, disjoint events whose probabilities add up.
    ``order_default``: why ``order`` is what the query did not say (None: it said, or "prob")."""

    order: str = "prob"
    order_default: Optional[str] = None
    limit: Optional[int] = None
    max_tokens: int = MAX_TOKENS
    batch_size: int = SEARCH_BATCH_SIZE
    max_batch_size: Optional[int] = None
    max_prefix_nodes: int = MAX_PREFIX_NODES
    max_prefix_tokens: int = MAX_PREFIX_TOKENS
    max_nodes: Optional[int] = None
    max_nodes_per_row: Optional[int] = MAX_NODES_PER_ROW
    max_memory: int = DEFAULT_MAX_MEMORY
    first_match: bool = False
    pipeline: Optional[bool] = None  # a model call in flight while the host works (None: off a CPU)

    @staticmethod
    def batches(batch_size: Optional[int]) -> Dict[str, Optional[int]]:
        """``batch_size`` and ``max_batch_size`` for a batch size a query set (kept for every
        call) or did not (None: ``SEARCH_BATCH_SIZE``, growing to ``SEARCH_MAX_BATCH_SIZE``)."""
        if batch_size:
            return {"batch_size": batch_size, "max_batch_size": None}
        return {"batch_size": SEARCH_BATCH_SIZE, "max_batch_size": SEARCH_MAX_BATCH_SIZE}

    def check(self) -> "ShortestPath":
        if self.order not in ORDERS:
            raise ExecutionError(f"unknown order {self.order!r}; use prob or total_prob")
        for name in ("max_tokens", "batch_size", "max_prefix_nodes", "max_prefix_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ExecutionError(f"{name} must be a whole number of at least 1, not {v!r}")
        if self.max_batch_size is not None and not (isinstance(self.max_batch_size, int)
                                                    and self.max_batch_size >= self.batch_size):
            raise ExecutionError(f"max_batch_size must be a whole number of at least batch_size ({self.batch_size}), "
                                 f"not {self.max_batch_size!r}")
        if self.limit is not None and not (isinstance(self.limit, int) and self.limit >= 0):
            raise ExecutionError(f"limit must be a whole number, not {self.limit!r}")
        for name in ("max_nodes", "max_nodes_per_row"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, int) and v >= 1):
                raise ExecutionError(f"{name} must be a whole number of at least 1, not {v!r}")
        if self.pipeline not in (None, True, False):
            raise ExecutionError(f"pipeline must be on or off, not {self.pipeline!r}")
        _check_memory(self.max_memory)
        return self


@dataclass(frozen=True)
class Sample:
    """``n`` independent samples (with replacement).

    The prefix is drawn uniformly over the prefix's token paths (in proportion to the number of
    completions below each arc; cycles unrolled to ``max_prefix_tokens``), then the completion from
    the model under the decoding rules, restricted to the language:

    - ``mode="local"``: at each step the model's distribution is renormalized over the tokens
      the language allows (ReLM's sampler). Every draw is a string of the language, but strings
      are not drawn with their conditional probability; each row's ``weight`` is its importance
      weight P(string) / P(drawn), whose mean estimates the probability of the language and
      which makes weighted estimates unbiased.
    - ``mode="exact"``: rejection: the completion is drawn from the model's own distribution
      and drawn again whenever it leaves the language, so rows follow the model's distribution
      conditioned on the language exactly. It needs about 1 / P(language | prefix) draws per
      row; ``max_draws`` bounds the total.

    With ``misses``, every sample is exactly one draw: a draw that leaves the language (exact)
    or reaches a dead end (local) is not drawn again but ends as a row with ``miss`` set and
    weight 0, so that the n rows are independent draws for estimating probabilities. With
    ``first_match`` (and no ``eos``), a completion ends at the first string of the language it
    spells, as ``ShortestPath.first_match`` does. ``max_memory``: the query's memory budget; the
    states cached for prefixes and completions that several samples share stay within its share.
    ``stream`` tells apart runs of one seed that must draw independently (the data rows of a
    dataset query); the empty default keeps the draws of a seed as they have always been.
    """

    n: int
    seed: int = 0
    stream: str = ""
    mode: str = "local"
    max_tokens: int = MAX_TOKENS
    batch_size: int = SAMPLE_BATCH_SIZE
    max_draws: Optional[int] = None
    max_prefix_tokens: int = MAX_PREFIX_TOKENS
    misses: bool = False
    first_match: bool = False
    max_memory: int = DEFAULT_MAX_MEMORY

    def check(self) -> "Sample":
        if not (isinstance(self.n, int) and self.n >= 0):
            raise ExecutionError(f"the number of samples must be a whole number, not {self.n!r}")
        if self.mode not in SAMPLING_MODES:
            raise ExecutionError(f"unknown sampling mode {self.mode!r}; use local or exact")
        for name in ("max_tokens", "batch_size", "max_prefix_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ExecutionError(f"{name} must be a whole number of at least 1, not {v!r}")
        if not isinstance(self.seed, int):
            raise ExecutionError(f"seed must be a whole number, not {self.seed!r}")
        _check_memory(self.max_memory)
        return self

    @property
    def draw_budget(self) -> int:
        """The draws after which sampling gives up: ``max_draws``, by default 1,000 a sample (at
        least 1,000)."""
        return self.max_draws if self.max_draws is not None else max(1000, 1000 * self.n)


@dataclass(frozen=True)
class Measure:
    """The probability of the language, P(string in the language | prefix), averaged over the
    prefix's token paths (per group: over the strings of the group; see ``measure``).

    Summed exactly over every token sequence (``ShortestPath`` with ``first_match``) when the
    language is finite with at most ``exact_limit`` of them; otherwise estimated from
    ``samples`` independent draws of ``Sample`` with ``misses`` and ``first_match`` (``mode``
    local: importance weights; exact: rejection), with intervals at ``confidence``. Before it is
    estimated, a language with one prefix path is bounded for certain by ``bound_nodes`` nodes of
    the exact search (``execute.bounds``), and summed exactly where they exhaust it.
    """

    exact_limit: int = EXACT_LIMIT
    samples: int = ESTIMATE_SAMPLES
    seed: int = 0
    stream: str = ""  # as Sample's
    mode: str = "local"
    max_tokens: int = MAX_TOKENS
    batch_size: Optional[int] = None  # default: SEARCH_BATCH_SIZE growing (exact) or SAMPLE_BATCH_SIZE (estimate)
    max_prefix_tokens: int = MAX_PREFIX_TOKENS
    confidence: float = DEFAULT_CONFIDENCE
    max_memory: int = DEFAULT_MAX_MEMORY
    max_draws: Optional[int] = None  # an EXPECT's budget of draws over its rounds (default: 16 times ``samples``)
    bound_nodes: int = BOUND_NODES  # before an estimate, the search's nodes that bound it for certain (0: none)
    bound_only: bool = False  # the bound alone, no draws (an EXPECT's first look)

    def exact(self) -> ShortestPath:
        """The traversal that sums exactly (in order of total probability: the order does not
        matter for a sum, and this one needs no prefix's distribution before the first row). It
        visits at most ``exact_limit`` sequences, so no node bound applies."""
        return ShortestPath(order="total_prob", max_tokens=self.max_tokens, **ShortestPath.batches(self.batch_size),
                            max_prefix_tokens=self.max_prefix_tokens, first_match=True, max_nodes_per_row=None,
                            max_memory=self.max_memory)

    def estimate(self) -> Sample:
        """The traversal that estimates."""
        return Sample(n=self.samples, seed=self.seed, stream=self.stream, mode=self.mode, max_tokens=self.max_tokens,
                      batch_size=self.batch_size or SAMPLE_BATCH_SIZE, max_prefix_tokens=self.max_prefix_tokens,
                      misses=True, first_match=True, max_memory=self.max_memory)

    def check(self) -> "Measure":
        if not (isinstance(self.exact_limit, int) and self.exact_limit >= 0):
            raise ExecutionError(f"exact_limit must be a whole number, not {self.exact_limit!r}")
        if not (isinstance(self.samples, int) and self.samples >= 1):
            raise ExecutionError(f"an estimate needs at least one sample, not {self.samples!r}")
        if not 0 < self.confidence < 1:
            raise ExecutionError(f"confidence must be between 0 and 1, not {self.confidence!r}")
        if not (isinstance(self.bound_nodes, int) and self.bound_nodes >= 0):
            raise ExecutionError(f"bound_nodes must be a whole number, not {self.bound_nodes!r}")
        return self


Traversal = Union[ShortestPath, Sample, Measure]


def _check_memory(value) -> None:
    if not (isinstance(value, int) and value >= 1):
        raise ExecutionError(f"max_memory must be a positive number of bytes, not {value!r}")
