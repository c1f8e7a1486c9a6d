"""What happens to one ATen call on the eager ``spyre`` device: judge it against the profile
(``checks.judge``), then run it natively on the held CPU tensors (fp32 compute, DL16-rounded
outputs), on the host (a fallback: warned and counted), or refuse it (the upstream message);
record everything in the thread's report.

The path is kept lean because every op of a forward pass takes it: per-OpOverload facts are
cached, the model source location is only looked up for a violation, and the logical output
dtype comes from a meta run only when the held dtypes make it ambiguous (cached per signature)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hfadapt import torch_internals as ti
from hfadapt.errors import SpyreOpNotImplementedError
from hfadapt.spyre import heap
from hfadapt.spyre.eager import fusion
from hfadapt.spyre.eager.compiled_call import spyre_compiled_call
from hfadapt.spyre.eager.defects import any_fires, eager_defects, eager_sdpa, fired
from hfadapt.spyre.eager.dtypes import logical_dtypes
from hfadapt.spyre.eager.selection import thread_index
from hfadapt.spyre.eager.tensor import (
    SpyreTensor,
    copy_into,
    is_dl16,
    set_handler,
    spyre_device,
    store,
    to_host,
    wrap,
)
from hfadapt.spyre.eager.transfers import TRANSFERS
from hfadapt.spyre.numerics import kernels
from hfadapt.spyre.numerics.dl16 import round_dl16_
from hfadapt.spyre.numerics.scalars import device_numbers
from hfadapt.spyre.numerics.value_preserving import VALUE_PRESERVING, preserves_values
from hfadapt.spyre.rules.op_rules import judge
from hfadapt.spyre.rules.profile import FALLBACK, UNSUPPORTED, Profile
from hfadapt.spyre.rules.tracking import (
    Collector,
    SpyreFallbackWarning,
    current,
    refuse,
    warn_from_model,
)

aten = torch.ops.aten

# Fallbacks that only move data: running them on the held tensors and passing the result
# through the host dtype is bit-identical to copying every input to the host (no need to
# convert a whole embedding table per call).
_MOVE_ONLY_FALLBACKS = frozenset({"aten::embedding", "aten::tril", "aten::triu"})
# Index ops accept host index tensors next to device tensors, as on any torch device.
_HOST_INDEX_OK = frozenset(
    {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}
)


@dataclasses.dataclass
class OpEntry:
    """What the dispatch path needs to know about one OpOverload under one profile and mode."""

    name: str
    outcome: str
    decompose: bool
    mutated: tuple[int, ...]  # positions of args written in place
    out_names: tuple[str, ...]  # out= kwargs
    view: bool  # returns an alias of its first input
    value_preserving: bool
    kernel: kernels.Kernel | None
    special: Callable[..., Any] | None
    defects: tuple[Any, ...] = ()  # the profile's per-op defects that can fire for this op
    fusable: bool = False  # may wait in a row program (fusion.FUSED_OPS)
    # judged otherwise in a compiled call (an outcome, a cast, a defect of one mode only)
    mode_sensitive: bool = False
    # signatures of calls judged clean (see _judge_clean): the same call is not judged again
    clean: set[Any] = dataclasses.field(default_factory=set)


_entries: dict[tuple[int, str], tuple[Profile, dict[Any, OpEntry]]] = {}


def op_entry(profile: Profile, mode: str, func: ti.OpOverload) -> OpEntry:
    key = (id(profile), mode)
    slot = _entries.get(key)
    if slot is None or slot[0] is not profile:
        slot = _entries[key] = (profile, {})
    entry = slot[1].get(func)
    if entry is None:
        entry = slot[1][func] = _build_entry(profile, mode, func)
    return entry


def _build_entry(profile: Profile, mode: str, func: ti.OpOverload) -> OpEntry:
    name = func.name()
    schema = func._schema
    outcome, _ = profile.outcome(name, mode)
    mutated = tuple(
        i
        for i, a in enumerate(schema.arguments)
        if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only
    )
    out_names = tuple(a.name for a in schema.arguments if a.is_out)
    view = bool(schema.returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
    )
    packet = name.split(".", 1)[0]
    return OpEntry(
        name=name,
        outcome=outcome,
        decompose=func not in _SPECIAL_DECOMPOSITIONS
        and func not in _KEPT_WHOLE
        and ti.dispatch_has_kernel(name, "CompositeImplicitAutograd"),
        mutated=mutated,
        out_names=out_names,
        view=view and func is not aten.view.dtype,
        value_preserving=packet in VALUE_PRESERVING,
        kernel=kernels.native_kernel(name, profile.numeric_params),
        special=TRANSFERS.get(func),
        defects=eager_defects(profile, name, mode),
        fusable=name in fusion.FUSED_OPS,
        mode_sensitive=(
            profile.outcome(name, "eager")[0] != profile.outcome(name, "compile")[0]
            or packet in _CASTS
            or eager_defects(profile, name, "eager") != eager_defects(profile, name, "compile")
        ),
    )


# ops whose judgement may depend on the execution (casts are eager-only or compile-only)
_CASTS = frozenset({"aten::_to_copy", "aten::to", "aten::copy_", "aten::_copy_from"})


# -- the entry point -------------------------------------------------------------------------


def dispatch(func: ti.OpOverload, args: tuple[object, ...], kwargs: dict[str, object]) -> Any:
    if not heap.kept:
        heap.keep_freed_memory()
    collector = current()
    entry = op_entry(collector.profile, collector.mode, func)
    if not entry.fusable:
        fusion.settle()  # the waiting row program runs before any op that may read or write
    if entry.mode_sensitive and collector.mode == "eager" and spyre_compiled_call():
        # a compiled call Dynamo could not trace (tensors already on spyre) runs op by op
        # here: the card compiles it, so its ops are judged by the compiled mode's rules
        collector = dataclasses.replace(collector, mode="compile")
        entry = op_entry(collector.profile, "compile", func)
    if entry.decompose:
        # CompositeImplicit ops reach the Python key whole under inference_mode; a real
        # backend only ever sees their decomposition, so decompose them the same way.
        if func in _CPP_COMPOSITES:
            return func._op_dk(_COMPOSITE, *args, **kwargs)
        result = func.decompose(*args, **kwargs)
        if result is not NotImplemented:
            return result
    device_decomposition = _SPECIAL_DECOMPOSITIONS.get(func)
    if device_decomposition is not None:
        _seen(collector, entry)
        return eager_sdpa(collector, device_decomposition(), args, kwargs)
    if entry.special is not None:
        _seen(collector, entry)
        return entry.special(collector, entry.name, func, args, kwargs)
    _seen(collector, entry)
    if entry.outcome == FALLBACK:
        _, _, found = judge(collector.profile, entry.name, args, kwargs, collector.mode)
        refuse(collector, found)
        message = collector.profile.message("fallback_warning", op=entry.name)
        warn_from_model(message, SpyreFallbackWarning)
        if collector.report is not None:
            collector.report.fallbacks[entry.name] += 1
        return _on_host(entry, func, args, kwargs)
    if entry.outcome == UNSUPPORTED:
        _, _, found = judge(collector.profile, entry.name, args, kwargs, collector.mode)
        refuse(collector, found)  # raises, unless auditing: then the run goes on
        return _native(collector, entry, func, args, kwargs, judged=True)
    return _native(collector, entry, func, args, kwargs)


def _seen(collector: Collector, entry: OpEntry) -> None:
    if collector.report is not None:
        collector.report.ops_seen[entry.name] += 1


# -- unwrapping ------------------------------------------------------------------------------


class _Seen:
    """What unwrapping found: the device, and whether any held dtype differs from its logical
    dtype (then the CPU result's dtype does not tell the logical one); and, once the op ran,
    whether its result is already on the DL16 grid (a device-numerics kernel rounds its own
    DL16 outputs with the profile's format: rounding them again would change nothing)."""

    __slots__ = ("device", "mapped", "rounded")

    def __init__(self) -> None:
        self.device: torch.device | None = None
        self.mapped = False
        self.rounded = False


def _unwrap(x: object, seen: _Seen, host_ok: bool) -> Any:
    if isinstance(x, SpyreTensor):
        if seen.device is None:
            seen.device = x.device
        if x._held.dtype != x.dtype:
            seen.mapped = True
        return x._held
    if isinstance(x, torch.Tensor):
        if x.dim() > 0 and x.device.type == "cpu" and not host_ok:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two "
                f"devices, {seen.device or 'spyre:0'} and cpu!"
            )
        return x
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, seen, host_ok) for v in x)
    if isinstance(x, torch.dtype) and is_dl16(x):
        seen.mapped = True
        return torch.float32  # compute in fp32; the logical dtype comes from the meta run
    return x


