"""The float64 equivalence harness: does a rewrite compute the same function as the code it
replaces? Runs both on random and edge-case inputs (zeros, large magnitudes, negatives, and
whatever odd sizes the example draws) over several seeds, and runs negative controls (an
identity, a zero and a constant replacement) through the same checker: a checker that cannot
tell those apart from the original proves nothing, so the result is then not equivalent.

Used by the agent's validation (inside the sandbox) and by ``hfadapt adapters verify``."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from hfadapt.adapters.api import Adapter
from hfadapt.errors import AdapterError

Call = Callable[[torch.nn.Module, tuple[Any, ...], dict[str, Any]], Any]
ExampleFn = Callable[[int], tuple[Any, tuple[Any, ...], dict[str, Any]]]

DEFAULT_SEEDS = (0, 1, 2)
VARIANTS = ("random", "zeros", "large", "negative")
# Max error relative to the reference's largest magnitude. Exact rewrites in float64 land near
# 1e-15; rewrites of code that itself upcasts to fp32 (RMSNorm) land near 1e-7. A wrong
# rewrite (x*x for x**3, a dropped term) is off by O(1).
RTOL = 1e-6
ATOL = 1e-12
LARGE = 1e4  # "large magnitudes": far past fp16 range, still exact-ish in float64
SCALED = 1.001  # the scaled control: the true output times this (a 0.1 % scale error)


@dataclass
class CaseResult:
    """One input (seed x variant) compared."""

    seed: int
    variant: str
    shapes: list[list[int]]
    max_abs_err: float
    max_rel_err: float
    ok: bool
    error: str = ""


@dataclass
class ControlResult:
    """A deliberately wrong replacement; ``rejected`` must be True."""

    name: str
    rejected: bool
    max_rel_err: float
    detail: str = ""


@dataclass
class EquivalenceResult:
    """The verdict and its numbers. ``equivalent`` needs every case within tolerance *and*
    every negative control rejected."""

    equivalent: bool
    reason: str
    cases: list[CaseResult] = field(default_factory=list)
    controls: list[ControlResult] = field(default_factory=list)
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    rtol: float = RTOL
    atol: float = ATOL
    dtype: str = "float64"

    @property
    def controls_rejected(self) -> bool:
        return all(c.rejected for c in self.controls)

    def summary(self) -> str:
        ok = sum(c.ok for c in self.cases)
        ctl = ", ".join(
            f"{c.name} {'rejected' if c.rejected else 'ACCEPTED'}" for c in self.controls
        )
        return (
            f"{'equivalent' if self.equivalent else 'NOT equivalent'}: {ok}/{len(self.cases)} "
            f"inputs within rtol {self.rtol:g} (max rel err {self.max_rel_err:.3g}, max abs err "
            f"{self.max_abs_err:.3g}); controls: {ctl or 'none'}; {self.reason}"
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["controls_rejected"] = self.controls_rejected
        return data


# -- calling conventions -------------------------------------------------------------------


def _calls(
    adapter_or_fn: Adapter | Callable[..., object],
    original: Callable[..., object] | None,
    kind: str | None,
) -> tuple[Call, Call]:
    """(original call, replacement call), both ``(module, args, kwargs) -> output``."""
    if isinstance(adapter_or_fn, Adapter) and getattr(adapter_or_fn, "proof", "call") == "model":
        return _model_calls(adapter_or_fn)
    if isinstance(adapter_or_fn, Adapter):
        fn, kind = adapter_or_fn.fn, kind or adapter_or_fn.kind
        if original is None and kind != "pre_hook":
            original = adapter_or_fn.original()
    else:
        fn, kind = adapter_or_fn, kind or "method"
    if kind == "pre_hook":

        def stock(m: torch.nn.Module, a: tuple[object, ...], k: dict[str, object]) -> Any:
            return m(*a, **k)

        def hooked(m: torch.nn.Module, a: tuple[object, ...], k: dict[str, object]) -> Any:
            changed = fn(m, a, k)
            if changed is not None:
                a, k = changed
            return m(*a, **k)

        return stock, hooked
    if original is None:
        raise AdapterError("prove_equivalent needs the original function to compare against")
    orig = original

    def run_original(m: torch.nn.Module, a: tuple[object, ...], k: dict[str, object]) -> object:
        return orig(m, *a, **k)

    def run_replacement(m: torch.nn.Module, a: tuple[object, ...], k: dict[str, object]) -> Any:
        return fn(m, *a, **k)

    return run_original, run_replacement


def _model_calls(a: Adapter) -> tuple[Call, Call]:
    """An adapter proven on a whole model's output (``proof="model"``): the example's module is
    the model, run stock and with this adapter applied (enabled, so it runs on the CPU)."""
    from hfadapt.adapters.registry import Registry

    def stock(m: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> Any:
        return m(*args, **kwargs)

    def adapted(m: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> Any:
        Registry(adapters=[a]).apply(m)  # m is a fresh copy per call (see _run)
        return m(*args, **kwargs)

    return stock, adapted


# -- inputs --------------------------------------------------------------------------------


def _map_floats(value: object, f: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return f(value) if value.is_floating_point() else value.clone()
    if isinstance(value, tuple):
        return tuple(_map_floats(v, f) for v in value)
    if isinstance(value, list):
        return [_map_floats(v, f) for v in value]
    if isinstance(value, dict):
        return {k: _map_floats(v, f) for k, v in value.items()}
    return value


_VARIANT_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "random": lambda t: t.clone(),
    "zeros": torch.zeros_like,
    "large": lambda t: t * LARGE,
    "negative": lambda t: -t.abs(),
}


def _prepare(
    example: ExampleFn, seed: int, dtype: torch.dtype
) -> tuple[object, tuple[object, ...], dict[str, object]]:
    module, args, kwargs = example(seed)
    if isinstance(module, torch.nn.Module):
        module = module.to(dtype).eval()
    args = _map_floats(tuple(args), lambda t: t.to(dtype))
    kwargs = _map_floats(dict(kwargs), lambda t: t.to(dtype))
    return module, args, kwargs


def _leaves(value: object) -> Iterator[Any]:
    """Tensor and scalar leaves of an output (tuples, lists, dicts, ModelOutput)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif value is not None:
        yield value


