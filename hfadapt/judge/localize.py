"""Where a failing model's numbers go wrong: hook every module in a CPU fp32 reference run and
in an eager device run, walk modules in execution order, and name the first one whose output
leaves tolerance although its inputs had not (the first divergent module, not everything
downstream of it)."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from hfadapt.judge.device_runner import DeviceResult, Runner
from hfadapt.judge.metrics import TOKEN_COSINE_MIN

# A module diverges when its output's per-token cosine to the reference falls below this, or it
# makes NaN/inf where the reference is finite: the same bar as the whole model.
MODULE_COSINE_MIN = TOKEN_COSINE_MIN
# Vectors this small on both sides count as equal (their cosine is noise).
_TINY = 1e-20
# Tensors kept per module call: enough to judge it, bounded memory.
_MAX_TENSORS = 4

__all__ = [
    "MODULE_COSINE_MIN",
    "Divergence",
    "ModuleRecord",
    "first_divergence",
    "localize",
    "record_modules",
]


@dataclass
class ModuleRecord:
    """One module call: its name, class and host fp32 copies of its float inputs and outputs."""

    name: str
    call: int  # the nth call of this module in the forward (shared modules run more than once)
    cls: str
    inputs: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int]:
        return self.name, self.call


@dataclass
class Divergence:
    """The first module whose output leaves tolerance, with its numbers."""

    module: str  # e.g. encoder.layer.1.intermediate.intermediate_act_fn ("" is the model itself)
    module_class: str
    call: int
    layer: int | None  # the layer index in the module path, when there is one
    sublayer: str | None  # the path below the layer (intermediate.intermediate_act_fn)
    order: int  # position in execution order (module completions)
    modules_checked: int
    cosine: float | None  # min per-token cosine of its output (None when nothing finite)
    input_cosine: float | None  # the same for its inputs (>= tolerance unless inputs_drifted)
    max_abs_diff: float | None
    has_nan: bool
    has_inf: bool
    reference_absmax: float
    device_absmax: float
    inputs_drifted: bool = False  # no module with clean inputs diverged: it starts between modules
    rows: list[int] = field(default_factory=list)  # the probe rows replayed
    threshold: float = MODULE_COSINE_MIN
    # device defects (profile ``defects``) that fired inside this module in the compiled run:
    # {"defect_id", "source", "module", "op"}, set by the diagnosis
    defects: list[dict[str, Any]] = field(default_factory=list)

    @property
    def display_name(self) -> str:
        return self.module or f"<model {self.module_class}>"

    def summary(self) -> str:
        cos = "n/a" if self.cosine is None else f"{self.cosine:.6f}"
        inp = "n/a" if self.input_cosine is None else f"{self.input_cosine:.6f}"
        diff = "n/a" if self.max_abs_diff is None else f"{self.max_abs_diff:.4g}"
        kinds = " and ".join(k for k, on in (("NaN", self.has_nan), ("inf", self.has_inf)) if on)
        what = (
            f"output holds {kinds} where the reference is finite (finite part: cosine {cos})"
            if kinds
            else f"output cosine {cos} < {self.threshold}"
        )
        where = (
            " (its inputs had drifted already: the divergence starts in code between modules)"
            if self.inputs_drifted
            else ""
        )
        fired = sorted({d["defect_id"] for d in self.defects})
        defects = f"; device defect(s) fired here: {', '.join(fired)}" if fired else ""
        return (
            f"{self.display_name} ({self.module_class}): {what}, input cosine {inp}, max |diff| {diff}, "
            f"|max| ref {self.reference_absmax:.4g} vs device {self.device_absmax:.4g}{where}{defects}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- recording -----------------------------------------------------------------------------


def _floats(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _floats(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _floats(v)
    elif hasattr(value, "to_tuple"):  # transformers ModelOutput
        yield from _floats(value.to_tuple())


def _host(t: torch.Tensor) -> torch.Tensor:
    # Always a copy: a later in-place op in the model must not rewrite what was recorded.
    return t.detach().to("cpu").to(torch.float32, copy=True)


def _take(value: object) -> list[torch.Tensor]:
    out = []
    for t in _floats(value):
        out.append(_host(t))
        if len(out) >= _MAX_TENSORS:
            break
    return out


class _Recorder:
    """Forward pre/post hooks on every module, recording calls in completion order."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.records: list[ModuleRecord] = []
        self._calls: dict[str, int] = {}
        self._pending: dict[int, list[list[torch.Tensor]]] = {}
        self._handles: list[Any] = []
        for name, module in model.named_modules():
            self._handles.append(
                module.register_forward_pre_hook(self._pre(module), with_kwargs=True)
            )
            self._handles.append(
                module.register_forward_hook(self._post(name, module), with_kwargs=True)
            )

    def _pre(self, module: torch.nn.Module) -> Callable[..., None]:
        def hook(mod: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
            self._pending.setdefault(id(module), []).append(_take((args, kwargs)))

        return hook

    def _post(self, name: str, module: torch.nn.Module) -> Callable[..., None]:
        def hook(
            mod: torch.nn.Module,
            args: tuple[object, ...],
            kwargs: dict[str, object],
            output: object,
        ) -> None:
            stack = self._pending.get(id(module)) or [[]]
            inputs = stack.pop()
            call = self._calls.get(name, 0)
            self._calls[name] = call + 1
            self.records.append(
                ModuleRecord(name, call, type(module).__name__, inputs, _take(output))
            )

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def record_modules(
    model: torch.nn.Module, run: Callable[[torch.nn.Module], object]
) -> list[ModuleRecord]:
    """Run ``run(model)`` with every module hooked; the calls in completion order."""
    recorder = _Recorder(model)
    try:
        run(model)
    finally:
        recorder.remove()
    return recorder.records


# ---- comparing -----------------------------------------------------------------------------


@dataclass
class _Cmp:
    cosine: float | None
    max_abs_diff: float | None
    has_nan: bool
    has_inf: bool

    def bad(self, threshold: float) -> bool:
        return self.has_nan or self.has_inf or (self.cosine is not None and self.cosine < threshold)


def _rows(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """[rows, features]: real tokens of a token-shaped tensor, else the whole tensor as one row."""
    if mask is not None and t.dim() >= 2 and tuple(t.shape[:2]) == tuple(mask.shape):
        return t[mask].reshape(int(mask.sum()), -1)
    return t.reshape(1, -1)


def _compare(ref: torch.Tensor, dev: torch.Tensor, mask: torch.Tensor | None) -> _Cmp | None:
    if ref.shape != dev.shape or ref.numel() == 0:
        return None
    r, d = _rows(ref, mask).double(), _rows(dev, mask).double()
    ref_ok = torch.isfinite(r)
    # NaN/inf count only where the reference is finite (masks legitimately hold -inf on CPU).
    has_nan = bool((torch.isnan(d) & ref_ok).any())
    has_inf = bool((torch.isinf(d) & ref_ok).any())
    both = ref_ok & torch.isfinite(d)
    r, d = torch.where(both, r, 0.0), torch.where(both, d, 0.0)
    rn, dn = r.norm(dim=-1), d.norm(dim=-1)
    cos = (r * d).sum(dim=-1) / (rn * dn).clamp(min=_TINY)
    cos = torch.where((rn < _TINY) & (dn < _TINY), torch.ones_like(cos), cos)
    diff = (r - d).abs()
    return _Cmp(
        float(cos.min()) if cos.numel() else None,
        float(diff.max()) if diff.numel() else None,
        has_nan,
        has_inf,
    )


def _worst(
    refs: list[torch.Tensor], devs: list[torch.Tensor], mask: torch.Tensor | None
) -> _Cmp | None:
    found: _Cmp | None = None
    for r, d in zip(refs, devs, strict=False):
        c = _compare(r, d, mask)
        if c is None:
            continue
        if found is None:
            found = c
            continue
        cos = [x for x in (found.cosine, c.cosine) if x is not None]
        diffs = [x for x in (found.max_abs_diff, c.max_abs_diff) if x is not None]
        found = _Cmp(
            min(cos) if cos else None,
            max(diffs) if diffs else None,
            found.has_nan or c.has_nan,
            found.has_inf or c.has_inf,
        )
    return found


_LAYER = re.compile(r"^(?P<prefix>.*?)\.(?P<index>\d+)(?:\.(?P<rest>.*))?$")


def _layer_of(name: str) -> tuple[int | None, str | None]:
    match = _LAYER.match(name)
    if not match:
        return None, None
    return int(match["index"]), match["rest"]


def first_divergence(
    reference: list[ModuleRecord],
    device: list[ModuleRecord],
    mask: torch.Tensor | None,
    *,
    threshold: float = MODULE_COSINE_MIN,
) -> Divergence | None:
    """The first module (execution order) whose output leaves tolerance while its inputs are
    within it; failing that, the first module whose output leaves tolerance at all."""
    by_key = {rec.key: rec for rec in device}
    fallback: Divergence | None = None
    checked = 0
    for order, ref in enumerate(reference):
        dev = by_key.get(ref.key)
        if dev is None:
            continue  # not called on the device (an adapter replaced its parent's code)
        checked += 1
        out = _worst(ref.outputs, dev.outputs, mask)
        if out is None or not out.bad(threshold):
            continue
        inp = _worst(ref.inputs, dev.inputs, mask)
        drifted = inp is not None and inp.bad(threshold)
        layer, sub = _layer_of(ref.name)
        found = Divergence(
            module=ref.name,
            module_class=ref.cls,
            call=ref.call,
            layer=layer,
            sublayer=sub,
            order=order,
            modules_checked=checked,
            cosine=out.cosine,
            input_cosine=inp.cosine if inp else None,
            max_abs_diff=out.max_abs_diff,
            has_nan=out.has_nan,
            has_inf=out.has_inf,
            reference_absmax=max(
                (float(t.abs().max()) for t in ref.outputs if t.numel()), default=0.0
            ),
            device_absmax=max(
                (float(t.nan_to_num().abs().max()) for t in dev.outputs if t.numel()), default=0.0
            ),
            inputs_drifted=drifted,
            threshold=threshold,
        )
        if not drifted:
            return found
        fallback = fallback or found
    return fallback


# ---- the whole procedure -------------------------------------------------------------------


def localize(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    *,
    runner: Runner,
    dtype: torch.dtype = torch.float16,
    profile: str | None = None,
    rows: list[int] | None = None,
    threshold: float = MODULE_COSINE_MIN,
    prepare: Callable[[torch.nn.Module], object] | None = None,
    execution: str = "eager",
) -> Divergence | None:
    """Replay ``rows`` of the probe batch (all rows when None, or when those rows do not show the
    divergence) on CPU fp32 and on the device (``execution``: eager, or compile, where the
    module hooks split the compiled graphs at module boundaries, so what a compiled graph
    computes wrongly shows at the module that holds it), and find the first divergent module.

    ``model`` is the stock CPU fp32 model; it is not modified (each run gets a deep copy).
    ``runner`` is ``hfadapt.spyre.runner.run_on_device`` or a stand-in with its signature.
    ``prepare`` readies the device copy as the device run had it (applies the same adapters).
    """
    batch = inputs["input_ids"].shape[0]
    tries = [sorted(set(rows))] if rows and len(set(rows)) < batch else []
    tries.append(list(range(batch)))
    for chosen in tries:
        index = torch.tensor(chosen, dtype=torch.long)
        sub = {k: v.index_select(0, index) for k, v in inputs.items()}
        mask = sub["attention_mask"].bool() if "attention_mask" in sub else None
        ref_model = copy.deepcopy(model)

        def cpu(m: torch.nn.Module, sub: dict[str, torch.Tensor] = sub) -> Any:
            with torch.inference_mode():
                return m(**sub)

        def device(m: torch.nn.Module, sub: dict[str, torch.Tensor] = sub) -> DeviceResult:
            return runner(m, sub, execution=execution, dtype=dtype, profile=profile, collect=True)

        reference = record_modules(ref_model, cpu)
        del ref_model
        device_model = copy.deepcopy(model)
        if prepare is not None:
            prepare(device_model)
        recorded = record_modules(device_model, device)
        del device_model
        found = first_divergence(reference, recorded, mask, threshold=threshold)
        if found is not None:
            found.rows = chosen
            return found
    return None
