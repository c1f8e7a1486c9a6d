"""The device's linear products, side by side in one run: the chunked product of DL16 operands
on AMX's bf16 tiles (where the CPU has them), the same product on the fp32 path (MKL's pieces,
then the truncating pass), and stock CPU fp32 ``addmm``, for the linear shapes of an encode of
32 sentences with all-MiniLM-L6-v2 (928 rows) and of BERT-base 8 x 128 (1,024 rows). Each
product takes the bias and, on the device, the DL16 rounding. Interleaved, so load weighs on all
three alike; it also prints how many values the tiles and the fp32 path give differently.

    python benchmarks/bench_matmul.py [--runs 9] [--threads 1]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from machine import report_machine, runs_and_threads, spread

# (rows, K, N): MiniLM's Q/K/V/output (x4 a layer), intermediate, output; BERT-base's
SHAPES = [
    (928, 384, 384),
    (928, 384, 1536),
    (928, 1536, 384),
    (1024, 768, 768),
    (1024, 768, 3072),
    (1024, 3072, 768),
]


def _time(fn: Callable[[], object], reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def _measure(rows: int, k: int, n: int, runs: int, tiles: bool) -> dict[str, float]:
    """One shape's three products, interleaved; their medians in ms (and the share of values
    the tiles give differently)."""
    from hfadapt.spyre.numerics import amx, kernels
    from hfadapt.spyre.numerics.dl16 import DEFAULT_FORMAT, round_dl16

    g = torch.Generator().manual_seed(rows + k + n)
    a = round_dl16(torch.randn(rows, k, generator=g))
    weight = round_dl16(torch.randn(n, k, generator=g) / k**0.5)
    bias = round_dl16(torch.randn(n, generator=g))
    b = weight.t()
    real = amx.product

    def device(use_tiles: bool) -> torch.Tensor:
        amx.product = real if use_tiles else (lambda *args: None)
        try:
            return kernels.chunked_matmul(a, b, 256, 9, bias=bias, fmt=DEFAULT_FORMAT)
        finally:
            amx.product = real

    runs_of: dict[str, Callable[[], object]] = {
        "fp32 path": lambda: device(False),
        "cpu addmm": lambda: torch.addmm(bias, a, b),
    }
    if tiles:
        runs_of = {"tiles": lambda: device(True), **runs_of}
    for fn in runs_of.values():
        fn()  # warm: the weight's tiles are made once and kept
    times: dict[str, list[float]] = {name: [] for name in runs_of}
    for _ in range(runs):
        for name, fn in runs_of.items():
            times[name].append(_time(fn, 5) * 1e3)
    print(f"{rows} x {k} x {n}")
    for name, values in times.items():
        print(f"  {name:10} {spread(values, 'ms', 2)}")
    medians = {name: statistics.median(v) for name, v in times.items()}
    if tiles:
        moved = float((device(True) != device(False)).float().mean())
        print(
            f"  tiles / fp32 path {medians['tiles'] / medians['fp32 path']:.2f}x, "
            f"tiles / addmm {medians['tiles'] / medians['cpu addmm']:.2f}x; "
            f"{moved:.3%} of values differ from the fp32 path"
        )
        medians["moved"] = moved
    return medians


def main(runs: int = 9, threads: int = 1) -> dict[str, dict[str, float]]:
    from hfadapt.spyre.numerics import amx

    torch.set_num_threads(threads)
    report_machine("before")
    tiles = amx.available()
    print(f"AMX tiles: {'yes' if tiles else 'no (this CPU or kernel: the fp32 path only)'}")
    print(f"{threads} thread(s), median of {runs} (each run the mean of 5 calls), in ms")
    results = {f"{r} x {k} x {n}": _measure(r, k, n, runs, tiles) for r, k, n in SHAPES}
    report_machine("after")
    return results


if __name__ == "__main__":
    args = runs_and_threads(__doc__).parse_args()
    main(args.runs, args.threads)
