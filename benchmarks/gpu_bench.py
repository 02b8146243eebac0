"""The executor on a GPU (issue 17): a packaged model (Gemma 3 270M by default) in float32 on CUDA.

1. Exactness: the George Washington query's top 10 at batch 32 and 512 and by a ReLM-style
   search (``execute_bench.relm_style_search``: one uncached forward pass per node), each row
   scored again by one direct float32 forward pass over its tokens (``precision_bench``).
2. Throughput: expanded nodes per second of the URL search (top-k 40) at batch 32-512, with the
   share of wall time inside the model's forward passes and the GPU's utilization (NVML: the
   share of time a kernel was running, sampled every 50 ms).
   The same searches with every forward pass eager (``eager``: no CUDA graphs), same run.
3. The ratio to ReLM-style search: time to the first row and rows per second of the George
   Washington (10 rows) and URL (100 rows) queries, relmql at batch 32 against ReLM-style.
4. Where the executor's time goes at batch 256 (cProfile); batches of 512 and 1,024 each in one
   forward pass (the logits cap raised); bfloat16 throughput.
5. The executor alone on this machine's host (``host``: ``executor_bench.stub``, a nearly free
   model with the model's vocabulary, batch 256), to tell the host's speed from the GPU's.
6. One forward pass alone (``forward``): a batch of one new token each over 16 cached ones, its
   wall time against the GPU's kernel time in it (torch's profiler), and the same pass replayed
   as a CUDA graph: how much of a pass is the host launching kernels.

Each part writes its results to ``--json`` as soon as it ends (a lease may end first).

    python -m benchmarks.gpu_bench [--model gemma3-270m] [--json out.json] [--profile prof.txt]
"""

from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys
import threading
import time
from typing import Dict, List

import torch

from .execute_bench import GW, GW_PREFIX, URL, URL_PREFIX, relm_style_search, relmql_search
from .precision_bench import rule_logprobs

BATCHES = (32, 128, 256, 512)


class Utilization:
    """The GPU's mean utilization (NVML, percent) while the ``with`` block runs; None without NVML."""

    def __init__(self, device: torch.device, every: float = 0.05):
        self.every, self.samples, self.handle = every, [], None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
        except Exception:  # no NVML here: utilization is not measured
            pass

    def _sample(self):
        while not self.done.wait(self.every):
            self.samples.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)

    def __enter__(self):
        self.done, self.samples = threading.Event(), []
        if self.handle is not None:
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        if self.handle is not None:
            self.thread.join()

    @property
    def mean(self):
        return sum(self.samples) / len(self.samples) if self.samples else None


def throughput(model, ta, batch: int, nodes: int) -> Dict:
    """One URL search of at most ``nodes`` expanded nodes at ``batch``: nodes/s, forward share, GPU use."""
    from relmql.execute import Decoding, SearchStats, ShortestPath, shortest_path
    stats = SearchStats()
    f0, c0 = model.stats.seconds, model.stats.calls
    with Utilization(model.device) as use:
        t0 = time.perf_counter()
        rows = sum(1 for _ in shortest_path(ta, model, Decoding(topk=40),
                                            ShortestPath(batch_size=batch, max_nodes=nodes), stats=stats))
        wall = time.perf_counter() - t0
    fwd = model.stats.seconds - f0
    return {"batch": batch, "nodes": stats.expanded, "rows": rows, "seconds": wall,
            "nodes_per_s": stats.expanded / wall, "forward_share": fwd / wall, "gpu_utilization": use.mean,
            "forward_calls": model.stats.calls - c0}


def exactness(model) -> Dict:
    """The GW top 10 at batch 32 and 512 and ReLM-style: same rows, and each row's logprob against
    one direct float32 forward pass over its tokens."""
    from relmql.automata import compile
    from relmql.execute import Decoding, ShortestPath, shortest_path
    ta = compile(GW, model.vocabulary, GW_PREFIX)
    got = {b: list(shortest_path(ta, model, Decoding(topk=40), ShortestPath(limit=10, batch_size=b)))
           for b in (32, 512)}
    relm = relm_style_search(model, GW, GW_PREFIX, 10)
    a, b = got[32], got[512]
    direct = [rule_logprobs(model, list(r.tokens), r.prefix_tokens, 40)[0] for r in a]
    return {"texts": [r.text for r in a], "logprobs": [r.logprob for r in a],
            "same_rows_at_512": [r.tokens for r in a] == [r.tokens for r in b],
            "max_diff_32_vs_512": max(abs(x.logprob - y.logprob) for x, y in zip(a, b)),
            "bit_identical_32_vs_512": all(x.logprob == y.logprob for x, y in zip(a, b)),
            "same_rows_as_relm_style": [r.tokens for r in a] == [tuple(t) for t in relm["tokens"]],
            "max_diff_vs_direct": max(abs(x.logprob - d) for x, d in zip(a, direct))}


