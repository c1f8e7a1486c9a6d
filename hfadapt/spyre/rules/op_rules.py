"""Judging one ATen call against the device profile: the op's outcome in this mode, the
dtype rules (fp64, fp32-capable ops, casts) and the named layout checks the profile attaches
to rules. Shared by the eager device and the compile backend, so both say the same."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from hfadapt.spyre.rules.lowering_report import SourceLocation, Violation
from hfadapt.spyre.rules.profile import FALLBACK, NATIVE, UNSUPPORTED, Profile, Rule, dtype_name

CheckFn = Callable[..., "Violation | None"]  # (profile, op, args, kwargs[, mode])

_FLOATS_DL16 = (torch.float16, torch.bfloat16)


def iter_tensors(values: object) -> Iterator[Any]:
    """Tensor-like leaves (anything with shape and dtype) of nested args."""
    if isinstance(values, (list, tuple)):
        for v in values:
            yield from iter_tensors(v)
    elif isinstance(values, dict):
        for v in values.values():
            yield from iter_tensors(v)
    elif (
        hasattr(values, "shape")
        and hasattr(values, "dtype")
        and not isinstance(values, torch.dtype)
    ):
        yield values


def _shape(t: Any) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in t.shape)
    except (TypeError, ValueError):  # symbolic sizes
        return tuple(-1 for _ in t.shape)


def _violation(
    rule_id: str,
    op: str,
    message: str,
    kind: str,
    tensors: Sequence[Any],
    location: SourceLocation | None,
    inferred: bool = False,
) -> Violation:
    return Violation(
        rule_id=rule_id,
        op=op,
        message=message,
        kind=kind,
        dtypes=tuple(dtype_name(t.dtype) for t in tensors),
        shapes=tuple(_shape(t) for t in tensors),
        location=location,
        inferred=inferred,
    )


def _arg(
    args: Sequence[object], kwargs: dict[str, object], index: int, name: str, default: object = None
) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[index] if len(args) > index else default


# -- named checks (the profile's "checks" lists refer to these) ----------------------------


def _matmul_k_stick(
    p: Profile, op: str, args: Sequence[object], kwargs: dict[str, object]
) -> Violation | None:
    packet = op.split(".", 1)[0]
    a = args[1] if packet in ("aten::addmm", "aten::baddbmm") else args[0]
    if not hasattr(a, "shape") or len(a.shape) == 0:
        return None
    k = a.shape[-1]
    multiple = p.layout_value("matmul_k_multiple")
    if isinstance(k, int) and k % multiple and not p.matmul_k_padded():
        spec = p.layout["matmul_k_multiple"]
        return _violation(
            spec["rule"],
            op,
            spec["text"].format(k=k, multiple=multiple),
            "layout",
            list(iter_tensors(args)),
            None,
        )
    return None


def _sdpa_head_dim_stick(
    p: Profile, op: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> Violation | None:
    q, k = args[0], args[1]
    if p.matmul_k_padded():
        return None  # the compiler pads Q K^T's and P V's K to whole sticks
    multiple = p.layout_value("head_dim")
    head_dim, kv_len = q.shape[-1], k.shape[-2]
    spec = p.layout["matmul_k_multiple"]
    for dim in (head_dim, kv_len):  # Q @ K^T reduces over head_dim, P @ V over the key length
        if isinstance(dim, int) and dim % multiple:
            return _violation(
                spec["rule"],
                op,
                spec["text"].format(k=dim, multiple=multiple),
                "layout",
                [q, k, args[2]],
                None,
            )
    return None


def _pow_square_only(
    p: Profile, op: str, args: Sequence[object], kwargs: dict[str, object]
) -> Violation | None:
    exponent = _arg(args, kwargs, 1, "exponent")
    if isinstance(exponent, (int, float)) and float(exponent) == 2.0:
        return None
    what = f"pow with exponent {exponent!r}"
    return _violation(
        "op.pow.square",
        op,
        p.message("compile_unsupported", what=what),
        "op",
        list(iter_tensors(args)),
        None,
    )


def _basic_slicing(
    p: Profile, op: str, args: Sequence[object], kwargs: dict[str, object]
) -> Violation | None:
    if not op.startswith("aten::slice"):
        return None
    step = _arg(args, kwargs, 4, "step", 1)
    if step not in (None, 1):
        spec = p.layout["basic_slicing"]
        return _violation(
            spec["rule"], op, spec["text"].format(step=step), "layout", [args[0]], None
        )
    return None


def _stick_slice_offset(
    p: Profile, op: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> Violation | None:
    x = args[0]
    ndim = len(x.shape)
    if ndim == 0:
        return None
    dim = _arg(args, kwargs, 1, "dim", 0)
    dim = dim + ndim if dim < 0 else dim
    if dim != ndim - 1:
        return None
    size = x.shape[-1]
    if op.startswith("aten::select"):
        offset = _arg(args, kwargs, 2, "index", 0)
    else:
        offset = _arg(args, kwargs, 2, "start", 0) or 0
    if isinstance(offset, int) and isinstance(size, int):
        offset = offset + size if offset < 0 else offset
        stick = stick_elements(p, x.dtype)
        # a stick-aligned offset is a whole number of sticks in: the backend takes it
        if offset % stick and offset < size:
            spec = p.layout["stick_slice"]
            text = spec["text"].format(offset=offset, stick=stick)
            return _violation(spec["rule"], op, text, "layout", [x], None)
    return None


def _interleaved_stick_split(
    p: Profile, op: str, args: Sequence[Any], kwargs: dict[str, Any], mode: str = "compile"
) -> Violation | None:
    """torch-spyre#3138: compiled, a reshape that splits the stick (last) dimension into
    ``[.., 2, n / 2]`` with ``n / 2`` below one stick (hf-adapters' RoPE layout [B, L, H, 2,
    D/2] at D/2 = 32) gives the layout pass a stick expression ``32*d3 + d4``, a scaled
    variable it rejects. Eager views run no layout pass."""
    spec = p.layout.get("interleaved_stick_split")
    if spec is None or mode != "compile" or op.split(".", 1)[0] not in _RESHAPES or not args:
        return None
    x, size = args[0], _arg(args, kwargs, 1, "size", None)
    if not hasattr(x, "shape") or not isinstance(size, (list, tuple)) or len(size) < 2:
        return None
    shape, new = _shape(x), [int(s) if isinstance(s, int) else -1 for s in size]
    if not shape or -1 in shape[-1:] or new[-2] != spec.get("value", 2):
        return None
    stick = stick_elements(p, x.dtype)
    half = new[-1]
    if half < 1 or half >= stick or new[-2] * half != shape[-1] or len(new) <= len(shape):
        return None
    rank = len(new)
    text = spec["text"].format(expr=f"{half}*d{rank - 2} + d{rank - 1}", stick=stick)
    return _violation(
        spec["rule"], op, p.message("compile_unsupported", what=text), "layout", [x], None
    )


_RESHAPES = frozenset({"aten::view", "aten::_unsafe_view", "aten::reshape"})


def stick_elements(p: Profile, dtype: torch.dtype) -> int:
    """Elements of ``dtype`` in one stick (128 bytes: 64 fp16, 32 fp32)."""
    size = torch.empty((), dtype=dtype).element_size() if dtype.is_floating_point else 2
    if dtype in _FLOATS_DL16 or dtype == torch.bool:
        size = 2  # stored as DL16
    return max(1, p.layout_value("stick_bytes", 128) // size)


def _reduces_last_dim(
    op: str, args: Sequence[object], kwargs: dict[str, object], ndim: int
) -> bool:
    packet = op.split(".", 1)[0]
    if packet in ("aten::_softmax", "aten::softmax", "aten::_log_softmax"):
        dim = _arg(args, kwargs, 1, "dim", -1)
        return isinstance(dim, int) and dim % max(1, ndim) == ndim - 1
    dim = _arg(args, kwargs, 1, "dim", None)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return True  # over every dim, the stick dim among them
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return any(isinstance(d, int) and d % max(1, ndim) == ndim - 1 for d in dims)


def _fp32_stick_reduction(
    p: Profile, op: str, args: Sequence[Any], kwargs: dict[str, Any]
) -> Violation | None:
    """torch-spyre#2534: an fp32 reduction over a last dimension that is not a whole number
    of fp32 sticks needs coordinate masking, which the backend has only for 16-bit types."""
    spec = p.layout.get("fp32_stick_reduction")
    x = args[0] if args else None
    if spec is None or x is None or getattr(x, "dtype", None) != torch.float32:
        return None
    if not len(x.shape):
        return None
    size, multiple = x.shape[-1], int(spec.get("value", 32))
    if not isinstance(size, int) or size % multiple == 0:
        return None
    if not _reduces_last_dim(op, args, kwargs, len(x.shape)):
        return None
    text = spec["text"].format(size=size, multiple=multiple)
    return _violation(spec["rule"], op, text, "layout", [x], None)


def _cast_allowed(
    p: Profile, op: str, args: Sequence[Any], kwargs: dict[str, Any], mode: str = "compile"
) -> Violation | None:
    packet = op.split(".", 1)[0]
    if packet in ("aten::_to_copy", "aten::to"):
        src = args[0] if args else None
        dst_dtype = kwargs.get("dtype")
        device = kwargs.get("device")
        if device is not None:
            target = torch.device(device).type
            source = getattr(getattr(src, "device", None), "type", None)
            # A transfer to the host casts there. In a compiled graph every tensor lives on
            # the one (simulated) device, so a same-device _to_copy is an on-device cast.
            if target not in ("spyre", "privateuseone") and target != source:
                return None
    elif packet == "aten::copy_":
        dst, src = args[0], args[1]
        dst_dtype = dst.dtype
        if (
            getattr(src, "device", None) is not None
            and src.device.type != getattr(dst, "device", src.device).type
        ):
            return None  # host <-> device transfer
    else:
        return None
    if src is None or dst_dtype is None or not hasattr(src, "dtype"):
        return None
    src_dtype = p.device_dtype(src.dtype)
    dst_dtype = p.device_dtype(dst_dtype)
    if p.cast_allowed_in(src_dtype, dst_dtype, mode):
        return None
    what = f"cast from {dtype_name(src_dtype)} to {dtype_name(dst_dtype)} on the device"
    if mode == "eager" and p.cast_allowed(src_dtype, dst_dtype):
        what += " (dtype casts are not yet supported in eager mode)"
    return _violation(
        p.cast_rule, op, p.message("compile_unsupported", what=what), "dtype", [src], None
    )


# checks whose answer depends on the execution (eager casts, per profile version)
_MODE_CHECKS = frozenset({"cast_allowed", "interleaved_stick_split"})

CHECKS: dict[str, CheckFn] = {
    "fp32_stick_reduction": _fp32_stick_reduction,
    "matmul_k_stick": _matmul_k_stick,
    "sdpa_head_dim_stick": _sdpa_head_dim_stick,
    "pow_square_only": _pow_square_only,
    "basic_slicing": _basic_slicing,
    "stick_slice_offset": _stick_slice_offset,
    "cast_allowed": _cast_allowed,
    "interleaved_stick_split": _interleaved_stick_split,
}


# -- the judgement of one call --------------------------------------------------------------


def judge(
    p: Profile,
    op: str,
    args: Sequence[object],
    kwargs: dict[str, object],
    mode: str,
    outputs: object = None,
    location: SourceLocation | None = None,
) -> tuple[str, Rule, list[Violation]]:
    """Outcome of one ATen call (native, fallback or unsupported) and every violation it
    raises. A native op with violations does not lower; a fallback op is not checked further
    (it runs on the host)."""
    outcome, rule = p.outcome(op, mode)
    tensors = list(iter_tensors(args)) + list(iter_tensors(kwargs))
    found: list[Violation] = []

    if outcome == UNSUPPORTED:
        if mode == "eager":
            message = p.message("eager_unsupported", op=op)
        else:
            message = p.message(
                "compile_unsupported",
                what=f"{op} ({rule.note or 'not in the supported operations'})",
            )
        found.append(_violation(rule.id, op, message, "op", tensors, location, rule.inferred))
        return UNSUPPORTED, rule, found

    for t in tensors + list(iter_tensors(outputs)):
        info = p.dtype_info(t.dtype)
        if info.get("storage") is None:
            msg = p.message("dtype_unsupported", dtype=info.get("error", dtype_name(t.dtype)))
            found.append(_violation(info["rule"], op, msg, "dtype", [t], location))
            break
    if outcome == FALLBACK:
        return (UNSUPPORTED if found else FALLBACK), rule, found

    for name in rule.checks:
        check = CHECKS[name]
        v = check(p, op, args, kwargs, mode) if name in _MODE_CHECKS else check(p, op, args, kwargs)
        if v is not None and v.rule_id == p.cast_rule and p.cast_fallback:
            # torch-spyre#1691: a cast the device cannot do runs on the host, warned and counted
            return (UNSUPPORTED if found else FALLBACK), rule, found
        if v is not None:
            message = v.message
            if mode == "eager" and v.kind == "op":
                # An overload the card has no eager kernel for (pow with exponent 3) says so
                # the way torch's dispatcher does, not with the compiler's text.
                message = p.message("eager_unsupported", op=op)
            found.append(Violation(**{**v.__dict__, "message": message, "location": location}))

    if rule.kind == "compute":
        fp32 = [t for t in tensors if t.dtype == torch.float32]
        if fp32 and not p.fp32_allowed(op):
            msg = p.message("fp32_unsupported", op=op)
            found.append(_violation(p.fp32_rule, op, msg, "dtype", fp32, location))

    spec = p.layout.get("zero_length")
    if spec:
        for t in tensors + list(iter_tensors(outputs)):
            shape = _shape(t)
            if 0 in shape:
                found.append(
                    _violation(
                        spec["rule"],
                        op,
                        spec["text"].format(shape=list(shape)),
                        "layout",
                        [t],
                        location,
                    )
                )
                break
    return (NATIVE if not found else UNSUPPORTED), rule, found


def is_dl16_dtype(dtype: torch.dtype) -> bool:
    return dtype in _FLOATS_DL16
