"""Fingerprints name the class: two classes of one file whose methods share a name fail with
different fingerprints, the same in eager and compiled runs; a violation recorded before
qualified names were kept reads back with the id it was stored under."""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from typing import Any

import pytest
import torch

from hfadapt.errors import SpyreLoweringError
from hfadapt.spyre.rules.lowering_report import LoweringReport, Violation
from hfadapt.spyre.runner import run_on_device

MODEL_CODE = """
import torch
from torch import nn


class First(nn.Module):
    def forward(self, x):
        return x * torch.pow(1.0 + x.abs(), -1.0)


class Second(nn.Module):
    def forward(self, x):
        return x * torch.pow(2.0 + x.abs(), -1.0)


class Both(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = First()
        self.second = Second()

    def forward(self, x):
        return self.second(self.first(x))
"""


def _report(module: Any, execution: str) -> LoweringReport:
    x = {"x": torch.randn(2, 64, 64, dtype=torch.float16)}
    try:
        return run_on_device(module.Both(), x, execution=execution).report
    except SpyreLoweringError as exc:  # compiled: the whole graph judged, every violation
        assert exc.report is not None
        return exc.report


def _pow_sites(report: LoweringReport) -> dict[str, str]:
    return {
        v.location.site.rsplit(":", 1)[1]: v.fingerprint()
        for v in report.violations
        if v.rule_id == "op.pow.square" and v.location is not None
    }


@pytest.mark.parametrize("execution", ["eager", "compile"])
def test_same_method_name_in_two_classes_gives_two_fingerprints(
    execution: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "two_classes_model.py").write_text(MODEL_CODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("two_classes_model")
    sites = _pow_sites(_report(module, execution))
    assert "Second.forward" in sites, sites
    if execution == "compile":  # every node judged: both classes' pow
        assert set(sites) == {"First.forward", "Second.forward"}, sites
        assert sites["First.forward"] != sites["Second.forward"], sites
    other = _pow_sites(_report(module, "compile" if execution == "eager" else "eager"))
    shared = set(sites) & set(other)
    assert shared and all(sites[k] == other[k] for k in shared), (sites, other)


def test_a_location_stored_without_qualname_keeps_its_fingerprint() -> None:
    loc = {"file": "/x/site-packages/pkg/mod.py", "line": 7, "function": "forward", "code": ""}
    data = {"rule_id": "op.pow.square", "op": "aten::pow.Tensor_Scalar", "message": "m"}
    data |= {"dtypes": ["float16"], "location": loc}
    old = Violation.from_dict(data)
    key = "op.pow.square|aten::pow.Tensor_Scalar|float16|pkg/mod.py:forward"
    assert old.fingerprint() == hashlib.sha1(key.encode()).hexdigest()[:12], old.to_dict()
    new = Violation.from_dict({**data, "location": {**loc, "qualname": "First.forward"}})
    assert new.fingerprint() != old.fingerprint()
    assert Violation.from_dict(new.to_dict()).fingerprint() == new.fingerprint()
    assert new.to_dict()["location"]["qualname"] == "First.forward"