def _unwrap_all(
    entry: OpEntry, args: Sequence[object], kwargs: dict[str, object]
) -> tuple[list[object], dict[str, object], _Seen]:
    seen = _Seen()
    host_ok = entry.name.split(".", 1)[0] in _HOST_INDEX_OK
    uargs = [_unwrap(a, seen, host_ok) for a in args]
    ukwargs = {k: _unwrap(v, seen, host_ok) for k, v in kwargs.items()}
    return uargs, ukwargs, seen


# -- native ops ------------------------------------------------------------------------------


def _native(
    collector: Collector,
    entry: OpEntry,
    func: ti.OpOverload,
    args: tuple[object, ...],
    kwargs: dict[str, object],
    judged: bool = False,
) -> Any:
    """Run the op on the held data in fp32 and round its DL16 outputs. An op refused in audit
    mode (judged=True) runs the same way: the best guess of what it computes once an adapter
    makes it lower, and far cheaper than fp16 arithmetic on the host."""
    writes = bool(entry.mutated or entry.out_names)
    if (
        entry.fusable
        and not writes
        and not judged
        and not (entry.defects and any_fires(entry.defects, entry.name, args, kwargs))
    ):
        waiting = fusion.defer(entry.name, args, kwargs, collector.profile.dl16)
        if waiting is not None:
            _judge_clean(collector, entry, args, kwargs, waiting)
            return waiting
    if writes and not judged:
        # Judged before running: a refused in-place op must not have written anything.
        _judge_clean(collector, entry, args, kwargs, None)
        judged = True
    uargs, ukwargs, seen = _unwrap_all(entry, args, kwargs)
    if seen.mapped:
        # numbers the op takes as values are device constants (DL16; -inf on 0xEFFF), as the
        # compile backend holds them
        uargs_t, ukwargs = device_numbers(func, uargs, ukwargs, collector.profile.dl16)
        uargs = list(uargs_t)
    dl16_kernel = (
        entry.kernel is not None
        and bool(args)
        and is_dl16(getattr(args[0], "dtype", torch.float32))
    )
    card = None
    if entry.defects:  # the card's per-op defects reach eager: its eager ops are per-op compiles
        own = _own_kernel(entry, func, collector) if dl16_kernel else _plain(func)
        card = fired(collector, entry.defects, entry.name, args, kwargs, own)
    try:
        if card is not None:
            result = card(uargs, ukwargs)
        elif dl16_kernel:
            assert entry.kernel is not None
            result = entry.kernel(uargs, ukwargs, collector.profile.dl16)
            seen.rounded = True
        elif func is aten.view.dtype and seen.mapped:
            raise SpyreOpNotImplementedError(
                f"{entry.name}: the simulator holds DL16 data as float32 and cannot "
                "reinterpret its bits as another dtype"
            )
        else:
            result = func(*uargs, **ukwargs)
    except (RuntimeError, TypeError) as exc:
        if not seen.mapped or isinstance(exc, SpyreOpNotImplementedError):
            raise
        # The CPU kernel refused the held form (int32 where it wants int64 indices), not the
        # op: run it on host copies in the logical dtypes instead.
        out = _on_host(entry, func, args, kwargs)
    else:
        out = (
            _written_back(entry, args, kwargs)
            if writes
            else _wrap_result(entry, func, args, kwargs, result, seen)
        )
    if not judged:
        _judge_clean(collector, entry, args, kwargs, out)  # in audit mode the result stands
    return out


