"""Re-proving an adapter: float64 equivalence with the code it replaces (hfadapt.adapters.equivalence),
then, on the simulated device, that the rule it works around no longer fires and no new
violation appears. For a numerics rule (nothing to refuse), that the adapted code is at least
as accurate on the device as the stock code, measured against float64."""

from __future__ import annotations

import copy
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from hfadapt.adapters.api import Adapter
from hfadapt.adapters.equivalence import (
    Call,
    EquivalenceResult,
    _calls,
    _map_floats,
    prove_equivalent,
)
from hfadapt.adapters.registry import Registry
from hfadapt.spyre.rules.lowering_report import LoweringReport


@dataclass
class DeviceCheck:
    stock_rules: list[str] = field(default_factory=list)
    adapted_rules: list[str] = field(default_factory=list)
    stock_error: float | None = None  # numerics rules: max relative error vs float64
    adapted_error: float | None = None
    error: str = ""

    def ok(self, rule: str) -> bool:
        if self.error:
            return False
        new = set(self.adapted_rules) - set(self.stock_rules)
        if rule.startswith("defect."):
            # the defect fires on the stock code, not on the adapted code, which is accurate
            return (
                rule in self.stock_rules
                and rule not in self.adapted_rules
                and not new
                and self.adapted_error is not None
                and (self.stock_error is None or self.adapted_error < self.stock_error)
            )
        if rule.startswith("numerics."):
            return (
                not new
                and self.adapted_error is not None
                and (
                    self.stock_error is None or self.adapted_error <= self.stock_error * 1.01 + 1e-6
                )
            )
        return rule not in self.adapted_rules and not new


@dataclass
class VerifyResult:
    name: str
    rule: str
    equivalence: EquivalenceResult | None
    device: DeviceCheck | None
    failure: str = ""

    @property
    def ok(self) -> bool:
        return not self.failure

    @property
    def equivalence_text(self) -> str:
        if self.equivalence is None:
            return "n/a"
        return f"{self.equivalence.max_rel_err:.2e} ({'ok' if self.equivalence.equivalent else 'FAILED'})"

    @property
    def device_text(self) -> str:
        d = self.device
        if d is None:
            return "n/a"
        if d.error:
            return f"error: {d.error}"
        if self.rule.startswith("numerics.") or self.rule.startswith("defect."):
            fired = (
                ""
                if self.rule.startswith("numerics.")
                else (
                    f"stock: {'fires' if self.rule in d.stock_rules else 'does not fire'}; "
                    f"adapted: {sorted(set(d.adapted_rules)) or 'clean'}; "
                )
            )
            return f"{fired}err stock {_num(d.stock_error)} -> adapted {_num(d.adapted_error)}"
        fired = "fires" if self.rule in d.stock_rules else "does not fire"
        return f"stock: {fired}; adapted: {sorted(set(d.adapted_rules)) or 'clean'}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rule": self.rule,
            "ok": self.ok,
            "failure": self.failure,
            "equivalence": self.equivalence.to_dict() if self.equivalence else None,
            "device": asdict(self.device) if self.device else None,
        }


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2e}"


def _on_device(value: object, dev: torch.device) -> Any:
    return _map_floats(value, lambda t: t.half().to(dev)) if value is not None else value


def _ints_to(value: object, dev: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dev) if not value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_ints_to(v, dev) for v in value)
    if isinstance(value, dict):
        return {k: _ints_to(v, dev) for k, v in value.items()}
    return value


def _first_float(value: object) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    if isinstance(value, (tuple, list)):
        for v in value:
            found = _first_float(v)
            if found is not None:
                return found
    if isinstance(value, dict):
        return _first_float(list(value.values()))
    return None


def _rel_err(out: object, ref: torch.Tensor) -> float:
    t = _first_float(out)
    if t is None:
        return float("inf")
    t = t.cpu().double()
    scale = ref.abs().max().item() or 1.0
    return float((t - ref).abs().max().item() / scale)


def _whole_model(a: Adapter, module: torch.nn.Module) -> bool:
    """Judge the adapter on the whole model's forward (with the rest of the registry applied)
    rather than on the one call it replaces."""
    return (
        a.kind == "pre_hook"
        or a.proof == "model"
        or (
            isinstance(module, torch.nn.Module)
            and hasattr(module, "config")
            and a.kind != "attention"
            and a.method_name == "forward"
            and a.target.endswith("PreTrainedModel.forward")
        )
    )


