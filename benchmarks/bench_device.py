"""Eager-device speed: a BERT-base-shaped model (6 layers, hidden 768, 12 heads, random weights)
on batch 8 x 128, CPU fp32 against the simulated ``spyre`` device in fp16, side by side.

    python benchmarks/bench_device.py [--runs 5] [--threads 2]

The device run uses audit mode (``tracking(collect=True)``): the stock model meets ops the card
refuses in eager mode (gelu, gather, ...), which then run on the host so the forward completes.
``main()`` returns the medians and the ratio; a compiled column is one more entry in the
``runners`` dict handed to ``measure()`` (see ``device_runner`` for the shape of a runner)."""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from machine import report_machine, spread

BATCH, SEQ = 8, 128


def build_model(layers: int = 6, seed: int = 0) -> Any:
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        hidden_size=768,
        num_hidden_layers=layers,
        num_attention_heads=12,
        intermediate_size=3072,
        attn_implementation="sdpa",
    )
    return BertModel(config).eval()


def inputs(vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (BATCH, SEQ), generator=g)
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1::2, SEQ // 2 :] = 0  # half the rows padded: the mask path is exercised
    return {"input_ids": ids, "attention_mask": mask}


def measure(
    runners: dict[str, Callable[[], Any]], runs: int, warmup: int = 1
) -> dict[str, list[float]]:
    """Wall-clock seconds of `runs` calls of each runner, interleaved (a, b, a, b, ...) so that
    other load on the machine weighs on every column alike; `warmup` untimed calls first."""
    for run in runners.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(runs):
        for name, run in runners.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def cpu_runner(model: Any, batch: dict[str, torch.Tensor]) -> Callable[[], Any]:
    def run() -> Any:
        with torch.inference_mode():
            return model(**batch).last_hidden_state

    return run


def device_runner(model: Any, batch: dict[str, torch.Tensor]) -> Callable[[], Any]:
    from hfadapt.spyre.eager import device

    device.register()
    on_device = copy.deepcopy(model).half().to("spyre")
    batch = {k: v.to("spyre") for k, v in batch.items()}

    def run() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with device.tracking(collect=True), torch.inference_mode():
                return on_device(**batch).last_hidden_state

    return run


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    report_machine("before")
    model = build_model(args.layers)
    batch = inputs(model.config.vocab_size)
    runners = {"cpu fp32": cpu_runner(model, batch), "device fp16": device_runner(model, batch)}
    times = measure(runners, args.runs)
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ts in times.items():
        print(f"{name:12s} {spread(ts)}")
    ratio = medians["device fp16"] / medians["cpu fp32"]
    print(
        f"ratio device/cpu {ratio:.2f}x (median), {min(times['device fp16']) / min(times['cpu fp32']):.2f}x (min)"
        f"  [{args.layers} layers, batch {BATCH} x {SEQ}, {args.threads} threads]"
    )
    report_machine("after")
    return {**medians, "ratio": ratio}


if __name__ == "__main__":
    main()