# Clean signatures kept per op entry; past this many, the set starts again.
_CLEAN_SIGNATURES = 512


def _judge_clean(
    collector: Collector,
    entry: OpEntry,
    args: Sequence[object],
    kwargs: dict[str, object],
    out: object,
) -> None:
    """Judge a native call (``out``: its results, or None before it runs) and refuse what it
    violates. A call whose signature was judged clean before is not judged again: the rules
    read only the dtypes, shapes and devices of the tensors and the other arguments' values,
    which the signature holds (a violation is never remembered: it is judged and recorded
    every time)."""
    try:
        key: Any = (
            _signature(args),
            _signature(tuple(kwargs.items())) if kwargs else None,
            _signature(out) if isinstance(out, (list, tuple)) else _signature((out,)),
        )
        hash(key)
    except TypeError:  # an argument without a hash: judged every time
        key = None
    if key is not None and key in entry.clean:
        return
    _, _, found = judge(collector.profile, entry.name, args, kwargs, collector.mode, outputs=out)
    if found:
        refuse(collector, found)
    elif key is not None:
        if len(entry.clean) >= _CLEAN_SIGNATURES:
            entry.clean.clear()
        entry.clean.add(key)


def _signature(values: Sequence[Any]) -> tuple[object, ...]:
    """What the op rules read of a sequence of arguments: a tensor's dtype, sizes and device
    type (a device tensor's class stands for its device); the value of anything else, nested
    sequences as tuples."""
    out: list[Any] = []
    for x in values:
        kind = type(x)
        if kind is SpyreTensor:
            out.append((x.dtype, x.shape, kind))
        elif isinstance(x, torch.Tensor):
            out.append((x.dtype, x.shape, x.device.type))
        elif kind is list or kind is tuple:
            out.append(_signature(x))
        else:
            out.append(x)
    return tuple(out)


