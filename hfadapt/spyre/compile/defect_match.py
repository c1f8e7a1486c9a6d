"""What a compiled-graph defect trigger reports (``Match``) and the node helpers the triggers
share (hfadapt.spyre.compile.defects, hfadapt.spyre.compile.layout_defects)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx

from hfadapt.spyre.compile.graph_rules import op_name


@dataclass(frozen=True)
class Match:
    """What a trigger found: ``value`` is read wrongly by ``consumers``; ``anchor`` is the node
    reported (the op that misreads)."""

    value: fx.Node
    consumers: frozenset[fx.Node]
    anchor: fx.Node
    order: tuple[int, ...] | None = None  # the misread's memory order, when not the value's own


def node_value(node: fx.Node) -> torch.Tensor | None:
    """The tensor a node's recorded value holds (None for anything else)."""
    value = node.meta.get("val")
    return value if isinstance(value, torch.Tensor) else None


def float4d(node: fx.Node) -> torch.Tensor | None:
    """The node's value when it is a 4-D floating-point tensor."""
    t = node_value(node)
    return t if t is not None and t.dim() == 4 and t.is_floating_point() else None


def position(gm: fx.GraphModule) -> Callable[[fx.Node], int]:
    """A node's index in the graph (the earliest reader is the one reported)."""
    index = {n: i for i, n in enumerate(gm.graph.nodes)}
    return lambda n: index[n]


def packet(node: fx.Node) -> str:
    """A call node's op packet (``aten::slice``), "" for anything else."""
    return op_name(node.target).split(".", 1)[0] if node.op == "call_function" else ""
