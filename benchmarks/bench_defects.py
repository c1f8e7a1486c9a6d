"""What a device defect costs the simulator: a compiled attention block whose Q/K/V reach SDPA
as transposed views (the profile's ``defect.transpose_sdpa_noncontiguous`` fires: the program
misreads them, one copy each) against the same block with ``.contiguous()`` (no defect), side
by side in one run. The misread should cost about what the copies of ``.contiguous()`` cost.

    python benchmarks/bench_defects.py [--runs 9] [--threads 1]
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch
from machine import report_machine, runs_and_threads, spread
from torch.nn import functional as F


class Attention(torch.nn.Module):
    """Self-attention shaped like transformers': [B, S, H, D] views transposed for SDPA."""

    def __init__(self, heads: int, hidden: int, contiguous: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.heads, self.contiguous = heads, contiguous
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (
            lin(x).view(b, s, self.heads, h // self.heads).transpose(1, 2) for lin in self.qkv
        )
        if self.contiguous:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, h)


def main(runs: int = 9, threads: int = 1) -> dict[str, float]:
    from hfadapt.spyre.compile.backend import lower

    torch.set_num_threads(threads)
    report_machine("before")
    x = torch.randn(8, 128, 256).half()
    programs = {}
    for name, contiguous in (("defect fires", False), ("contiguous", True)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run, report = lower(Attention(4, 256, contiguous).half(), (x,))
        programs[name] = (run, [f.defect_id for f in report.defects])
        run(x)
    times: dict[str, list[float]] = {name: [] for name in programs}
    for _ in range(runs):  # interleaved, so other load weighs on both alike
        for name, (run, _) in programs.items():
            start = time.perf_counter()
            run(x)
            times[name].append(time.perf_counter() - start)
    result = {name: statistics.median(t) for name, t in times.items()}
    print(f"attention 8 x 128 x 256, 4 heads, fp16, {threads} thread(s), median of {runs}")
    for name, (_, fired) in programs.items():
        ms = [t * 1e3 for t in times[name]]
        print(f"  {name:14} {spread(ms, 'ms', 2)}  defects fired: {fired or 'none'}")
    ratio = result["defect fires"] / result["contiguous"]
    print(f"  ratio {ratio:.2f}x (of medians)")
    report_machine("after")
    return {**result, "ratio": ratio}


if __name__ == "__main__":
    args = runs_and_threads(__doc__).parse_args()
    main(args.runs, args.threads)