def _own_kernel(entry: OpEntry, func: object, collector: Collector) -> Callable[..., object]:
    kernel = entry.kernel
    assert kernel is not None
    fmt = collector.profile.dl16
    return lambda uargs, ukwargs: kernel(uargs, ukwargs, fmt)


def _plain(func: Any) -> Callable[..., object]:
    return lambda uargs, ukwargs: func(*uargs, **ukwargs)


def _written_back(entry: OpEntry, args: Sequence[object], kwargs: dict[str, object]) -> object:
    """After an in-place or out= op ran on held tensors: round what was written, return the
    device tensors the schema returns."""
    targets = [args[i] for i in entry.mutated] + [kwargs[n] for n in entry.out_names if n in kwargs]
    for t in targets:
        if isinstance(t, SpyreTensor):
            if t._held.shape != t.shape:
                raise SpyreOpNotImplementedError(
                    f"{entry.name}: the simulator cannot resize a device tensor in place"
                )
            if is_dl16(t.dtype):
                round_dl16_(t._held)
    return targets[0] if len(targets) == 1 else tuple(targets)


def _wrap_result(
    entry: OpEntry,
    func: ti.OpOverload,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    result: Any,
    seen: _Seen,
) -> Any:
    device = seen.device or _default_device()
    if isinstance(result, torch.Tensor):
        if entry.view:
            return _wrap_view(result, args[0], device)
        dtype = result.dtype if not seen.mapped else logical_dtypes(func, args, kwargs, result)[0]
        return wrap(_stored(entry, args, result, dtype, seen.rounded), device=device, dtype=dtype)
    leaves, spec = ti.pytree.tree_flatten(result)
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if not tensors:
        return result
    if entry.view:
        dtypes: Sequence[torch.dtype] = [args[0].dtype] * len(tensors)
    elif seen.mapped:
        dtypes = logical_dtypes(func, args, kwargs, result)
    else:
        dtypes = [t.dtype for t in tensors]
    it = iter(dtypes)
    out = [
        (
            (
                _wrap_view(x, args[0], device)
                if entry.view
                else _wrap_fresh(entry, args, x, next(it), device, seen.rounded)
            )
            if isinstance(x, torch.Tensor)
            else x
        )
        for x in leaves
    ]
    return ti.pytree.tree_unflatten(out, spec)


def _wrap_view(x: torch.Tensor, base: torch.Tensor, device: torch.device) -> SpyreTensor:
    if torch.is_inference_mode_enabled() and not base.is_inference():
        # A view of a normal tensor is a normal tensor even in inference mode: autograd's
        # view tracking sets its version counter, which an inference tensor refuses.
        with torch.inference_mode(False):
            return wrap(x, base.dtype, device)
    return wrap(x, base.dtype, device)


def _wrap_fresh(
    entry: OpEntry,
    args: Sequence[object],
    x: torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
    rounded: bool,
) -> SpyreTensor:
    return wrap(_stored(entry, args, x, dtype, rounded), dtype, device)


def _stored(
    entry: OpEntry,
    args: Sequence[object],
    result: torch.Tensor,
    dtype: torch.dtype,
    rounded: bool = False,
) -> torch.Tensor:
    if rounded and result.dtype == torch.float32 and is_dl16(dtype):
        return result  # a kernel's output: on the DL16 grid already
    if (
        entry.value_preserving
        and is_dl16(dtype)
        and preserves_values(entry.name, (t.dtype for t in _tensors(args)), dtype)
    ):
        return result if result.dtype == torch.float32 else result.float()
    return store(result, dtype, fresh=True, transfer=False)


