"""splade-log1p-by-log: SPLADE's ``log1p`` (not a device op) taken through ``log`` in
Goldberg's form keeps log1p's relative accuracy on the device where ``log(1 + x)`` loses it,
and makes the tiny SparseEncoder run and pass on the simulated device; without it the model does
not lower. Numbers are measured and printed."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from support.device import one_thread
from support.pipeline_models import splade_folder

from hfadapt import verdicts
from hfadapt.adapters.registry import discover
from hfadapt.judge.diagnose import diagnose

ADAPTER = "splade-log1p-by-log"
DL16_EPS = 2.0**-10  # DL16 keeps 9 mantissa bits: the unit roundoff at 1 is 2^-10

__all__ = ["one_thread"]  # the fixture, from tests/support


def _log1p_by_log() -> Any:
    adapter = discover(paths=[], entry_points=False).get(ADAPTER)
    return adapter.fn.__globals__["log1p_by_log"]


def _relative_errors(out: torch.Tensor, x: torch.Tensor) -> tuple[float, float, bool]:
    """(max relative error over x > 0, the same over 0 < x < 1e-2, zeros kept exactly zero)."""
    ref = torch.log1p(x)
    got = out.to("cpu").double()
    positive = x > 0
    rel = (got - ref).abs()[positive] / ref[positive]
    small = x[positive] < 1e-2
    return float(rel.max()), float(rel[small].max()), bool((got[~positive] == 0).all())


def test_log1p_through_log_keeps_relative_accuracy_on_the_device(spyre: Any) -> None:
    log1p_by_log = _log1p_by_log()
    x = torch.logspace(-7, 1.5, 2000, dtype=torch.float64)
    x = torch.cat([x, torch.zeros(48, dtype=torch.float64)]).reshape(32, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on_device = x.half().to("spyre")
        x = on_device.to("cpu").double()  # the values the device holds (DL16-rounded)
        plain = _relative_errors(torch.log(1 + on_device), x)
        goldberg = _relative_errors(log1p_by_log(on_device), x)
    print(f"log(1 + x): max rel {plain[0]:.3e}, x < 1e-2: {plain[1]:.3e}; zeros kept {plain[2]}")
    print(
        f"Goldberg:   max rel {goldberg[0]:.3e}, x < 1e-2: {goldberg[1]:.3e}; zeros {goldberg[2]}"
    )
    # 1 + x rounds to 1 below half an ulp of 1: the plain form loses small weights entirely
    assert plain[1] > 0.99, plain
    # Goldberg's Theorem 4 bound, 5 eps; measured ~2.5 eps (2.46e-3) on the simulated device
    assert goldberg[0] <= 5 * DL16_EPS and goldberg[1] <= 5 * DL16_EPS, goldberg
    assert goldberg[2], "an exact zero weight must stay zero (the vector's sparsity)"


@pytest.mark.usefixtures("one_thread")
def test_the_tiny_splade_model_fails_without_the_adapter_and_passes_with_it(
    tmp_path: Path,
) -> None:
    folder = splade_folder(tmp_path / "splade")
    without = diagnose(
        folder, record=False, execution="eager", without_adapters=[ADAPTER],
        localize_failures=False,
    )  # fmt: skip
    refused = [(v.rule_id, v.op) for v in without.report.violations] if without.report else []
    print("without:", without.verdict, without.reason, refused)
    assert without.verdict == verdicts.LOWERING_FAILED, without.reason
    assert [op for rule, op in refused if rule == "op.unsupported"] == ["aten::log1p_"], refused

    with_it = diagnose(folder, record=False, execution="eager")
    sparse = next(
        o for o in with_it.metrics.to_dict()["outputs"] if o["output"] == "sparse_embedding"
    )
    checks = {c["name"]: c["value"] for c in sparse["checks"]}
    print("with:", with_it.verdict, with_it.reason)
    assert with_it.verdict == verdicts.PASS and ADAPTER in with_it.adapters, with_it.reason
    assert checks["min overlap@32"] >= 0.9 and checks["max top-k weight error"] < 0.015, checks