def _shapes(args: tuple[object, ...], kwargs: dict[str, object]) -> list[list[int]]:
    return [list(t.shape) for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor)]


# -- comparing -----------------------------------------------------------------------------


def compare_outputs(
    reference: object, candidate: object, rtol: float = RTOL, atol: float = ATOL
) -> tuple[bool, float, float, str]:
    """(within tolerance, max abs err, max rel err, why not). NaN and inf must sit at the same
    places with the same sign; finite values within ``atol + rtol * max|reference|``."""
    ref, cand = list(_leaves(reference)), list(_leaves(candidate))
    if len(ref) != len(cand):
        return False, math.inf, math.inf, f"output has {len(cand)} leaves, original {len(ref)}"
    worst_abs = worst_rel = 0.0
    for i, (r, c) in enumerate(zip(ref, cand, strict=True)):
        if not isinstance(r, torch.Tensor):
            if r != c:
                return False, math.inf, math.inf, f"output {i}: {c!r} != original {r!r}"
            continue
        if not isinstance(c, torch.Tensor):
            return False, math.inf, math.inf, f"output {i}: {type(c).__name__}, original a tensor"
        if tuple(r.shape) != tuple(c.shape):
            return (
                False,
                math.inf,
                math.inf,
                f"output {i}: shape {list(c.shape)}, original {list(r.shape)}",
            )
        if r.dtype != c.dtype:
            return False, math.inf, math.inf, f"output {i}: dtype {c.dtype}, original {r.dtype}"
        if not r.is_floating_point():
            if not torch.equal(r, c):
                n = int((r != c).sum())
                return False, math.inf, math.inf, f"output {i}: {n} integer elements differ"
            continue
        r64, c64 = r.detach().double(), c.detach().double()
        rf, cf = torch.isfinite(r64), torch.isfinite(c64)
        same_special = torch.where(rf, cf, (r64 == c64) | (torch.isnan(r64) & torch.isnan(c64)))
        if not bool(same_special.all()):
            n = int((~same_special).sum())
            return False, math.inf, math.inf, f"output {i}: {n} elements differ in NaN/inf"
        both = rf & cf
        if not bool(both.any()):
            continue
        abs_err = float((r64[both] - c64[both]).abs().max())
        scale = float(r64[both].abs().max())
        rel_err = abs_err / scale if scale > 0 else abs_err
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        if abs_err > atol + rtol * scale:
            return (
                False,
                worst_abs,
                worst_rel,
                f"output {i}: max abs err {abs_err:.3g} > {atol:g} + {rtol:g} * {scale:.3g}",
            )
    return True, worst_abs, worst_rel, ""


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]


