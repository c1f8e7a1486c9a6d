"""What every benchmark prints beside its numbers, so a figure can be checked on another machine:
the machine (cores, CPU model, memory), the software, the load average before and after, and
each measurement as median, min and max over its runs.

    from machine import report_machine, spread
    report_machine("before")          # at the start
    print("cpu fp32", spread(times))  # median 0.476 s (min 0.470, max 0.491; 5 runs)
    report_machine("after")           # at the end: a load that changed shows

Scripts run as ``python benchmarks/NAME.py``: this folder is then on ``sys.path``."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from collections.abc import Sequence
from importlib import metadata


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def report_machine(when: str = "before") -> None:
    """Print the machine and software (at the start) or just the load (at the end)."""
    if when == "before":
        print(
            f"machine: {os.cpu_count()} cores, {cpu_model()}, {memory_gib():.0f} GiB; "
            f"Python {platform.python_version()}, torch {_version('torch')}, "
            f"transformers {_version('transformers')}, hfadapt {_version('hfadapt')}"
        )
    print(f"load average (1, 5, 15 min) {when}: {load_average()}", flush=True)


def spread(values: Sequence[float], unit: str = "s", digits: int = 3) -> str:
    """``median X unit (min Y, max Z; N runs)``."""
    med, low, high = statistics.median(values), min(values), max(values)
    return (
        f"median {med:.{digits}f} {unit} (min {low:.{digits}f}, max {high:.{digits}f}; "
        f"{len(values)} runs)"
    )


def byte_compile(checkout: str | None = None) -> str:
    """Byte-compile hfadapt's modules (``checkout``'s, else the imported package's), as pip does
    when it installs a package: a fresh-process benchmark then loads hfadapt from bytecode, as it
    loads torch and transformers. Without it, a machine that sets PYTHONDONTWRITEBYTECODE (as
    some CI images do) compiles hfadapt's ~200 modules from source in every process (about
    0.25 s of a diagnose). The bundled adapters always run from their checked source text.
    Returns the line to print."""
    import compileall
    import importlib.util
    from pathlib import Path

    if checkout is not None:
        folder = Path(checkout) / "hfadapt"
    else:
        spec = importlib.util.find_spec("hfadapt")
        if spec is None or not spec.submodule_search_locations:
            return "hfadapt byte-compiled: no (not importable)"
        folder = Path(next(iter(spec.submodule_search_locations)))
    ok = compileall.compile_dir(str(folder), quiet=1, workers=1)
    return f"hfadapt byte-compiled (as pip does on install): {folder} {'ok' if ok else 'FAILED'}"


def runs_and_threads(doc: str | None, runs: int = 9, threads: int = 1) -> argparse.ArgumentParser:
    """The command line most benchmarks take, ``--runs`` and ``--threads``, described by the
    first paragraph of the script's ``doc``; a script adds its own options before parsing."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--threads", type=int, default=threads)
    return parser
