"""The ``relmql`` command.

Until the query language lands, the command runs one query given by flags:

    relmql --matching 'George Washington was born on (July|May) [0-9]{1,2}' \\
           --prefix 'George Washington was born on' --limit 5
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import List, Optional

from . import __version__
from .errors import Error


def build_parser() -> argparse.ArgumentParser:
    from .automata import EDIT_SCOPES, TOKENIZATIONS
    from .models import BUILTIN_MODELS, DEFAULT_MODEL
    p = argparse.ArgumentParser(
        prog="relmql",
        description="Query a language model with a regular expression: the most probable strings "
                    "of the pattern, in exact order of probability.")
    p.add_argument("--version", action="version", version=f"relmql {__version__}")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"a built-in model ({', '.join(BUILTIN_MODELS)}), a local directory or a hub id "
                        f"(default: {DEFAULT_MODEL})")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: cpu)")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16, float16 or auto (default: auto)")
    p.add_argument("--matching", required=True, metavar="REGEX",
                   help="the strings to find, the prefix included (Python re syntax)")
    p.add_argument("--prefix", metavar="REGEX", help="the given part of each string (not pruned by --topk)")
    p.add_argument("--limit", type=_positive, default=10, help="how many strings to return (default: 10)")
    p.add_argument("--order", choices=("prob", "total_prob"), default="prob",
                   help="rank by the completion's probability given the prefix (prob), or the whole string's")
    p.add_argument("--sample", type=_natural, metavar="N", help="draw N random samples instead of ranking")
    p.add_argument("--sampling", choices=("local", "exact"), default="local", help="how samples are drawn")
    p.add_argument("--seed", type=_natural, default=0, help="random seed for --sample (default: 0)")
    p.add_argument("--topk", type=_positive, help="keep only the k most probable next tokens")
    p.add_argument("--topp", type=float, help="keep only the most probable next tokens that make up probability p")
    p.add_argument("--temperature", type=float, default=1.0, help="divide the logits by this (default: 1)")
    p.add_argument("--eos", action="store_true", help="a string must be followed by the end-of-text token")
    p.add_argument("--batch-size", type=_positive, default=32, help="nodes or samples per model call")
    p.add_argument("--tokenization", choices=TOKENIZATIONS, default="canonical")
    p.add_argument("--prefix-tokenization", choices=TOKENIZATIONS, default="canonical")
    p.add_argument("--edits", type=_natural, default=0, help="allow up to N character edits")
    p.add_argument("--edit-scope", choices=EDIT_SCOPES, default="all")
    p.add_argument("--max-tokens", type=_positive, default=64, help="longest token sequence to consider")
    p.add_argument("--explain", action="store_true", help="describe the compiled automaton instead of running")
    return p


def _natural(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _positive(text: str) -> int:
    value = _natural(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except Error as e:
        _print_error(e)
        return 1
    except KeyboardInterrupt:
        print("cancelled", file=sys.stderr)
        return 130


def _print_error(e: Error) -> None:
    where = {"MATCHING": "--matching", "PREFIX": "--prefix"}.get(e.role or "", e.role)
    text = e.render()
    if where:
        text = text.replace(f"{e.kind}: ", f"{e.kind} in {where}: ", 1)
    print(text, file=sys.stderr)


def _run(args) -> int:
    from .automata import CompileOptions, compile
    from .execute import Decoding, Sample, ShortestPath, execute
    from .models import load_model
    t0 = time.perf_counter()
    model = load_model(args.model, device=args.device, dtype=args.dtype)
    t1 = time.perf_counter()
    options = CompileOptions(tokenization=args.tokenization, prefix_tokenization=args.prefix_tokenization,
                             edits=args.edits, edit_scope=args.edit_scope)
    automaton = compile(args.matching, model.vocabulary, args.prefix, options)
    t2 = time.perf_counter()
    for w in automaton.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.explain:
        _explain(automaton)
        return 0
    rules = Decoding(temperature=args.temperature, topk=args.topk, topp=args.topp, eos=args.eos)
    if args.sample is not None:
        traversal = Sample(args.sample, seed=args.seed, mode=args.sampling, max_tokens=args.max_tokens,
                           batch_size=args.batch_size)
    else:
        traversal = ShortestPath(order=args.order, limit=args.limit, max_tokens=args.max_tokens,
                                 batch_size=args.batch_size)
    count = 0
    for row in execute(automaton, model, traversal, rules):
        count += 1
        value = row.total_prob if args.order == "total_prob" and args.sample is None else row.prob
        print(f"{row.rank:>4}  {value:.6g}  {row.text!r}", flush=True)
    t3 = time.perf_counter()
    if not count:
        print("(no strings)")
    print(f"{count} rows; model loaded in {t1 - t0:.1f}s, compiled in {(t2 - t1) * 1000:.0f}ms, "
          f"ran in {t3 - t2:.1f}s", file=sys.stderr)
    return 0


def _explain(automaton) -> None:
    from .automata.fsa import format_count
    lang = automaton.language
    print(f"byte automaton: {lang.dfa.num_states} states, {lang.dfa.num_arcs} arcs")
    print(f"strings: {format_count(automaton.num_strings)}")
    print(f"tokenization: prefix {automaton.prefix_tokenization}, completion {automaton.tokenization}")
    print(f"vocabulary: {sum(t is not None for t in automaton.vocabulary.tokens):,} text tokens")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
