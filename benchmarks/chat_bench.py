"""What a PROMPT costs a search on the embedded model (SmolLM2-135M, float32, CPU): nodes per
second of the same ranking query with no prompt, with a one-question chat prompt, and with a
conversation of about 500 tokens, searched in turn in one process (the prompt's keys and values
are read once, then every node reads past them), and the seconds that first read of the prompt takes.

    python -m benchmarks.chat_bench [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import statistics
import time
from typing import Dict, List

from .setting import command

QUERY = "SELECT text MATCHING '[A-Z][a-z]{1,9}( [a-z]{1,9}){1,3}\\.' USING topk 40, max_nodes 1500"
SENTENCES = ["The river rose after three days of rain, and the village moved its boats to higher ground.",
             "Most of the old bridges were built of stone, though the newest one is steel and glass.",
             "Farmers in the valley grow wheat, barley and a little fruit along the southern slopes.",
             "In winter the roads close for weeks at a time, so the school keeps a store of food."]


def conversation(turns: int) -> List[tuple]:
    """``turns`` exchanges about a made-up valley, the user asking and the assistant answering."""
    out = [("system", "You answer questions about the valley in one short sentence.")]
    for i in range(turns):
        out += [("user", f"Tell me fact number {i + 1} about the valley, with some detail please."),
                ("assistant", " ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(2)))]
    return out + [("user", "Now describe the valley in your own words.")]


def _sql(messages) -> str:
    if messages is None:
        return QUERY
    args = ", ".join(f"'{r}', '{c}'" for r, c in messages)
    return f"{QUERY[:QUERY.index(' USING')]} PROMPT chat({args}){QUERY[QUERY.index(' USING'):]}"


def search(con, sql: str) -> Dict[str, float]:
    """One search of ``sql``: its expanded nodes and seconds (the prompt already read)."""
    from relmql.engine import compile_plan, load
    from relmql.execute import SearchStats, shortest_path
    from relmql.plan import plan
    from relmql.syntax import parse_one
    qplan = plan(parse_one(sql), sql, con.settings)
    model = load(qplan, con.models)
    automaton = compile_plan(qplan, model)
    if hasattr(model, "prompt_state"):
        model.prompt_state()
    stats = SearchStats()
    t = time.perf_counter()
    rows = sum(1 for _ in shortest_path(automaton, model, qplan.decoding, qplan.traversal, None, stats))
    wall = time.perf_counter() - t
    return {"nodes": stats.expanded, "rows": rows, "seconds": wall, "nodes_per_s": stats.expanded / wall}


def prompt_read(con, messages) -> Dict[str, float]:
    """The rendered prompt's tokens and the seconds of its first read (a fresh prompted view)."""
    from relmql.engine import load
    from relmql.plan import plan
    from relmql.syntax import parse_one
    sql = _sql(messages)
    model = load(plan(parse_one(sql), sql, con.settings), con.models)
    t = time.perf_counter()
    model.prompt_state()
    return {"tokens": len(model.rendered.ids), "seconds": time.perf_counter() - t}


def run(rounds: int = 3) -> dict:
    import relmql
    con = relmql.connect()
    cases = {"no PROMPT": None, "chat, one question": [("user", "Describe a valley in one sentence.")],
             "chat, a long conversation": conversation(7)}
    got: Dict[str, List[dict]] = {k: [] for k in cases}
    for k, messages in cases.items():
        search(con, _sql(messages))  # warm: the model, the automaton's arcs, the prompt's keys and values
    for _ in range(rounds):
        for k, messages in cases.items():
            got[k].append(search(con, _sql(messages)))
    read = {k: prompt_read(con, m) for k, m in cases.items() if m is not None}
    out = {}
    for k, runs in got.items():
        out[k] = {"nodes": runs[0]["nodes"], "nodes_per_s": statistics.median(r["nodes_per_s"] for r in runs),
                  "low": min(r["nodes_per_s"] for r in runs), "high": max(r["nodes_per_s"] for r in runs)}
        if k in read:
            out[k].update(prompt_tokens=read[k]["tokens"], prompt_seconds=read[k]["seconds"])
    return {"rounds": rounds, "query": QUERY, "results": out}


def tables(data: dict) -> str:
    """The Markdown table of ``run``'s results, with the ratio to the query without a prompt."""
    res = data["results"]
    base = res["no PROMPT"]["nodes_per_s"]
    lines = [f"`{data['query']}` on SmolLM2-135M (float32), median of {data['rounds']} searches each, in turn:",
             "", "| PROMPT | prompt tokens | first read of the prompt | expanded nodes | nodes/s | range | "
                 "ratio to no PROMPT |", "|---|---:|---:|---:|---:|---|---:|"]
    for k, r in res.items():
        tokens = f"{r['prompt_tokens']:,}" if "prompt_tokens" in r else "—"
        read = f"{r['prompt_seconds']:.2f} s" if "prompt_seconds" in r else "—"
        lines.append(f"| {k} | {tokens} | {read} | {r['nodes']:,} | {r['nodes_per_s']:,.0f} | "
                     f"{r['low']:,.0f}–{r['high']:,.0f} | {r['nodes_per_s'] / base:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    command(__doc__, run, tables, argv, options=[("--rounds", {"type": int, "default": 3})])


if __name__ == "__main__":
    main()