def _run(call: Call, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # Each call gets its own copies: an in-place rewrite must not change the other side's input.
    with torch.no_grad():
        return call(
            copy.deepcopy(module), _map_floats(args, torch.clone), _map_floats(kwargs, torch.clone)
        )


def _inputs(
    example: ExampleFn, seeds: Sequence[int], variants: Sequence[str], dtype: torch.dtype
) -> Iterator[tuple[int, str, Any, tuple[Any, ...], dict[str, Any]]]:
    for seed in seeds:
        module, args, kwargs = _prepare(example, seed, dtype)
        for variant in variants:
            f = _VARIANT_FNS[variant]
            yield seed, variant, module, _map_floats(args, f), _map_floats(kwargs, f)


def _first_tensor(args: tuple[object, ...], kwargs: dict[str, object]) -> torch.Tensor | None:
    for leaf in _leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point():
            return leaf
    return None


def _zero_like(out: object) -> Any:
    return _map_floats(out, torch.zeros_like)


def _controls(reference_call: Call, first_output: object) -> dict[str, Call]:
    """Wrong replacements the checker must reject (constant = the first input's true output;
    scaled = the true output off by 0.1 %, which a cosine alone would accept)."""
    frozen = copy.deepcopy(first_output)
    return {
        "identity": lambda m, a, k: _first_tensor(a, k),
        "zero": lambda m, a, k: _zero_like(reference_call(m, a, k)),
        "constant": lambda m, a, k: copy.deepcopy(frozen),
        "scaled": lambda m, a, k: _map_floats(reference_call(m, a, k), lambda t: t * SCALED),
    }


def prove_equivalent(
    adapter_or_fn: Adapter | Callable[..., object],
    original: Callable[..., object] | None = None,
    example: ExampleFn | None = None,
    *,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    dtype: torch.dtype = torch.float64,
    variants: Sequence[str] = VARIANTS,
    rtol: float = RTOL,
    atol: float = ATOL,
    kind: str | None = None,
    controls: bool = True,
) -> EquivalenceResult:
    """Compare a rewrite with the original on ``example(seed)`` inputs (module, args, kwargs).

    ``adapter_or_fn`` is an Adapter (its fn, kind, original and example are used unless given)
    or a replacement ``fn(module, *args, **kwargs)``; ``original`` has the same signature.
    """
    if example is None and isinstance(adapter_or_fn, Adapter):
        example = adapter_or_fn.example
    if example is None:
        name = getattr(adapter_or_fn, "name", getattr(adapter_or_fn, "__name__", "rewrite"))
        raise AdapterError(f"{name}: no example to prove equivalence on (pass example=)")
    run_original, run_replacement = _calls(adapter_or_fn, original, kind)
    result = EquivalenceResult(equivalent=False, reason="", rtol=rtol, atol=atol)
    result.dtype = str(dtype).removeprefix("torch.")

    inputs = list(_inputs(example, seeds, variants, dtype))
    references: list[Any] = []
    for seed, variant, module, args, kwargs in inputs:
        ref = _run(run_original, module, args, kwargs)
        references.append(ref)
        case = CaseResult(seed, variant, _shapes(args, kwargs), 0.0, 0.0, False)
        try:
            out = _run(run_replacement, module, args, kwargs)
        except Exception as exc:  # the rewrite failing on an input is a finding, not a crash
            case.error = _one_line(exc)
            case.max_abs_err = case.max_rel_err = math.inf
        else:
            case.ok, case.max_abs_err, case.max_rel_err, case.error = compare_outputs(
                ref, out, rtol, atol
            )
        result.cases.append(case)
    result.max_abs_err = max((c.max_abs_err for c in result.cases), default=0.0)
    result.max_rel_err = max((c.max_rel_err for c in result.cases), default=0.0)

    if controls:
        for name, call in _controls(run_original, references[0]).items():
            rejected, worst, detail = False, 0.0, "matched the original on every input"
            for (seed, variant, module, args, kwargs), ref in zip(inputs, references, strict=True):
                try:
                    out = _run(call, module, args, kwargs)
                except Exception as exc:
                    rejected, detail = True, f"{seed}/{variant}: raised {_one_line(exc)}"
                    break
                ok, _, rel, why = compare_outputs(ref, out, rtol, atol)
                worst = max(worst, rel)
                if not ok:
                    rejected, detail = True, f"{seed}/{variant}: {why}"
                    break
            result.controls.append(ControlResult(name, rejected, worst, detail))

    failed = [c for c in result.cases if not c.ok]
    if failed:
        c = failed[0]
        result.reason = (
            f"{len(failed)} of {len(result.cases)} inputs differ; first: seed {c.seed}, "
            f"{c.variant} inputs {c.shapes}: {c.error}"
        )
    elif not result.controls_rejected:
        names = ", ".join(c.name for c in result.controls if not c.rejected)
        result.reason = (
            f"inconclusive: the {names} control(s) also matched the original, so these inputs "
            "cannot tell a right rewrite from a wrong one"
        )
    else:
        result.equivalent = True
        result.reason = f"{len(result.cases)} inputs over seeds {list(seeds)}"
    return result