def _tensors(args: Sequence[object]) -> list[torch.Tensor]:
    return [t for t in ti.pytree.tree_leaves(list(args)) if isinstance(t, torch.Tensor)]


def _default_device() -> torch.device:
    return spyre_device(thread_index())


# -- the host: fallbacks --------------------------------------------------------------------


def _to_host_arg(x: object) -> Any:
    if isinstance(x, SpyreTensor):
        return to_host(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_host_arg(v) for v in x)
    return x


def _on_host(
    entry: OpEntry, func: ti.OpOverload, args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    """Run the op on the host as torch-spyre's fallback does: copy the inputs to the host
    (in their logical dtype), run the CPU kernel, copy the results back (rounded, downcast)."""
    packet = entry.name.split(".", 1)[0]
    if packet in _MOVE_ONLY_FALLBACKS and not (entry.mutated or entry.out_names):
        return _moved_on_held(entry, func, args, kwargs)
    hargs = [_to_host_arg(a) for a in args]
    hkwargs = {k: _to_host_arg(v) for k, v in kwargs.items()}
    result = func(*hargs, **hkwargs)
    if entry.mutated or entry.out_names:
        for i in entry.mutated:
            if isinstance(args[i], SpyreTensor):
                copy_into(args[i], hargs[i], hargs[i].dtype, transfer=True)
        for n in entry.out_names:
            if isinstance(kwargs.get(n), SpyreTensor):
                copy_into(kwargs[n], hkwargs[n], hkwargs[n].dtype, transfer=True)
        return _written_back(entry, args, kwargs)
    device = _first_device(args, kwargs)
    return ti.pytree.tree_map_only(
        torch.Tensor,
        lambda t: wrap(store(t, t.dtype, fresh=True, transfer=True), t.dtype, device),
        result,
    )


def _moved_on_held(
    entry: OpEntry, func: ti.OpOverload, args: Sequence[object], kwargs: dict[str, object]
) -> Any:
    uargs, ukwargs, seen = _unwrap_all(entry, args, kwargs)
    result = func(*uargs, **ukwargs)
    dtypes = iter(logical_dtypes(func, args, kwargs, result) if seen.mapped else ())
    device = seen.device or _default_device()

    def back(t: torch.Tensor) -> SpyreTensor:
        dtype = next(dtypes) if seen.mapped else t.dtype
        # the host's copy in its own dtype (fp16 overflows to inf), then the trip back
        host = t.to(dtype)
        return wrap(store(host, dtype, fresh=True, transfer=True), dtype, device)

    return ti.pytree.tree_map_only(torch.Tensor, back, result)


def _first_device(args: Sequence[object], kwargs: dict[str, object]) -> torch.device:
    for t in _tensors(list(args) + list(kwargs.values())):
        if isinstance(t, SpyreTensor):
            return t.device
    return _default_device()


def _sdpa_math() -> Callable[..., object]:
    # The compile backend's SDPA decomposition: every piece (bmm, scale, mask, softmax) then
    # reaches the device on its own, is judged and rounded, as in a compiled graph.
    from hfadapt.spyre.decompositions import sdpa_math

    return sdpa_math


# CompositeImplicit ops decomposed by their C++ kernel, which is what a real device's eager ops
# meet: their Python decomposition (``OpOverload.decompose`` prefers it) differs. Eval-mode
# dropout's C++ kernel returns its input; the Python one clones it (a copy the card never makes:
# 1.7 ms per BERT layer of a 32 x 256 encode).
_CPP_COMPOSITES = frozenset({aten.dropout.default})
_COMPOSITE = ti.composite_implicit_key()

# CompositeImplicit ops the card lowers whole in their input dtype (hfadapt.spyre.compile.native_ops):
# PyTorch's decomposition would upcast to fp32 first.
_KEPT_WHOLE = frozenset({aten.rms_norm.default, aten.softmax.int})

_SPECIAL_DECOMPOSITIONS: dict[Any, Callable[[], Callable[..., Any]]] = {
    aten.scaled_dot_product_attention.default: _sdpa_math,
}


set_handler(dispatch)
