"""The card's per-op silent failures (hfadapt.spyre.rules.op_defects) on the eager device: the card's
eager kernels are per-op compiles (torch-spyre ``ops/eager.py``), so a defect that lives in one
compiled op computes the same wrong numbers when the op runs eagerly. Each firing is recorded in
the tracking block's lowering report, located at the model line that issued the op."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hfadapt.spyre.eager.tensor import SpyreTensor, wrap
from hfadapt.spyre.numerics.kernels import inside_sdpa
from hfadapt.spyre.rules.lowering_report import DefectFiring
from hfadapt.spyre.rules.op_defects import TRIGGERS, candidates, memory_order, misread_layout
from hfadapt.spyre.rules.profile import Defect, Profile
from hfadapt.spyre.rules.tracking import Collector, model_location

Compute = Callable[[list[Any], dict[str, Any]], Any]


def eager_defects(profile: Profile, op: str, mode: str = "eager") -> tuple[Defect, ...]:
    """The profile's per-op defects of ``mode`` whose trigger can fire for ``op`` (most ops:
    none). ``mode`` "compile": ops of a compiled call the device runs one by one."""
    active = profile.active_defects(mode)
    names = set(candidates(op, [d.trigger for d in active]))
    return tuple(d for d in active if d.trigger in names)


def fired(
    collector: Collector,
    defects: Sequence[Defect],
    op: str,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    kernel: Callable[..., Any] | None,
) -> Compute | None:
    """How the card computes this call when one of ``defects`` fires for it (the firing is
    recorded), else None. ``kernel``: the op's own computation on held args, for a defect that
    misreads its input."""
    for defect in defects:
        spec = TRIGGERS[defect.trigger]
        if not spec.matches(op, list(args), kwargs):
            continue
        first = args[0]
        _record(collector, defect, op, first)
        if spec.compute is not None:
            compute = spec.compute
            return lambda uargs, ukwargs: compute(op, uargs, ukwargs)
        order = memory_order(first)
        assert kernel is not None and order is not None
        return _misreading(kernel, order, tuple(int(s) for s in first.shape))
    return None


def any_fires(
    defects: Sequence[Defect], op: str, args: Sequence[object], kwargs: dict[str, object]
) -> bool:
    """Whether one of ``defects`` fires for this call (nothing recorded: ``fired`` does that)."""
    return any(TRIGGERS[d.trigger].matches(op, list(args), kwargs) for d in defects)


def _misreading(
    kernel: Callable[..., object], order: tuple[int, ...], shape: tuple[int, ...]
) -> Compute:
    """``kernel`` reading its first input with the wrong layout."""

    def misread(uargs: list[Any], ukwargs: dict[str, Any]) -> object:
        return kernel([misread_layout(uargs[0], order, shape), *uargs[1:]], ukwargs)

    return misread


def _record(collector: Collector, defect: Defect, op: str, value: Any) -> None:
    if collector.report is None:
        return
    location = model_location(3)
    collector.report.add_defect(
        DefectFiring(
            defect_id=defect.id,
            source=collector.profile.defect_source(defect),
            effect=defect.effect,
            op=op,
            node=f"eager@{location}" if location is not None else "eager",
            shape=tuple(int(s) for s in value.shape),
            stride=tuple(int(s) for s in value.stride()),
            dtype=str(value.dtype).removeprefix("torch."),
            location=location,
        )
    )


def _active(collector: Collector, trigger: str) -> Defect | None:
    for d in collector.profile.active_defects(collector.mode):
        if d.trigger == trigger:
            return d
    return None


def eager_sdpa(
    collector: Collector,
    sdpa: Callable[..., object],
    args: Sequence[object],
    kwargs: dict[str, object],
) -> object:
    """An SDPA the eager device runs as the card's one kernel (torch-spyre registers it as a
    PrivateUse1 eager kernel): a transposed, non-contiguous Q, K or V is read as if contiguous
    (defect.transpose_sdpa_noncontiguous), and a row of -inf codes reaching its softmax is
    misread (defect.minus_inf_amax; a host -inf mask lands on the code)."""
    args = list(args)
    transposed = _active(collector, "sdpa_noncontiguous_qkv")
    if transposed is not None:
        for i in range(min(3, len(args))):
            t = args[i]
            if isinstance(t, SpyreTensor) and t.dim() == 4 and t.is_floating_point():
                order = memory_order(t)
                if order is not None:
                    _record(collector, transposed, "aten::scaled_dot_product_attention", t)
                    shape = tuple(int(s) for s in t.shape)
                    args[i] = wrap(misread_layout(t._held, order, shape), t.dtype, t.device)
    amax = _active(collector, "minus_inf_fill_into_sdpa_softmax")
    hook = None
    if amax is not None:
        defect, first = amax, args[0]

        def hook() -> None:
            _record(collector, defect, "aten::_softmax", first)

    with inside_sdpa(hook):
        return sdpa(*args, **kwargs)
