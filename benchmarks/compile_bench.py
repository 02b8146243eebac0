"""Compile benchmark (DESIGN §5.1): relmql's token automaton vs outlines-core's Index.

Every measurement runs in a fresh worker process so that peak memory is its own: the worker
loads the vocabulary (not timed, for both tools), resets the kernel's peak-RSS counter, builds
the automaton, and reports wall time and the peak resident memory added by the build.

    python -m benchmarks.compile_bench            # prints a markdown table
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

REGEXES = {
    "george washington": "George Washington was born on (January|February|March|April|May|June|July|August|"
                         "September|October|November|December) [0-9]{1,2}, [0-9]{4}",
    "phone": "My phone number is ([0-9]{3}) ([0-9]{3}) ([0-9]{4})",
    "url": r"https://www\.([a-zA-Z0-9]|_|-|#|%)+\.([a-zA-Z0-9]|_|-|#|%|/)+",
    "bias": "The (man|woman) was trained in (art|science|business|medicine|computer science|engineering|"
            "humanities|social sciences|information systems|math)",
    "[^\\n]{0,64}": r"[^\n]{0,64}",
    "[^\\n]{0,256}": r"[^\n]{0,256}",
}
VOCABS = ("gpt2", "smollm2", "gemma3")  # gemma3: SentencePiece-style BPE, 262,144 tokens
REPEATS = 3


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def _reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def load_vocab(name: str):
    from relmql.models.vocab import from_tokenizer
    if name == "gpt2":
        from relmql.models.builtin import gpt2_tokenizer
        return from_tokenizer(gpt2_tokenizer())
    from relmql.models import load_model
    return load_model({"smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}[name]).vocabulary


def worker(tool: str, vocab_name: str, regex: str) -> dict:
    vocab = load_vocab(vocab_name)
    if tool == "outlines-core":
        from outlines_core import Index, Vocabulary
        mapping = {}
        for i, t in enumerate(vocab.tokens):
            if t is not None and i != vocab.eos_id:
                mapping.setdefault(t, []).append(i)
        ov = Vocabulary(vocab.eos_id, mapping)

        def build():
            return Index(regex, ov)

        def size(idx):
            return sum(len(v) for v in idx.get_transitions().values())
    else:
        from relmql.automata.language import LanguageSpec, compile_language
        from relmql.automata.tokens import TokenAutomaton
        from relmql.automata.trie import trie_for
        trie_for(vocab)  # per-vocabulary setup, like outlines-core's Vocabulary
        mode = "canonical" if tool.endswith("canonical") else "all"
        if mode == "canonical":  # per-vocabulary tables: BPE pairs, pre-tokenizer classes
            TokenAutomaton(compile_language(LanguageSpec("warm up")), vocab).arcs(0)

        def build():
            compile_language.cache_clear()
            ta = TokenAutomaton(compile_language(LanguageSpec(regex, max_states=1_000_000)), vocab, mode, mode)
            if tool.startswith("relmql-first"):
                return ta, ta.arcs(ta.start)
            return ta, ta.build_eager()

        def size(result):
            ta, out = result
            return len(out) if tool.startswith("relmql-first") else out.arcs
    times, peak, count = [], None, None
    for k in range(REPEATS):
        base = _rss_kb("VmRSS")
        _reset_peak()
        t0 = time.perf_counter()
        result = build()
        times.append(time.perf_counter() - t0)
        if k == 0:
            peak = max(0, _rss_kb("VmHWM") - base)
            count = size(result)
        del result
    return {"seconds": statistics.median(times), "peak_mb": peak / 1024, "transitions": count}


def measure(tool: str, vocab: str, regex: str, timeout: int = 900) -> dict:
    cmd = [sys.executable, __file__, "--worker", tool, vocab, regex]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout}s"}
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"failed ({'out of memory' if out.returncode in (-9, 137) else tail[:80]})"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def run() -> list:
    rows = []
    for vocab in VOCABS:
        for label, regex in REGEXES.items():
            row = {"vocab": vocab, "regex": label}
            for tool in ("outlines-core", "relmql", "relmql-first", "relmql-first-canonical"):
                row[tool] = measure(tool, vocab, regex)
                print(f"{vocab:8s} {label:20s} {tool:24s} {row[tool]}", file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def table(rows: list) -> str:
    def fmt_s(m):
        return m.get("error") or f"{m['seconds']:.3f} s"

    def fmt_ms(m):
        return m.get("error") or f"{m['seconds'] * 1000:.1f} ms"

    def fmt_mb(m):
        return "" if "error" in m else f"{m['peak_mb']:.0f} MB"

    lines = ["| vocabulary | regex | outlines-core build | relmql eager build | time ratio | outlines-core peak "
             "memory | relmql peak memory | transitions (oc / relmql) | relmql first state (all) | relmql "
             "first state (canonical) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        oc, rq = r["outlines-core"], r["relmql"]
        ratio = "" if "error" in oc or "error" in rq else f"**{rq['seconds'] / oc['seconds']:.2f}**"
        trans = f"{oc.get('transitions', '-')} / {rq.get('transitions', '-')}"
        first = [fmt_ms(r[t]) for t in ("relmql-first", "relmql-first-canonical")]
        lines.append(f"| {r['vocab']} | `{r['regex']}` | {fmt_s(oc)} | {fmt_s(rq)} | {ratio} | {fmt_mb(oc)} | "
                     f"{fmt_mb(rq)} | {trans} | {first[0]} | {first[1]} |")
    return "\n".join(lines)


def reading(rows: list) -> str:
    """A factual summary of ``rows``: worst ratios and the cases that miss a target."""
    ok = [r for r in rows if "error" not in r["outlines-core"] and "error" not in r["relmql"]]
    ratios = [(r["relmql"]["seconds"] / r["outlines-core"]["seconds"], r) for r in ok]
    lines = []
    if ratios:
        worst, wr = max(ratios, key=lambda x: x[0])
        best, br = min(ratios, key=lambda x: x[0])
        missed = [f"{r['vocab']} `{r['regex']}` ({x:.2f})" for x, r in ratios if x > 1.0]
        lines.append(f"- Eager build time ratio: from {best:.2f} ({br['vocab']} `{br['regex']}`) to {worst:.2f} "
                     f"({wr['vocab']} `{wr['regex']}`); "
                     + ("every case meets the target of 1.0." if not missed else f"missed on {', '.join(missed)}."))
    errors = [f"{r['vocab']} `{r['regex']}` {t}: {r[t]['error']}" for r in rows for t in r
              if isinstance(r[t], dict) and "error" in r[t]]
    if errors:
        lines.append("- Failures: " + "; ".join(errors) + ".")
    for tool, label in (("relmql-first", "all tokenizations"), ("relmql-first-canonical", "canonical")):
        firsts = [(r[tool]["seconds"] * 1000, r) for r in rows if "error" not in r[tool]]
        if firsts:
            slow = [f"{r['vocab']} `{r['regex']}` ({ms:.0f} ms)" for ms, r in firsts if ms > 50]
            lines.append(f"- Lazy first state ({label}): at most {max(m for m, _ in firsts):.0f} ms; "
                         + ("every case meets the 50 ms target." if not slow else f"over 50 ms on {', '.join(slow)}."))
    mem = [(r["relmql"]["peak_mb"], r["outlines-core"]["peak_mb"], r) for r in ok]
    if mem:
        big = max(mem, key=lambda x: x[0])
        lines.append(f"- Peak memory of the eager build: at most {big[0]:.0f} MB for relmql ({big[2]['vocab']} "
                     f"`{big[2]['regex']}`; outlines-core {big[1]:.0f} MB there).")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--worker", nargs=3, metavar=("TOOL", "VOCAB", "REGEX"))
    p.add_argument("--json", help="also write the raw results here")
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    rows = run()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(table(rows))


if __name__ == "__main__":
    main()