def versus_relm(model) -> Dict:
    """relmql at batch 32 against ReLM-style search: first row and rows/s (GW 10 rows, URL 100)."""
    out = {}
    for name, pattern, prefix, limit in (("george washington", GW, GW_PREFIX, 10), ("url", URL, URL_PREFIX, 100)):
        relmql_search(model, pattern, prefix, 3, 32)  # compile and warm up
        mine = relmql_search(model, pattern, prefix, limit, 32)
        mine.pop("texts", None)
        theirs = relm_style_search(model, pattern, prefix, limit)
        theirs.pop("tokens", None)
        out[name] = {"relmql": mine, "relm-style": theirs, "first_ratio": theirs["first"] / mine["first"],
                     "rows_per_s_ratio": mine["rows_per_s"] / theirs["rows_per_s"]}
        print(f"versus relm {name}: {json.dumps(out[name])}", file=sys.stderr, flush=True)
    return out


def profiled(model, ta, path, title: str, orders=("cumulative", "tottime")) -> Dict:
    """``throughput`` at batch 256 (5,000 nodes) under cProfile, its listings appended to ``path``
    (under Python 3.12 the sampling thread's sleeps show there as lock waits)."""
    prof = cProfile.Profile()
    prof.enable()
    got = throughput(model, ta, 256, 5000)
    prof.disable()
    if path:
        text = io.StringIO()
        for order in orders:
            pstats.Stats(prof, stream=text).sort_stats(order).print_stats(45)
        with open(path, "a") as f:
            f.write(f"{title}\n{text.getvalue()}\n")
    return got


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def forward_cost(model, batches=(32, 256, 1024), past: int = 16, reps: int = 20) -> List[Dict]:
    """One forward pass of ``batch`` new tokens over ``past`` cached ones, plain transformers (no
    relmql code but its key/value layout): wall ms (synchronized), the GPU's kernel ms in it, and
    ms replayed as a CUDA graph."""
    from relmql.models.attention import preloaded_cache
    from relmql.models.graphs import capture
    m, dev = model.model, model.device
    out = []
    for b in batches:
        gen = torch.Generator(device="cpu").manual_seed(b)
        ids = torch.randint(0, m.config.vocab_size, (b, past + 1), generator=gen).to(dev)
        with torch.no_grad():
            # the executor's own layout: each layer's keys and values in a buffer with room for
            # the new token, written in place (no allocation: the pass can be captured as a graph)
            prefilled = m(ids[:, :past], use_cache=True)[model.passes.cache_arg]
            buffers = []
            for layer in prefilled.layers:
                k = layer.keys.new_empty(*layer.keys.shape[:2], past + 1, layer.keys.shape[-1])
                v = torch.empty_like(k)
                k[:, :, :past], v[:, :, :past] = layer.keys, layer.values
                buffers.append((k, v))

            def step():
                cache = {model.passes.cache_arg: preloaded_cache(buffers, past)}
                return m(ids[:, past:], use_cache=True, **cache).logits

            for _ in range(3):
                step()
            _sync(dev)
            t = time.perf_counter()
            for _ in range(reps):
                step()
            _sync(dev)
            row = {"batch": b, "past": past, "wall_ms": (time.perf_counter() - t) / reps * 1e3}
            if dev.type == "cuda":  # kernel time and graphs: CUDA only
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(reps):
                        step()
                    _sync(dev)
                row["kernels_ms"] = sum(e.self_device_time_total for e in prof.key_averages()) / reps / 1e3
                try:
                    graph, _ = capture(step, dev)
                    graph.replay()
                    _sync(dev)
                    t = time.perf_counter()
                    for _ in range(reps):
                        graph.replay()
                    _sync(dev)
                    row["graph_ms"] = (time.perf_counter() - t) / reps * 1e3
                except Exception as e:  # the model's code could not be captured
                    row["graph_error"] = f"{type(e).__name__}: {e}"[:300]
        out.append(row)
        print(f"forward: {json.dumps(row)}", file=sys.stderr, flush=True)
    return out