def model_calls(a: Adapter, registry: Registry | None = None) -> tuple[Call, Call]:
    """(stock, adapted) calls of a whole model: every other matching adapter of the registry is
    applied to both, so a difference is this adapter's alone."""
    from hfadapt.adapters.registry import default_registry

    reg = registry or default_registry()

    def run(with_it: bool) -> Call:
        def call(m: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> Any:
            others = [x.name for x in reg.adapters if x.name != a.name]
            handle = reg.apply(m, device="spyre", only=[*others, a.name] if with_it else others)
            if with_it and a.name not in handle.applied and a not in reg.adapters:
                Registry(adapters=[a]).apply(m, device="spyre")
            try:
                return m(*args, **kwargs)
            finally:
                handle.remove()

        return call

    return run(False), run(True)


def _float64_reference(call: Call, module: Any, args: Any, kwargs: Any) -> torch.Tensor | None:
    """The stock code's first float output on a float64 copy of the example."""
    return _first_float(
        call(
            copy.deepcopy(module).double(),
            _map_floats(args, torch.Tensor.double),
            _map_floats(kwargs, torch.Tensor.double),
        )
    )


def _compiled_check(
    a: Adapter, stock_call: Call, adapted_call: Call, seed: int, profile: str | None
) -> DeviceCheck:
    """A device defect fires only in compiled graphs: run the stock and the adapted code of the
    example through the spyre compile backend in fp16; the defect ids that fired count as the
    rules met, and the error against float64 is measured for both."""
    from hfadapt.spyre.compile.backend import lower

    if a.example is None:
        return DeviceCheck(error="no example to run")
    module, args, kwargs = a.example(seed)
    reference = _float64_reference(stock_call, module, args, kwargs)
    check = DeviceCheck()
    for label, call in (("stock", stock_call), ("adapted", adapted_call)):
        m = copy.deepcopy(module).half() if isinstance(module, torch.nn.Module) else module
        half_args = _map_floats(args, torch.Tensor.half)
        half_kwargs = _map_floats(kwargs, torch.Tensor.half)

        def run(*xs: Any, m: Any = m, call: Call = call, kw: Any = half_kwargs) -> Any:
            return call(m, xs, kw)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                lowered, report = lower(run, tuple(half_args), profile, check_config=False)
                out = lowered(*half_args) if report.ok else None
            except Exception as exc:
                check.error = (
                    f"{label} compiled run raised {type(exc).__name__}: "
                    f"{' '.join(str(exc).split())[:200]}"
                )
                return check
        rules = [v.rule_id for v in report.violations] + report.defect_ids()
        err = _rel_err(out, reference) if reference is not None and out is not None else None
        if label == "stock":
            check.stock_rules, check.stock_error = rules, err
        else:
            check.adapted_rules, check.adapted_error = rules, err
    return check


def device_check(a: Adapter, seed: int = 0, profile: str | None = None) -> DeviceCheck:
    """Run the stock and the adapted code of ``a.example(seed)`` on the eager device in fp16;
    an adapter for a device defect (rule ``defect.*``, compiled graphs only) through the
    compile backend."""
    from hfadapt.spyre.eager import device as spyre_device
    from hfadapt.spyre.rules.tracking import tracking

    if a.example is None:
        return DeviceCheck(error="no example to run")
    module0 = a.example(seed)[0]
    stock_call, adapted_call = model_calls(a) if _whole_model(a, module0) else _calls(a, None, None)
    if a.rule.startswith("defect."):
        return _compiled_check(a, stock_call, adapted_call, seed, profile)
    spyre_device.register()
    dev = torch.device("spyre")
    module, args, kwargs = a.example(seed)
    reference = _float64_reference(stock_call, module, args, kwargs)
    check = DeviceCheck()
    for label, call in (("stock", stock_call), ("adapted", adapted_call)):
        m = copy.deepcopy(module).half().to(dev) if isinstance(module, torch.nn.Module) else module
        a_dev = _ints_to(_on_device(args, dev), dev)
        k_dev = _ints_to(_on_device(kwargs, dev), dev)
        report: LoweringReport
        with (
            warnings.catch_warnings(),
            tracking(profile, mode="eager", collect=True) as report,
            torch.no_grad(),
        ):
            warnings.simplefilter("ignore")
            try:
                out = call(m, a_dev, k_dev)
            except Exception as exc:
                check.error = (
                    f"{label} run raised {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
                )
                return check
        rules = [v.rule_id for v in report.violations]
        err = _rel_err(out, reference) if reference is not None else None
        if label == "stock":
            check.stock_rules, check.stock_error = rules, err
        else:
            check.adapted_rules, check.adapted_error = rules, err
    return check


def prove_float64(
    a: Adapter, *, seeds: tuple[int, ...] = (0, 1, 2), registry: Registry | None = None
) -> EquivalenceResult:
    """Float64 equivalence of ``a`` with the code it replaces on its example: the call it
    replaces, or (``proof="model"``) the whole model's output with the rest of the registry
    applied to both sides."""
    if a.proof == "model":
        stock, adapted = model_calls(a, registry)
        return prove_equivalent(
            lambda m, *args, **kw: adapted(m, args, kw),
            lambda m, *args, **kw: stock(m, args, kw),
            a.example,
            seeds=seeds,
            kind="method",
        )
    return prove_equivalent(a, seeds=seeds)


def verify_adapter(a: Adapter, *, seeds: int = 3, profile: str | None = None) -> VerifyResult:
    """Equivalence first (no point running a wrong rewrite on the device), then the device."""
    result = VerifyResult(name=a.name, rule=a.rule, equivalence=None, device=None)
    if a.example is None:
        result.failure = "no example: the adapter cannot be proven (add example=)"
        return result
    try:
        result.equivalence = prove_float64(a, seeds=tuple(range(seeds)))
    except Exception as exc:
        result.failure = f"equivalence harness raised {type(exc).__name__}: {exc}"
        return result
    if not result.equivalence.equivalent:
        result.failure = f"not equivalent: {result.equivalence.reason}"
        return result
    result.device = device_check(a, profile=profile)
    if not result.device.ok(a.rule):
        result.failure = f"device: {result.device_text}"
    return result
