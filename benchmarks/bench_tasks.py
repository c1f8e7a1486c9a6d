"""What judging a model with task adapters costs when its tasks share graphs: jina-embeddings-v3
(the bundled config: 24 layers, 1024 wide, five task LoRAs), structural, compiled, with every
bundled adapter, as a sweep judges it (``hfadapt.judge.diagnose.diagnose``), against the same
judging with each task traced afresh (the build before ``hfadapt.spyre.runner.shared_graphs``),
interleaved in one process. The per-task numbers of both must be equal, to the last bit.

    python benchmarks/bench_tasks.py [--runs 3] [--threads 1]
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from machine import report_machine, runs_and_threads, spread


def _judge(folder: Path, shared: bool) -> tuple[float, list[dict[str, Any]]]:
    from hfadapt.judge import task_judging
    from hfadapt.judge.diagnose import diagnose
    from hfadapt.spyre.runner import shared_graphs

    task_judging.shared_graphs = shared_graphs if shared else contextlib.nullcontext  # type: ignore[assignment]
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        diag = diagnose(str(folder), mode="structural", record=False, execution="compile",
                        localize_failures=False)  # fmt: skip
    seconds = time.perf_counter() - start
    task_judging.shared_graphs = shared_graphs  # type: ignore[assignment]
    if diag.verdict != "pass":
        raise SystemExit(f"jina-embeddings-v3 did not pass: {diag.verdict}: {diag.reason}")
    return seconds, list(diag.evidence["tasks"])


def main(runs: int = 3, threads: int = 1) -> dict[str, list[float]]:
    from hfadapt.loading.translate import family_named

    torch.set_num_threads(threads)
    family = family_named("jina_embeddings_v3")
    assert family is not None, "the bundled families lack jina_embeddings_v3"
    config = next(v for v in family.variants if v["name"] == "jina-embeddings-v3")["config"]
    report_machine("before")
    times: dict[str, list[float]] = {"shared": [], "traced": []}
    numbers: dict[str, list[tuple[Any, ...]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "config.json").write_text(json.dumps(config))
        _judge(folder, shared=True)  # warm: imports, host constants, the native kernels
        for _ in range(runs):  # interleaved, so other load weighs on both alike
            for name in times:
                seconds, tasks = _judge(folder, shared=name == "shared")
                times[name].append(seconds)
                got = [(t["task"], t["min_token_cosine"], t["max_norm_error"]) for t in tasks]
                if numbers.setdefault(name, got) != got:
                    raise SystemExit(f"{name}: the numbers changed between runs")
    if numbers["shared"] != numbers["traced"]:
        raise SystemExit(f"shared and traced graphs differ: {numbers}")
    print("diagnose of jina-embeddings-v3 (structural, compiled, 5 tasks), seconds")
    for name, values in times.items():
        print(f"  {name:7} {spread(values, 's', 2)}")
    ratio = statistics.median(times["shared"]) / statistics.median(times["traced"])
    print(f"  shared / traced: {ratio:.2f}x; per-task numbers equal: {numbers['shared']}")
    report_machine("after")
    return times


if __name__ == "__main__":
    args = runs_and_threads(__doc__, runs=3).parse_args()
    main(args.runs, args.threads)