def _pct(x) -> str:
    return "—" if x is None else f"{x:.0f}%"


def tables(runs: List[Dict]) -> str:
    """Markdown for docs/benchmarks.md from ``[{"label": ..., "results": <--json output>}, ...]``,
    one run after another (each run on its own machine: compare within a run)."""
    out = []
    for run in runs:
        r, label = run["results"], run["label"]
        out += [f"**{label}** ({r.get('gpu', '?')}, torch {r.get('torch', '?')}; model loaded in "
                f"{r['load']['seconds']:.0f} s)", ""]
        if r.get("host"):
            out += [f"The executor alone on this host (a nearly free model with this model's vocabulary, URL "
                    f"search, batch 256): {r['host']['nodes_per_s']:,.0f} nodes/s.", ""]
        rows = [("float32", t, "") for t in r.get("throughput", [])]
        rows += [("float32", t, "eager forward passes (no CUDA graphs)") for t in r.get("throughput_eager", [])]
        rows += [("float32", t, "one forward pass per batch") for t in r.get("throughput_one_pass", [])]
        rows += [("bfloat16", t, "") for t in r.get("throughput_bf16", [])]
        if rows:
            out += ["| dtype | batch | expanded nodes | nodes/s | forward passes | in forward passes | GPU utilization "
                    "| note |", "|---|---|---|---|---|---|---|---|"]
            out += [f"| {dt} | {t['batch']} | {t['nodes']:,} | {t['nodes_per_s']:,.0f} | {t['forward_calls']} | "
                    f"{t['forward_share']:.0%} | {_pct(t['gpu_utilization'])} | {note} |" for dt, t, note in rows]
            out.append("")
        e = r.get("exact")
        if e:
            out += [f"Exactness (George Washington, top 10): the same rows at batch 32 and 512 "
                    f"({'yes' if e['same_rows_at_512'] else 'NO'}), and as the ReLM-style search "
                    f"({'yes' if e['same_rows_as_relm_style'] else 'NO'}); log-probabilities at batch 32 and 512 "
                    f"{'bit-identical' if e['bit_identical_32_vs_512'] else 'within %.1e' % e['max_diff_32_vs_512']}; "
                    f"against one direct float32 forward pass per row, within {e['max_diff_vs_direct']:.1e}.", ""]
        v = r.get("versus_relm")
        if v:
            out += ["| query | relmql first row | ReLM-style first row | relmql rows/s | ReLM-style rows/s | ratio |",
                    "|---|---|---|---|---|---|"]
            for name, q in v.items():
                a, b = q["relmql"], q["relm-style"]
                out.append(f"| {name} ({a['rows']} rows) | {a['first']:.2f} s | {b['first']:.2f} s | "
                           f"{a['rows_per_s']:.1f} | "
                           f"{b['rows_per_s']:.1f} | **{q['first_ratio']:.1f}× sooner, {q['rows_per_s_ratio']:.1f}× "
                           f"the rows/s** |")
            out.append("")
        f = r.get("forward")
        if f:
            out += ["| one forward pass | wall | GPU kernels in it | kernels' share | as a CUDA graph |",
                    "|---|---|---|---|---|"]
            out += [f"| batch {x['batch']}, 1 new token over {x['past']} | {x['wall_ms']:.1f} ms | "
                    f"{x.get('kernels_ms', 0):.2f} ms | {x.get('kernels_ms', 0) / x['wall_ms']:.0%} | "
                    f"{'%.2f ms' % x['graph_ms'] if 'graph_ms' in x else 'not captured'} |" for x in f]
            out.append("")
    return "\n".join(out).rstrip("\n")


