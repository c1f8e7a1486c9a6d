"""Ops the card lowers whole that PyTorch would decompose first.

``torch.nn.functional.rms_norm`` and ``softmax(x, dim, dtype=...)`` are CompositeImplicit in
ATen: before any backend sees them, PyTorch rewrites them into fp32 upcasts, ``pow`` and
``_softmax`` on fp32, which the profile then refuses (``aten::pow.Tensor_Scalar on
DataFormats.IEEE_FP32``). The card has native rms_norm and softmax kernels that run in the
input's dtype, so the simulator judges the op before decomposition:

- compiled: ``keep_native`` rewrites Dynamo's graph before the ATen capture so that these
  calls go to the custom ops below (``hfadapt_spyre::rms_norm``, ``hfadapt_spyre::softmax``),
  which stay whole in the ATen graph; ``ALIASES`` gives the profile's name for them
  (``aten::rms_norm``, ``aten::softmax.int``);
- eager: the device registers PrivateUse1 kernels for ``aten::rms_norm`` and
  ``aten::softmax.int`` (which hides the CompositeImplicit kernel) and does not decompose them.

Model code that itself upcasts to fp32 and calls ``pow`` (HF's RMSNorm modules) is unchanged:
that is the model's upcast, not PyTorch's, and still needs its adapter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

NAMESPACE = "hfadapt_spyre"
_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define("rms_norm(Tensor input, int[] normalized_shape, Tensor? weight, float? eps) -> Tensor")
_lib.define("softmax(Tensor input, int dim, ScalarType? dtype) -> Tensor")

# the profile's name for each custom op
ALIASES = {
    f"{NAMESPACE}::rms_norm": "aten::rms_norm",
    f"{NAMESPACE}::softmax": "aten::softmax.int",
}


def _rms_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    eps: float | None,
) -> torch.Tensor:
    out: torch.Tensor = torch.ops.aten.rms_norm.default(input, list(normalized_shape), weight, eps)
    return out


def _softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None) -> torch.Tensor:
    out: torch.Tensor = torch.ops.aten.softmax.int(input, dim, dtype)
    return out


def _rms_norm_fake(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    eps: float | None,
) -> torch.Tensor:
    return torch.empty_like(input)


def _softmax_fake(input: torch.Tensor, dim: int, dtype: torch.dtype | None) -> torch.Tensor:
    return torch.empty_like(input, dtype=dtype or input.dtype)


_lib.impl("rms_norm", _rms_norm, "CompositeExplicitAutograd")
_lib.impl("softmax", _softmax, "CompositeExplicitAutograd")
_lib.impl("rms_norm", _rms_norm_fake, "Meta")
_lib.impl("softmax", _softmax_fake, "Meta")


# Their derivatives, so that a model compiled with grad enabled (nn.RMSNorm's weight requires
# grad) keeps the ops whole as well: the card runs the forward; the backward is only traced.
def _rms_norm_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    x, normalized_shape, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    ctx.eps = torch.finfo(x.dtype).eps if eps is None else eps


def _rms_norm_backward(ctx: Any, grad: torch.Tensor) -> tuple[object, ...]:
    # y = w * x * r, r = rsqrt(mean(x^2) + eps):
    # dx = w g r - x r^3 mean(w g x); dw = sum over the batch of g x r
    x, weight = ctx.saved_tensors
    n = 1
    for d in ctx.dims:
        n *= x.shape[d]
    r = torch.rsqrt((x * x).mean(ctx.dims, keepdim=True) + ctx.eps)
    wg = grad * weight if weight is not None else grad
    dx = wg * r - x * r * r * r * (wg * x).sum(ctx.dims, keepdim=True) / n
    dw = None
    if weight is not None and ctx.needs_input_grad[2]:
        batch = tuple(range(x.dim() - len(ctx.dims)))
        dw = (grad * x * r).sum(batch) if batch else grad * x * r
    return dx, None, dw, None


def _softmax_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(output)
    ctx.dim = inputs[1]
    ctx.input_dtype = inputs[0].dtype


def _softmax_backward(ctx: Any, grad: torch.Tensor) -> tuple[object, ...]:
    (y,) = ctx.saved_tensors
    dx = y * (grad - (grad * y).sum(ctx.dim, keepdim=True))
    return dx.to(ctx.input_dtype), None, None


torch.library.register_autograd(
    f"{NAMESPACE}::rms_norm", _rms_norm_backward, setup_context=_rms_norm_setup, lib=_lib
)
torch.library.register_autograd(
    f"{NAMESPACE}::softmax", _softmax_backward, setup_context=_softmax_setup, lib=_lib
)


def rms_norm(
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:
    """aten::rms_norm kept whole (a decomposition-table entry for the compile capture)."""
    return torch.ops.hfadapt_spyre.rms_norm(input, list(normalized_shape), weight, eps)  # type: ignore[no-any-return]


def softmax(input: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten::softmax.int kept whole (a decomposition-table entry for the compile capture)."""
    return torch.ops.hfadapt_spyre.softmax(input, dim, dtype)  # type: ignore[no-any-return]


_RMS_NORM = (torch.nn.functional.rms_norm, torch.rms_norm)
_SOFTMAX = (torch.softmax, torch.nn.functional.softmax)


def _softmax_call(node: torch.fx.Node) -> tuple[object, object, object] | None:
    """(input, dim, dtype) of a softmax call that names a dtype, else None."""
    if node.op == "call_function" and node.target in _SOFTMAX:
        args = list(node.args)
        dim = node.kwargs.get("dim", args[1] if len(args) > 1 else None)
        dtype = node.kwargs.get("dtype", args[3] if len(args) > 3 else None)
    elif node.op == "call_method" and node.target == "softmax":
        args = list(node.args)
        dim = node.kwargs.get("dim", args[1] if len(args) > 1 else None)
        dtype = node.kwargs.get("dtype", args[2] if len(args) > 2 else None)
    else:
        return None
    if dtype is None or dim is None or not args:
        return None
    return args[0], dim, dtype


def keep_native(gm: torch.fx.GraphModule) -> int:
    """Rewrite a Dynamo graph in place so that ``F.rms_norm`` and ``softmax(..., dtype=)``
    reach the ATen capture whole (as the custom ops above). Returns how many calls moved."""
    moved = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _RMS_NORM:
            args = list(node.args)
            names = ("input", "normalized_shape", "weight", "eps")
            values = [
                node.kwargs.get(n, args[i] if len(args) > i else None) for i, n in enumerate(names)
            ]
            node.target = rms_norm
            node.args, node.kwargs = tuple(values), {}
            moved += 1
            continue
        call = _softmax_call(node)
        if call is not None:
            node.op, node.target = "call_function", softmax
            node.args, node.kwargs = call, {}
            moved += 1
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved
