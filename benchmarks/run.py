"""Run every benchmark and write docs/benchmarks.md (machine, versions, date, results).

    python benchmarks/run.py
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compile_bench  # noqa: E402


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 2**20:.0f} GiB RAM"
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {mem}; {platform.system()} {platform.release()}"


def versions() -> str:
    import importlib.metadata as md
    names = ["relmql", "torch", "transformers", "tokenizers", "pynini", "numpy", "outlines-core"]
    out = []
    for n in names:
        try:
            out.append(f"{n} {md.version(n)}")
        except md.PackageNotFoundError:
            out.append(f"{n} (not installed)")
    return ", ".join(out) + f"; Python {platform.python_version()}"


def main():
    rows = compile_bench.run()
    text = (HERE.parent / "docs" / "benchmarks.template.md").read_text()
    text = (text.replace("{{date}}", datetime.date.today().isoformat())
                .replace("{{machine}}", machine())
                .replace("{{versions}}", versions())
                .replace("{{compile_table}}", compile_bench.table(rows))
                .replace("{{compile_reading}}", compile_bench.reading(rows)))
    out = HERE.parent / "docs" / "benchmarks.md"
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