def latest(runs: List[Dict]) -> str:
    """The newest run's tables, and the newest one-pass table if that run has none (the earlier runs
    are history: they stay in docs/gpu-runs.json, not on the page)."""
    out = tables(runs[-1:])
    if not runs[-1]["results"].get("forward"):
        older = [r for r in runs if r["results"].get("forward")]
        if older:
            r = older[-1]
            kept = {k: r["results"][k] for k in ("gpu", "torch", "load", "forward") if k in r["results"]}
            out += "\n\n" + tables([{"label": r["label"], "results": kept}])
    return out


def main(argv: List[str] = None) -> None:
    import argparse
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--device", default="cuda")
    p.add_argument("--nodes", type=int, default=20_000, help="expanded nodes per throughput search, at most")
    p.add_argument("--json", help="write the results here (after each part)")
    p.add_argument("--profile", help="write the batch-256 profile here")
    p.add_argument("--parts", default="host,exact,throughput,eager,relm,profile,logits,forward,bf16")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("torch sees no CUDA GPU here (--device cpu runs the same parts on the CPU)")
    from relmql.automata import compile
    from relmql.models import load_model
    if args.profile:
        open(args.profile, "w").close()  # each part appends its listings
    res: Dict = {"torch": torch.__version__}
    if torch.cuda.is_available():
        res["gpu"] = torch.cuda.get_device_name()

    def save(part, value):
        res[part] = value
        print(f"{part}: {json.dumps(value)}", file=sys.stderr, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)

    t0 = time.perf_counter()
    model = load_model(args.model, device=args.device, dtype="float32")
    save("load", {"seconds": time.perf_counter() - t0, "attention": model.attention})
    url = {}  # the URL automaton of each model's vocabulary, compiled once

    def url_of(m):
        if id(m) not in url:
            url[id(m)] = compile(URL, m.vocabulary, URL_PREFIX)
        return url[id(m)]

    def sweep(ta):  # the URL search at each batch size, the larger ones longer
        return [throughput(model, ta, b, max(args.nodes // 4, min(args.nodes, 40 * b))) for b in BATCHES]

    for part in args.parts.split(","):
        try:
            if part == "exact":
                save("exact", exactness(model))
            elif part == "throughput":
                t = time.perf_counter()
                ta = url_of(model)
                throughput(model, ta, 32, 500)  # warm up
                save("compile_url_seconds", time.perf_counter() - t)
                save("throughput", sweep(ta))
            elif part == "eager":  # the same searches with every forward pass eager (no CUDA graphs)
                ta, graphs = url_of(model), model.passes.graphs
                model.passes.graphs = None
                try:
                    save("throughput_eager", sweep(ta))
                finally:
                    model.passes.graphs = graphs
            elif part == "relm":
                save("versus_relm", versus_relm(model))
            elif part == "profile":
                save("profiled", profiled(model, url_of(model), args.profile, "float32, batch 256"))
            elif part == "logits":
                # each forward pass's float32 logits are capped at hf.LOGITS_BYTES (256 MiB: 256
                # rows of Gemma's 262,144 tokens); with 2 GiB a batch of 1,024 is one pass
                from relmql.models import passes as hf
                ta = url_of(model)
                cap, hf.LOGITS_BYTES = hf.LOGITS_BYTES, 2 ** 31
                try:
                    save("throughput_one_pass", [throughput(model, ta, b, min(args.nodes, 40 * b))
                                                 for b in (512, 1024)])
                finally:
                    hf.LOGITS_BYTES = cap
            elif part == "bf16":
                from relmql.models.loading import wrap as TransformersModel
                half = TransformersModel(model.model.to(torch.bfloat16), model.tokenizer, model.name + "-bf16",
                                         bos_id=model.bos_id, eos_id=model.eos_id)
                ta = url_of(half)
                throughput(half, ta, 32, 500)
                save("bf16_attention", half.attention)
                save("throughput_bf16", [throughput(half, ta, b, 5000) for b in (32, 256)])
                profiled(half, ta, args.profile, "bfloat16, batch 256", ("cumulative",))
            elif part == "host":
                from .executor_bench import stub
                save("host", stub("canonical", 256, vocabulary=model.vocabulary))
            elif part == "forward":
                save("forward", forward_cost(model))
        except Exception as e:  # one part failing leaves the others' figures
            import traceback
            save(f"{part}_error", traceback.format_exc()[-3000:])
            print(f"part {part} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
