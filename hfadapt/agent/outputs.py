"""Proofs the draft cannot reach: inside the sandbox the draft only computes its outputs for
inputs built by trusted code and writes them as data (safetensors); the parent, which never
imported the draft, rebuilds the same inputs, runs the stock code and judges.

Inputs per seed: the case's example (captured calls of the real model when there are some) in
float64; the same with every value scaled by 50 and a tenth of them set to zero (edge values);
and, when every tensor shares a leading (batch, sequence) shape, a stretched copy with batch 2
and sequence ``STRETCH_SEQ`` (beyond the probe's 256). The draft's float64 outputs must match
the stock code's; on the probe inputs its outputs on the simulated device (float inputs rounded
to the run dtype) must match the stock code on the CPU at the module's output."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

ExampleFn = Callable[[int], Any]
STRETCH_SEQ = 512
F64_RTOL = 1e-6
DEVICE_COSINE_MIN = 0.99  # DL16/fp16 rounding clears it; identity-for-gelu (0.73) does not
FILE = "tensors.safetensors"
# Inputs also run on the simulated device (eager simulation is slow; float64 covers the rest).
DEVICE_VARIANTS = ("probe",)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(10_000 + seed)


def _map(value: Any, f: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return f(value) if value.is_floating_point() else value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, f) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, f) for k, v in value.items()}
    return value


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def variants(
    example: ExampleFn, seed: int
) -> list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]]:
    """(name, module, args, kwargs) for one seed; deterministic, so the parent and the sandbox
    build the same inputs from the same trusted builder."""
    module, args, kwargs = example(seed)
    module = module.double().eval() if isinstance(module, torch.nn.Module) else module
    args, kwargs = _map(tuple(args), torch.Tensor.double), _map(dict(kwargs), torch.Tensor.double)
    out = [("probe", module, args, kwargs)]
    g = _gen(seed)

    def edge(t: torch.Tensor) -> torch.Tensor:
        scaled = t * 50.0
        return scaled.masked_fill(torch.rand(t.shape, generator=g, dtype=t.dtype) < 0.1, 0.0)

    out.append(("edge", module, _map(args, edge), _map(kwargs, edge)))
    leaves = list(_tensors((args, kwargs)))
    if leaves and all(t.is_floating_point() and t.dim() >= 3 for t in leaves):
        lead = {tuple(t.shape[:2]) for t in leaves}
        if len(lead) == 1:

            def stretch(t: torch.Tensor) -> torch.Tensor:
                shape = (2, STRETCH_SEQ, *t.shape[2:])
                return torch.randn(shape, generator=g, dtype=t.dtype) * t.std().clamp(min=1.0)

            out.append(("stretched", module, _map(args, stretch), _map(kwargs, stretch)))
    return out


def rounded_inputs(
    module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], run_dtype: torch.dtype
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """A float32 copy of the module and the float inputs rounded through the run dtype, as the
    device sees them (so input rounding is not counted against the draft)."""
    low = copy.deepcopy(module).float() if isinstance(module, torch.nn.Module) else module
    return (
        low,
        _map(args, lambda t: t.to(run_dtype).float()),
        _map(kwargs, lambda t: t.to(run_dtype).float()),
    )


def flat(value: Any) -> list[torch.Tensor]:
    """The output's tensors in order (a ModelOutput or tuple alike)."""
    if hasattr(value, "to_tuple"):
        value = value.to_tuple()
    return list(_tensors(value))


# -- the parent's side --------------------------------------------------------------------------


def _rel_err(ref: torch.Tensor, cand: torch.Tensor) -> float:
    ref, cand = ref.double(), cand.double()
    if ref.shape != cand.shape:
        return math.inf
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(cand)):
        return math.inf
    diff = (ref[finite] - cand[finite]).abs()
    scale = ref[finite].abs().max().clamp(min=1e-12) if diff.numel() else torch.tensor(1.0)
    return float((diff / scale).max()) if diff.numel() else 0.0


def _min_cosine(ref: torch.Tensor, cand: torch.Tensor) -> float:
    if ref.shape != cand.shape:
        return float("nan")
    a = ref.double().reshape(-1, ref.shape[-1] if ref.dim() else 1)
    b = cand.double().reshape(-1, cand.shape[-1] if cand.dim() else 1)
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    cos = (a * b).sum(-1) / (na * nb).clamp(min=1e-300)
    cos = torch.where((na < 1e-12) & (nb < 1e-12), torch.ones_like(cos), cos)
    return float(cos.min()) if cos.numel() else float("nan")


def judge(
    original: Callable[..., Any],
    example: ExampleFn,
    seeds: list[int],
    produced: dict[str, torch.Tensor],
    run_dtype: torch.dtype,
) -> tuple[str, str, dict[str, Any]]:
    """(status, summary, numbers): the draft's outputs from the sandbox against the stock code
    run here. Missing outputs fail: the draft does not get to skip an input."""
    rows: list[dict[str, Any]] = []
    first_bad = ""
    for seed in seeds:
        for name, module, args, kwargs in variants(example, seed):
            key = f"{seed}/{name}"
            checks: list[tuple[str, list[torch.Tensor]]] = []
            with torch.no_grad():
                checks.append(("f64", flat(original(module, *args, **kwargs))))
                if name in DEVICE_VARIANTS:
                    low, rounded, kw = rounded_inputs(module, args, kwargs, run_dtype)
                    checks.append(("dev", flat(original(low, *rounded, **kw))))
            for kind, ref in checks:
                got = [produced.get(f"{key}/{kind}/{i}") for i in range(len(ref))]
                row: dict[str, Any] = {"input": key, "on": kind, "outputs": len(ref)}
                if any(g is None for g in got) or f"{key}/{kind}/{len(ref)}" in produced:
                    row.update(ok=False, why="the draft's outputs are missing or extra")
                elif kind == "f64":
                    err = max((_rel_err(r, g) for r, g in zip(ref, got, strict=True)), default=0.0)  # type: ignore[arg-type]
                    row.update(max_rel_err=err, ok=err <= F64_RTOL)
                    row["why"] = f"float64 max rel err {err:.3g} > {F64_RTOL:g}"
                else:
                    cos = min(
                        (_min_cosine(r, g) for r, g in zip(ref, got, strict=True)),  # type: ignore[arg-type]
                        default=1.0,
                    )
                    row.update(min_cosine=cos, ok=cos >= DEVICE_COSINE_MIN)
                    row["why"] = (
                        f"on the device vs stock on the CPU: min cosine {cos:.4f} < "
                        f"{DEVICE_COSINE_MIN}"
                    )
                rows.append(row)
                if not row["ok"] and not first_bad:
                    first_bad = f"input {key} ({kind}): {row['why']}"
    worst64 = max((r.get("max_rel_err", 0.0) for r in rows if r["on"] == "f64"), default=0.0)
    worst_cos = min((r.get("min_cosine", 1.0) for r in rows if r["on"] == "dev"), default=1.0)
    inputs = sorted({r["input"] for r in rows})
    numbers = {
        "inputs": inputs,
        "f64_max_rel_err": worst64,
        "device_min_cosine": worst_cos,
        "failing": [r for r in rows if not r["ok"]][:6],
    }
    if first_bad:
        return "fail", first_bad, numbers
    return (
        "pass",
        f"{len(inputs)} inputs (probe, edge values, batch 2 x {STRETCH_SEQ} where it "
        f"applies): float64 max rel err {worst64:.3g}; on the device min cosine {worst_cos:.5f}",
        numbers,
    )
