"""hfadapt.spyre.runner.shared_graphs: inside the block a compiled run reuses the previous run's
graphs when Dynamo's guards accept the new model (the same classes, other weights), with the
numbers a fresh trace gives; a model the guards refuse is lowered afresh; outside the block
every compiled run traces its model."""

from __future__ import annotations

import copy

import torch
from torch import nn

from hfadapt.spyre.compile.backend import lower, relower
from hfadapt.spyre.runner import DeviceRun, run_on_device, shared_graphs

WIDTH, TOKENS = 128, 64


class Stack(nn.Module):
    """Linear layers with a residual and a ReLU: lowers on the device."""

    def __init__(self, seed: int, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + torch.relu(layer(x))
        return x


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(2, TOKENS, WIDTH, generator=g).half()}


def _run(model: nn.Module) -> DeviceRun:
    return run_on_device(copy.deepcopy(model), _inputs(), execution="compile")


def test_a_model_differing_only_in_weights_runs_on_the_graphs_compiled_before() -> None:
    first, second, deeper = Stack(seed=0), Stack(seed=1), Stack(seed=1, layers=3)
    traced = {"second": _run(second), "deeper": _run(deeper)}  # outside the block
    with shared_graphs():
        runs = {"first": _run(first), "second": _run(second), "deeper": _run(deeper)}
    after = _run(second)
    reused = {name: run.report.graphs_reused for name, run in runs.items()}
    seconds = {name: round(run.report.compile_seconds, 3) for name, run in runs.items()}
    print(f"\nreused {reused}; compile seconds {seconds}, traced afresh "
          f"{round(traced['second'].report.compile_seconds, 3)}")  # fmt: skip
    assert reused == {"first": False, "second": True, "deeper": False}, reused
    assert not traced["second"].report.graphs_reused and not after.report.graphs_reused
    # the reused graphs read the second model's weights: a fresh trace's numbers, bit for bit
    assert torch.equal(runs["second"].outputs, traced["second"].outputs), float(
        (runs["second"].outputs - traced["second"].outputs).abs().max()
    )
    assert not torch.equal(runs["first"].outputs, runs["second"].outputs)
    # a third layer: Dynamo's guards refuse the graphs, so it was traced and judged afresh
    assert torch.equal(runs["deeper"].outputs, traced["deeper"].outputs)
    assert runs["second"].report.to_dict()["graphs_reused"] is True
    assert runs["second"].report.ok and runs["second"].report.graph_count >= 1, runs[
        "second"
    ].report


def test_graphs_judged_under_another_profile_are_not_reused() -> None:
    """relower refuses a profile other than the one the graphs were judged under (the rules
    and numerics differ): the caller lowers afresh."""
    model = Stack(seed=0).half()
    lowered, report = lower(model, _inputs(), "spyre-2026.07")
    graphs = lowered.graphs()
    assert report.ok and graphs is not None, report.summary()
    other = copy.deepcopy(model)
    assert relower(graphs, other, _inputs(), "spyre-2026.10") is None
    same = relower(graphs, other, _inputs(), "spyre-2026.07")
    assert same is not None and same[1].graphs_reused, same
