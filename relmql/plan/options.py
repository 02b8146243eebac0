"""The options of ``USING`` and ``SET``: one table with each option's type, default and meaning."""

from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

from ..errors import Error, PlanError, closest
from ..syntax import ast as A
from ..syntax.unparse import unparse
from ..memory import DEFAULT_MAX_MEMORY, format_size, parse_size
from ..models import DEFAULT_MODEL, check_model_name
from ..records import (BOUND_NODES, DEFAULT_DEVICE, DEFAULT_DTYPE, DEFAULT_MAX_STATES, DTYPES, EDIT_SCOPES,
                       ESTIMATE_SAMPLES, EXACT_LIMIT, MAX_EDITS, MAX_NODES_PER_ROW, MAX_PREFIX_NODES,
                       MAX_PREFIX_TOKENS, MAX_TOKENS, SAMPLE_BATCH_SIZE, SAMPLING_MODES, SEARCH_BATCH_SIZE,
                       SEARCH_MAX_BATCH_SIZE, TOKENIZATIONS,
                       CompileOptions, Decoding, Sample)
from ..stats import DEFAULT_CONFIDENCE, MAX_TEST_DRAWS


def shown(value: Any) -> str:
    """A value as a query writes it (NULL, TRUE, 'text'), for messages."""
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(shown(v) for v in value) + ")"
    if value is None or isinstance(value, (str, bool)):
        return unparse(A.Literal(value))
    if isinstance(value, int) and abs(value) >= 10 ** 15:
        return f"{value:.3g}"  # 1e+300, not its 301 digits
    return repr(value)  # a number as Python writes it: -1, 2.5, 3.8e-05



def whole_number(value) -> Optional[int]:
    """``value`` as a whole number, or None: an int, a float with no fraction (``1e3``), or text
    that spells one (a parameter's value, ``-p n=10``); numpy's integers too. Booleans are not
    numbers here."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None

@dataclass(frozen=True)
class OptionSpec:
    """One option. ``kind``: int, float, bool, choice, text or size (bytes); ``where``: the part of the plan it
    sets (decoding, compile, traversal, model), or session (how the session runs queries)."""

    name: str
    kind: str
    default: Any
    where: str
    doc: str
    choices: Tuple[str, ...] = ()
    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    session_only: bool = False
    validate: Optional[Callable[[Any], None]] = None  # raises an Error for a value that names nothing or is too much

    def check(self, value, span=None, source=None):
        """``value`` converted to this option's type, or a ``PlanError``."""
        def bad(why):
            return PlanError(f"{self.name} {why}", span, source)
        if value is None:
            if self.default is None and self.kind in ("int", "float"):
                return None
            raise bad("needs a value")
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "on", "yes", "1", "false", "off", "no", "0"):
                return value.lower() in ("true", "on", "yes", "1")
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            raise bad(f"is true or false, not {shown(value)}")
        if self.kind == "choice":
            v = str(value).lower() if isinstance(value, str) else value
            if v not in self.choices:
                near = closest(str(value), self.choices)
                raise PlanError(f"{self.name} is one of {', '.join(self.choices)}, not {shown(value)}", span, source,
                                hint=f"did you mean {near}?" if near else None)
            return v
        if self.kind == "text":
            if not isinstance(value, str):
                raise bad(f"is a string, not {shown(value)}")
            return self._validated(value, span, source)
        if self.kind == "size":
            try:
                value = parse_size(value)
            except ValueError:
                raise bad(f"is a size such as '2GB', '512MB' or a number of bytes, not {shown(value)}") from None
            if self.low is not None and value < self.low:
                raise bad(f"must be at least {format_size(int(self.low))}, not {format_size(value)}")
            return value
        if self.kind == "int":
            n = whole_number(value)
            if n is None:
                raise bad(f"is a whole number, not {shown(value)}")
            value = n
        else:
            number = value if isinstance(value, numbers.Real) and not isinstance(value, bool) else None
            if isinstance(value, str):
                try:
                    number = float(value)
                except ValueError:
                    pass
            if number is None:
                raise bad(f"is a number, not {shown(value)}")
            value = float(number)
            if not math.isfinite(value):
                raise bad(f"is a finite number, not {shown(value)}")
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise bad(f"must be {'more than' if self.low_open else 'at least'} {self.low:g}, not {shown(value)}")
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            raise bad(f"must be {'less than' if self.high_open else 'at most'} {self.high:g}, not {shown(value)}")
        return self._validated(value, span, source)

    def _validated(self, value, span, source):
        """``value``, once ``validate`` (if any) accepts it; its error placed at ``span``."""
        if self.validate is not None:
            try:
                self.validate(value)
            except Error as e:
                e.span, e.source = span, source
                raise
        return value


