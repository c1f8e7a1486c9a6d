"""What the ``attention-heads-select`` adapter costs: a BERT-base-shaped model (hidden 768, 12
heads, 2 layers) compiled at 8 x 64 tokens with every bundled adapter, against the same without
it (its head split then meets ``defect.view_transpose_64``: the program misreads the transposed
view, one copy, what ``.contiguous()`` costs). Compile time and run time, side by side in one
run; at 128 tokens the adapter only delegates, so both programs are the same.

    python benchmarks/bench_heads_select.py [--runs 9] [--threads 1]
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch
from machine import report_machine, runs_and_threads, spread


def _model() -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=768,
        num_attention_heads=12,
        intermediate_size=3072,
        num_hidden_layers=2,
        attn_implementation="sdpa",
    )
    return BertModel(config).eval().half()


def main(runs: int = 9, threads: int = 1, tokens: int = 64) -> dict[str, float]:
    from hfadapt.adapters.registry import default_registry
    from hfadapt.spyre.compile.backend import lower

    torch.set_num_threads(threads)
    report_machine("before")
    ids = torch.randint(1000, 2000, (8, tokens))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    registry = default_registry()
    programs = {}
    for name, exclude in (("heads-select", ()), ("without it", ("attention-heads-select",))):
        model = _model()
        registry.apply(model, exclude=exclude)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            start = time.perf_counter()
            run, report = lower(model, inputs)
            run(**inputs)
            compile_s = time.perf_counter() - start
        programs[name] = (run, sorted({f.defect_id for f in report.defects}), compile_s)
    times: dict[str, list[float]] = {name: [] for name in programs}
    with torch.no_grad():
        for _ in range(runs):  # interleaved, so other load weighs on both alike
            for name, (run, _, _) in programs.items():
                start = time.perf_counter()
                run(**inputs)
                times[name].append(time.perf_counter() - start)
    result = {name: statistics.median(t) for name, t in times.items()}
    print(f"BERT-base shape, 2 layers, 8 x {tokens}, fp16, {threads} thread(s), median of {runs}")
    for name, (_, fired, compile_s) in programs.items():
        ms = [t * 1e3 for t in times[name]]
        print(
            f"  {name:13} run {spread(ms, 'ms', 2)}  compile {compile_s:6.2f} s  "
            f"defects fired: {fired or 'none'}"
        )
    ratio = result["heads-select"] / result["without it"]
    print(f"  run-time ratio {ratio:.2f}x (of medians)")
    report_machine("after")
    return {**result, "ratio": ratio}


if __name__ == "__main__":
    parser = runs_and_threads(__doc__)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    main(args.runs, args.threads, args.tokens)
