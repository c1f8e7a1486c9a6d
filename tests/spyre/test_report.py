"""The lowering report of the compiled path: JSON round trip, fingerprints stable across runs,
deduplication within a graph and across graphs."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from hfadapt.spyre.compile.backend import describe
from hfadapt.spyre.rules.lowering_report import LoweringReport

pytestmark = pytest.mark.usefixtures("spyre_backend")


def fp16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).half()


class Mixed(nn.Module):
    """Two violations, one host fallback."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.pow(x, 3.0) + torch.tril(x)
        return y + torch.erf(x)


class Repeats(nn.Module):
    """The same violating line three times on one shape and once on another."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = self.cube(x)
        return self.cube(x[:32])

    def cube(self, x: torch.Tensor) -> torch.Tensor:
        return torch.pow(x, 3.0)


def test_json_round_trip(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    _, report = spyre_backend.lower(Mixed(), (fp16(64, 64),))
    assert len(report.violations) == 2 and report.fallbacks["aten::tril"] == 1, report.summary()
    text = report.to_json()
    again = LoweringReport.from_json(text)
    assert again.to_dict() == report.to_dict()
    assert again.fingerprints() == report.fingerprints()
    data = json.loads(text)
    assert data["mode"] == "compile" and data["graph_count"] == 1 and data["ok"] is False
    assert data["compile_seconds"] > 0, data["compile_seconds"]
    locations = [v["location"] for v in data["violations"]]
    assert all(loc["file"] == __file__ and loc["function"] == "forward" for loc in locations)


def test_the_error_pickles_with_its_report() -> None:
    import pickle

    from hfadapt.errors import SpyreLoweringError

    with pytest.raises(SpyreLoweringError) as info:
        torch.compile(Mixed(), backend="spyre")(fp16(64, 64))
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value)
    assert again.report.to_dict() == info.value.report.to_dict()


def test_fingerprints_are_stable_across_runs(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    runs = []
    for _ in range(2):
        torch._dynamo.reset()
        _, report = spyre_backend.lower(Mixed(), (fp16(64, 64),))
        runs.append((report.fingerprints(), [describe(v) for v in report.violations]))
    assert runs[0] == runs[1]
    assert len(runs[0][0]) == 2


def test_dedupe_by_call_site_and_shape(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    _, report = spyre_backend.lower(Repeats(), (fp16(64, 64),))
    shapes = sorted(v.shapes for v in report.violations)
    # four pow calls: three on (64, 64) collapse into one, (32, 64) is its own entry
    assert shapes == [((32, 64),), ((64, 64),)], [str(v) for v in report.violations]
    assert len(report.fingerprints()) == 1
    assert report.ops_seen["aten::pow.Tensor_Scalar"] == 4, dict(report.ops_seen)


def test_graphs_merge_into_one_deduplicated_report(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.cube(x)
            torch._dynamo.graph_break()
            return self.cube(x)

        def cube(self, x: torch.Tensor) -> torch.Tensor:
            return torch.pow(x, 3.0)

    with pytest.warns(UserWarning, match=r"1 graph-break event\(s\), 2 graph\(s\)"):
        _, report = spyre_backend.lower(Broken(), (fp16(64, 64),))
    assert report.graph_count == 2, report.summary()
    assert len(report.violations) == 1, [str(v) for v in report.violations]
    assert report.summary().startswith("1 violation(s) (compile, profile spyre-2026.07)")