_DEVICE = re.compile(r"auto|cpu|mps|(cuda|xpu)(:\d+)?")


def _check_device(name: str) -> None:
    if not _DEVICE.fullmatch(name):
        raise PlanError(f"device is cpu, cuda, cuda:N or auto, not {shown(name)}")


def _check_threads(n: int) -> None:
    """At most this machine's CPUs: torch starts a thread for each (100,000 of them crashed the
    process, 10,000 made a 10-second query run for minutes)."""
    cpus = os.cpu_count() or 1
    if n > cpus:
        raise PlanError(f"threads must be at most {cpus}, the CPUs of this machine, not {n:,}",
                        hint="more threads than CPUs only take turns; leave threads unset for torch's own choice")


OPTIONS: Dict[str, OptionSpec] = {o.name: o for o in (
    OptionSpec("topk", "int", None, "decoding", "keep only the k most probable next tokens (completion only)",
               low=1),
    OptionSpec("topp", "float", None, "decoding",
               "keep only the most probable next tokens that reach probability p (completion only)",
               low=0, high=1, low_open=True),
    # below 1e-30, float32 logits divided by it overflow to infinity (every probability NaN)
    OptionSpec("temperature", "float", Decoding.temperature, "decoding", "divide the logits by this", low=1e-30),
    OptionSpec("eos", "bool", Decoding.eos, "decoding", "a string must be followed by the end-of-text token"),
    OptionSpec("tokenization", "choice", CompileOptions.tokenization, "compile",
               "completion token sequences: canonical (what the tokenizer produces) or all", TOKENIZATIONS),
    OptionSpec("prefix_tokenization", "choice", CompileOptions.prefix_tokenization, "compile",
               "prefix token sequences: canonical or all", TOKENIZATIONS),
    OptionSpec("edits", "int", CompileOptions.edits, "compile",
               "allow up to n character edits (insert, delete, substitute)", low=0, high=MAX_EDITS),
    OptionSpec("edit_scope", "choice", CompileOptions.edit_scope, "compile",
               "where edits may fall: all, prefix or completion", EDIT_SCOPES),
    OptionSpec("max_states", "int", DEFAULT_MAX_STATES, "compile", "the largest byte automaton allowed", low=1),
    OptionSpec("chat_template", "text", "", "prompt",
               "the Jinja chat template that renders PROMPT chat(...), as text or the path of a file (default: "
               "the model's own)"),
    OptionSpec("max_tokens", "int", MAX_TOKENS, "traversal", "the longest completion, in tokens", low=1),
    OptionSpec("max_nodes", "int", None, "traversal",
               "ranking queries: stop searching after this many search nodes (rows found are still exact, "
               "in order; later ones may be missing)", low=1),
    OptionSpec("max_nodes_per_row", "int", MAX_NODES_PER_ROW, "traversal",
               "ranking queries: stop when this many search nodes of the completion have been expanded "
               "without finding the next row (rows found are still exact, in order)", low=1),
    OptionSpec("max_prefix_nodes", "int", MAX_PREFIX_NODES, "traversal",
               "ranking queries: the most search nodes of the prefix (its tokenizations and edited variants) "
               "to expand: ORDER BY prob refuses a prefix with more at once, total_prob stops there (rows "
               "found are still exact, in order)", low=1),
    OptionSpec("max_memory", "size", DEFAULT_MAX_MEMORY, "traversal",
               "what a query may hold beyond the model's weights: cached keys and values, automaton "
               "transitions, the search's queue or the sampler's states (e.g. '2GB'); a search that needs "
               "more stops, keeping the rows it found", low=64 * 2 ** 20),
    OptionSpec("max_prefix_tokens", "int", MAX_PREFIX_TOKENS, "traversal", "the longest prefix, in tokens", low=1),
    OptionSpec("batch_size", "int", None, "traversal",
               f"nodes (shortest path) or samples (SAMPLE) per model call; default {SEARCH_BATCH_SIZE} (growing "
               f"to {SEARCH_MAX_BATCH_SIZE} while rows are far apart) and {SAMPLE_BATCH_SIZE}; a number given "
               f"is kept, up to what max_memory holds", low=1),
    OptionSpec("pipeline", "bool", None, "traversal",
               "shortest path: pick the next batch and take in the last call's results while the model "
               "makes a call (rows unchanged); default on where the model runs off a CPU, off on a CPU, "
               "where the two share the cores"),
    OptionSpec("sampling", "choice", Sample.mode, "traversal",
               "SAMPLE draws: local (renormalized over the language, with importance weights) or exact "
               "(rejection: the model's distribution conditioned on the language)", SAMPLING_MODES),
    OptionSpec("seed", "int", Sample.seed, "traversal", "random seed of SAMPLE", low=0),
    OptionSpec("max_draws", "int", None, "traversal",
               "SAMPLE: the most draws (each a completion begun) before the query gives up; default 1000 "
               "per sample", low=1),
    OptionSpec("exact_limit", "int", EXACT_LIMIT, "traversal",
               "probability(): sum exactly over languages of at most this many token sequences; estimate "
               "larger ones by sampling", low=0),
    OptionSpec("bound_nodes", "int", BOUND_NODES, "traversal",
               "probability(): before estimating, nodes of the exact search whose strings found and whose "
               "ruled-out probability bound the value for certain, and sum it where they read it whole (0, or "
               "exact_limit 0: draws alone)", low=0),
    OptionSpec("estimate_samples", "int", ESTIMATE_SAMPLES, "traversal",
               "probability(): the draws behind an estimate (SAMPLE n sets them and always estimates)", low=1),
    OptionSpec("confidence", "float", DEFAULT_CONFIDENCE, "traversal",
               "the confidence level of intervals and estimates", low=0, high=1, low_open=True, high_open=True),
    OptionSpec("test_draws", "int", 5000, "test",
               "TEST INDEPENDENCE over probabilities: how many draws per value of the first variable they "
               "stand for (the ReLM paper drew 5000 per gender)", low=1, high=MAX_TEST_DRAWS),
    OptionSpec("device", "text", DEFAULT_DEVICE, "model", "where the model runs: cpu, cuda, cuda:N or auto",
               validate=_check_device),
    OptionSpec("dtype", "choice", DEFAULT_DTYPE, "model",
               "model weights: float32 (exact), or bfloat16, float16 or auto (the fastest the hardware runs "
               "natively): faster, with approximate probabilities", DTYPES,
               session_only=True),
    OptionSpec("model", "text", DEFAULT_MODEL, "model",
               "the default model: a built-in name, a local directory or a hub id", session_only=True,
               validate=check_model_name),
    OptionSpec("threads", "int", None, "session",
               "CPU threads of the model's arithmetic, in this process or (engine ray) in each worker "
               "(default: torch's own choice here, a worker's share of the CPUs there)", low=1, session_only=True,
               validate=_check_threads),
    OptionSpec("engine", "choice", "local", "session",
               "where queries run: local (this process) or ray (worker processes of a Ray cluster; "
               "pip install 'relmql[ray]')", ("local", "ray"), session_only=True),
    OptionSpec("workers", "int", None, "session",
               "engine ray: worker processes, each with its own copy of the model (default: one per GPU "
               "with device cuda or auto, otherwise one per CPU)", low=1, session_only=True),
    OptionSpec("ray_address", "text", "", "session",
               "engine ray: the cluster to join: '' (RAY_ADDRESS, or a new local instance), 'auto' (the "
               "running one) or 'HOST:6379'", session_only=True),
)}


def command_params(items) -> Dict[str, str]:
    """``--param NAME=VALUE`` arguments as parameters (each value a string)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"\w+", name.strip()):
            raise Error(f"--param takes NAME=VALUE, not {item!r}")
        out[name.strip()] = value
    return out


def option(name: str, span=None, source=None) -> OptionSpec:
    """The option called ``name``, or an error naming the closest one."""
    spec = OPTIONS.get(name.lower())
    if spec is None:
        near = closest(name, OPTIONS)
        raise PlanError(f"unknown option {name!r}" + (f"; did you mean {near}?" if near else ""), span, source,
                        hint=None if near else f"options: {', '.join(OPTIONS)}")
    return spec


def defaults() -> Dict[str, Any]:
    """Every option at its default."""
    return {name: spec.default for name, spec in OPTIONS.items()}
