"""Graphs for the bounded-proof and proven-folder tests (not a test file): softsign as captured,
and hostile variants of it: one that allocates a huge tensor, one whose proof takes long."""

from __future__ import annotations

import copy
import json
from typing import Any

import torch
from safetensors.torch import save

from hfadapt.agent import evalcases as ec
from hfadapt.graphs.capture import capture_method


def _softsign(self: Any, x: torch.Tensor) -> torch.Tensor:
    return x * torch.reciprocal(1.0 + x.abs())


def good_graph() -> dict[str, Any]:
    m, args, kwargs = ec.softsign_example(0)
    art = capture_method(m.float(), _softsign, args, kwargs)
    graph: dict[str, Any] = art.to_json()
    return graph


def files_of(graph: dict[str, Any]) -> dict[str, bytes]:
    return {"graph.json": json.dumps(graph).encode(), "constants.safetensors": save({})}


def with_full(size: list[int]) -> dict[str, Any]:
    """softsign + full(size, 0.0)[0, 0]: the same values, after allocating ``size`` (one
    element read back, so no static rule refuses it first: the size bounds must)."""
    g = copy.deepcopy(good_graph())
    n = len(g["inputs"]) + len(g["nodes"])  # the next value's index
    out = g["output"]["ref"]
    g["nodes"] += [
        {
            "op": "aten::full.default",
            "args": [{"list": size}, {"f": 0.0}],
            "kwargs": {"dtype": {"dtype": "$dtype"}},
        },
        {"op": "aten::select.int", "args": [{"ref": n}, 0, 0], "kwargs": {}},
        {"op": "aten::select.int", "args": [{"ref": n + 1}, 0, 0], "kwargs": {}},
        {"op": "aten::add.Tensor", "args": [{"ref": out}, {"ref": n + 2}], "kwargs": {}},
    ]
    g["output"] = {"ref": n + 3}
    return g


def slow_graph(length: int = 19_000) -> dict[str, Any]:
    """softsign times 1.0, ``length`` times over: exact, valid, and slow to prove."""
    g = copy.deepcopy(good_graph())
    n = len(g["inputs"]) + len(g["nodes"])
    prev = g["output"]["ref"]
    for i in range(length):
        g["nodes"].append(
            {"op": "aten::mul.Tensor", "args": [{"ref": prev}, {"f": 1.0}], "kwargs": {}}
        )
        prev = n + i
    g["output"] = {"ref": prev}
    return g
