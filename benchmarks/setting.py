"""Where a benchmark ran: the one description of the machine and the library versions that every
benchmark and paper experiment writes beside its results."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

PACKAGES = ("relmql", "torch", "transformers", "tokenizers", "pynini", "numpy", "outlines-core", "ray")


@dataclass(frozen=True)
class Setting:
    """Torch's threads and CPU capability, the machine, the versions and the date of a run."""
    threads: int  # torch's intra-op threads
    cpu: str  # the vector instructions torch's CPU kernels use
    machine: str  # CPU model, cores, memory, operating system
    versions: str  # PACKAGES' versions and Python's
    date: str  # YYYY-MM-DD


def setting() -> Setting:
    """This process's setting, now."""
    import torch
    return Setting(threads=torch.get_num_threads(), cpu=torch.backends.cpu.get_cpu_capability(),
                   machine=_machine(), versions=_versions(), date=time.strftime("%Y-%m-%d"))


def _machine() -> str:
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


def _versions() -> str:
    out = []
    for n in PACKAGES:
        if n == "relmql":  # this checkout's, not the metadata of its (editable) install
            from relmql.version import __version__
            out.append(f"relmql {__version__}")
            continue
        try:
            out.append(f"{n} {md.version(n)}")
        except md.PackageNotFoundError:
            out.append(f"{n} (not installed)")
    return ", ".join(out) + f"; Python {platform.python_version()}"


def command(doc: str, run: Callable[..., dict], tables: Callable[[dict], str], argv: Optional[Sequence[str]] = None,
            options: Sequence[tuple] = ()) -> None:
    """A benchmark's command line: its ``options`` (``(flag, add_argument keywords)``, passed to
    ``run`` by name) and ``--json FILE`` (the raw results); prints ``tables(run(...))``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, kw in options:
        p.add_argument(flag, **kw)
    p.add_argument("--json", help="also write the raw results to this file")
    args = vars(p.parse_args(argv))
    path = args.pop("json")
    results = run(**args)
    if path:
        Path(path).write_text(json.dumps(results, indent=1))
    print(tables(results))
