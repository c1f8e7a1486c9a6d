"""Layout defects of compiled graphs (profile ``defects``, see hfadapt.spyre.compile.defects):
the 64-token head split (torch-spyre#1783) and rotate_half's stick-aligned slice
(torch-spyre#3133)."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from hfadapt.spyre.compile.defect_match import Match, float4d, node_value, packet, position
from hfadapt.spyre.compile.graph_rules import op_name
from hfadapt.spyre.numerics.dl16 import STICK_ELEMENTS
from hfadapt.spyre.rules.op_defects import FP32_STICK, memory_order

__all__ = ["HEAD_LAYOUT_SEQ", "rotate_half_slice", "slice_from_start", "view_transpose_64"]


_VIEWS = frozenset({"aten::view", "aten::_unsafe_view", "aten::reshape"})
HEAD_LAYOUT_SEQ = 64  # the only sequence length torch-spyre#1783 shows failing


def _is_view(node: fx.Node) -> bool:
    return bool(getattr(node.target, "is_view", False)) or op_name(node.target).split(".", 1)[
        0
    ] in ("aten::_unsafe_view", "aten::alias")


def _head_transpose(node: fx.Node) -> bool:
    """transpose(1, 2) or permute(0, 2, 1, 3) of a 4-D value."""
    packet = op_name(node.target).split(".", 1)[0]
    args = list(node.args[1:])
    dims = [d for d in args if isinstance(d, int)]
    if packet == "aten::transpose" and len(args) == 2 and len(dims) == 2:
        return sorted(d % 4 for d in dims) == [1, 2]
    if packet == "aten::permute" and args and isinstance(args[0], (list, tuple)):
        return [int(d) % 4 for d in args[0]] == [0, 2, 1, 3]
    return False


def view_transpose_64(gm: fx.GraphModule) -> list[Match]:
    found = []
    first = position(gm)
    for node in gm.graph.nodes:
        if node.op != "call_function" or not _head_transpose(node):
            continue
        t, src = float4d(node), node.args[0]
        if t is None or t.dtype != torch.float16 or t.shape[2] != HEAD_LAYOUT_SEQ:
            continue
        if t.shape[1] < 2 or memory_order(t) not in (None, (0, 2, 1, 3)):
            continue
        # the head split: a view of [B, S, H * D] as [B, S, H, D]
        if not isinstance(src, fx.Node) or src.op != "call_function":
            continue
        if op_name(src.target).split(".", 1)[0] not in _VIEWS or not src.all_input_nodes:
            continue
        whole, heads = node_value(src.all_input_nodes[0]), node_value(src)
        if whole is None or heads is None or whole.dim() != 3 or heads.dim() != 4:
            continue
        split = tuple(whole.shape[:2]) == tuple(heads.shape[:2])
        if not split or whole.shape[2] != heads.shape[2] * heads.shape[3]:
            continue
        readers = [
            user
            for user in node.users
            if user.op == "call_function"
            and not (_is_view(user) and (v := node_value(user)) is not None and v.is_contiguous())
        ]
        if readers:
            # contiguous or strided source: the card walks the [B, S, H, D] data as [B, H, S, D]
            anchor = min(readers, key=first)
            found.append(Match(node, frozenset(readers), anchor, (0, 2, 1, 3)))
    return found


def _stick(t: torch.Tensor) -> int:
    return FP32_STICK if t.dtype == torch.float32 else STICK_ELEMENTS


def rotate_half_slice(gm: fx.GraphModule) -> list[Match]:
    """torch-spyre#3133: rotate_half's slicing of the last dim at a stick-aligned offset
    (cat((-x2, x1), -1) with x2 = x[..., d/2:]) compiles but computes wrong numbers."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or op_name(node.target).split(".", 1)[0] != "aten::slice":
            continue
        t, src = node_value(node), node.args[0] if node.args else None
        if t is None or not isinstance(src, fx.Node) or (whole := node_value(src)) is None:
            continue
        dim = int(node.args[1]) if len(node.args) > 1 else 0
        start = node.args[2] if len(node.args) > 2 else 0
        if dim % whole.dim() != whole.dim() - 1 or not isinstance(start, int) or start <= 0:
            continue
        if start >= whole.shape[-1] or start % _stick(whole):
            continue  # past the end, or off a stick (layout.stick_slice refuses that)
        readers = [u for u in node.users if u.op == "call_function"]
        hops = readers + [v for u in readers if packet(u) == "aten::neg" for v in u.users]
        if any(packet(u) == "aten::cat" and _cat_last(u) for u in hops):
            found.append(Match(node, frozenset({node}), node))
    return found


def _cat_last(node: fx.Node) -> bool:
    out = node_value(node)
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    return out is not None and isinstance(dim, int) and dim % out.dim() == out.dim() - 1


def slice_from_start(
    x: torch.Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1
) -> torch.Tensor:
    """The slice as the card computes it under #3133 (inferred: the stick-aligned offset is
    dropped, so x[..., d/2:] reads x[..., :d/2])."""
    size = x.shape[dim]
    begin = 0 if start is None else (start + size if start < 0 else start)
    stop = size if end is None else min(size, end + size if end < 0 else end)
    return x.narrow(dim, 0, max(0, stop - begin))
