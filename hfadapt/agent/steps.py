"""The validation steps that execute the draft, run inside the sandbox worker: load it, prove
it equivalent in float64, check the fingerprint is gone on the simulated device with no new
violation, and judge end to end. Each returns (status, one-line summary, output numbers)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hfadapt.adapters.api import Adapter
from hfadapt.adapters.equivalence import DEFAULT_SEEDS, prove_equivalent
from hfadapt.agent.cases import FailureCase, captured_example, resolve_ref
from hfadapt.agent.end_to_end import (
    CPU_COSINE_MIN,
    DEVICE_COSINE_MIN,
    main_tensor,
    run_forward,
    token_cosine,
)

StepResult = tuple[str, str, dict[str, Any]]


class Context:
    """What one sandbox run accumulates from step to step."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        self.case = FailureCase.from_dict(job["case"])
        self.adapter: Adapter | None = None
        self.model: Any = None
        self.inputs: Any = None
        self.mask: torch.Tensor | None = None
        self.device_outputs: Any = None

    @property
    def draft(self) -> Adapter:
        if self.adapter is None:
            raise RuntimeError("the draft was not loaded")
        return self.adapter


def step_load(ctx: Context) -> StepResult:
    from hfadapt.adapters.registry import load_file

    found = load_file(Path(ctx.job["draft_path"]), source="agent-draft", trusted=False)
    if len(found) != 1:
        return "fail", f"the file registers {len(found)} adapters; it must register exactly one", {}
    a = found[0]
    case = ctx.case
    info = a.summary()
    if case.target and a.target != case.target:
        return "fail", f"target {a.target!r} is not the failing code {case.target!r}", info
    a.target_class()  # imports the target module: a wrong target fails here, with its reason
    if a.kind == "method":
        a.original()
    ctx.adapter = a
    return "pass", f"loaded {a.name}: {a.kind} on {a.target} (rule {a.rule})", info


def _example(ctx: Context) -> tuple[Callable[[int], Any], str]:
    case = ctx.case
    if case.example:
        return resolve_ref(case.example), f"case builder {case.example}"
    if case.example_file:
        return captured_example(case.example_file), "calls captured from the model"
    if ctx.draft.example is not None:
        return ctx.draft.example, "the draft's own example (no captured inputs for this case)"
    raise RuntimeError("no example inputs: give the @adapter an example= builder")


def step_equivalence(ctx: Context) -> StepResult:
    example, source = _example(ctx)
    seeds = tuple(ctx.job.get("seeds") or DEFAULT_SEEDS)
    result = prove_equivalent(ctx.draft, example=example, seeds=seeds)
    output = result.to_dict()
    # Keep the failing inputs in full; the passing ones only as a count.
    output["cases"] = [c for c in output["cases"] if not c["ok"]][:6]
    output["inputs"] = len(result.cases)
    output["example"] = source
    output["outputs_written"] = _write_outputs(ctx, example, list(seeds))
    return ("pass" if result.equivalent else "fail"), result.summary(), output


class _Call(torch.nn.Module):
    """The draft's function on one module instance, as a model the device runner can run."""

    def __init__(self, inner: Any, fn: Callable[..., Any], n: int, keys: list[str]) -> None:
        super().__init__()
        self.inner, self.fn, self.n, self.keys = inner, fn, n, keys

    def forward(self, **kw: Any) -> Any:
        args = [kw[f"a{i}"] for i in range(self.n)]
        return self.fn(self.inner, *args, **{k: kw[f"k{j}"] for j, k in enumerate(self.keys)})


def _write_outputs(ctx: Context, example: Callable[[int], Any], seeds: list[int]) -> int:
    """The draft's outputs for the trusted proof inputs, float64 on the CPU and on the simulated
    device, written as data for the parent to judge (:mod:`hfadapt.agent.outputs`)."""
    from safetensors.torch import save_file

    from hfadapt.agent import outputs
    from hfadapt.spyre.runner import run_on_device

    a = ctx.draft
    if a.kind != "method" or not ctx.job.get("output_dir"):
        return 0
    dtype = getattr(torch, ctx.case.run_dtype)
    tensors: dict[str, torch.Tensor] = {}
    for seed in seeds:
        for name, module, args, kwargs in outputs.variants(example, seed):
            key = f"{seed}/{name}"
            with torch.no_grad():
                got = outputs.flat(a.fn(module, *args, **kwargs))
            for i, t in enumerate(got):
                tensors[f"{key}/f64/{i}"] = t.detach().cpu().contiguous()
            if name not in outputs.DEVICE_VARIANTS:
                continue
            low, rounded, kw = outputs.rounded_inputs(module, args, kwargs, dtype)
            keys = list(kw)
            inputs = {f"a{i}": _as_dtype(v, dtype) for i, v in enumerate(rounded)}
            inputs.update({f"k{j}": _as_dtype(kw[k], dtype) for j, k in enumerate(keys)})
            run = run_on_device(
                _Call(low, a.fn, len(rounded), keys),
                inputs,
                execution="eager",
                dtype=dtype,
                profile=ctx.case.profile,
                collect=True,
            )
            for i, t in enumerate(outputs.flat(run.outputs)):
                tensors[f"{key}/dev/{i}"] = t.detach().cpu().float().contiguous()
    save_file(tensors, str(Path(ctx.job["output_dir"]) / outputs.FILE))
    return len(tensors)


# -- the model for the device and end-to-end steps ---------------------------------------------


def _build_model(ctx: Context) -> None:
    if ctx.model is not None:
        return
    spec = ctx.case.model or {}
    if "builder" in spec:
        model, inputs = resolve_ref(spec["builder"])(0)
        mask = inputs.get("attention_mask") if isinstance(inputs, dict) else None
    else:
        model, inputs, mask = _hf_model(spec)
    ctx.model, ctx.inputs, ctx.mask = model.float().eval(), inputs, mask


def _hf_model(spec: dict[str, Any]) -> tuple[Any, Any, torch.Tensor | None]:
    """The model and probe inputs exactly as ``hfadapt diagnose`` builds them."""
    from hfadapt.judge.diagnose import _load, build_probes
    from hfadapt.judge.probes import model_inputs

    loaded = _load(spec["ref"], "structural" if spec.get("structural", True) else "full", False)
    if hasattr(loaded.config, "use_cache"):
        loaded.config.use_cache = False
    batch = build_probes(loaded)
    return loaded.model, model_inputs(loaded.model, batch), batch.attention_mask


def _registry(ctx: Context, with_draft: bool) -> Any:
    from hfadapt.adapters.registry import Registry, discover

    base = discover() if ctx.case.registry == "default" else Registry()
    adapters = list(base.adapters)
    if with_draft:
        # The draft takes the place of any adapter that patches the same code.
        adapters = [a for a in adapters if a.target != ctx.draft.target] + [ctx.draft]
    return Registry(adapters=adapters)


def _as_dtype(inputs: Any, dtype: torch.dtype) -> Any:
    """Float inputs in the run's dtype (the runner moves inputs to the device as they are)."""
    if isinstance(inputs, dict):
        return {k: _as_dtype(v, dtype) for k, v in inputs.items()}
    if isinstance(inputs, torch.Tensor) and inputs.is_floating_point():
        return inputs.to(dtype)
    return inputs


def _device_run(ctx: Context, with_draft: bool) -> Any:
    from hfadapt.errors import SpyreLoweringError
    from hfadapt.spyre.runner import DeviceRun, run_on_device

    model = copy.deepcopy(ctx.model)
    _registry(ctx, with_draft).apply(model)
    dtype = getattr(torch, ctx.case.run_dtype)
    try:
        return run_on_device(
            model,
            _as_dtype(ctx.inputs, dtype),
            execution=ctx.case.execution,
            dtype=dtype,
            profile=ctx.case.profile,
            collect=True,
        )
    except SpyreLoweringError as exc:  # compiled mode refuses the whole graph: its report says why
        if exc.report is None:
            raise
        return DeviceRun(outputs=None, report=exc.report, seconds=0.0)


def step_device(ctx: Context) -> StepResult:
    if not ctx.case.model:
        return "skip", "this case names no model to run on the device", {}
    _build_model(ctx)
    case, fp = ctx.case, ctx.case.fingerprint
    before = _device_run(ctx, with_draft=False)
    after = _device_run(ctx, with_draft=True)
    ctx.device_outputs = after.outputs
    base_fps = set(before.report.fingerprints())
    remaining = [v for v in after.report.violations if case.is_this(v)]
    new = [
        v for v in after.report.violations if v.fingerprint() not in base_fps and v not in remaining
    ]
    in_baseline = any(case.is_this(v) for v in before.report.violations)
    output = {
        "fingerprint": fp,
        "in_baseline": in_baseline,
        "baseline_violations": len(before.report.violations),
        "violations": len(after.report.violations),
        "remaining": [str(v) for v in remaining[:5]],
        "new": [str(v) for v in new[:10]],
        "report": after.report.summary(),
        "seconds": round(float(after.seconds), 3),
    }
    if not in_baseline:
        return (
            "fail",
            f"fingerprint {fp} did not occur without the draft; nothing to remove",
            output,
        )
    if remaining:
        return "fail", f"fingerprint {fp} still occurs with the draft: {remaining[0]}", output
    if new:
        return "fail", f"the draft brings {len(new)} new violation(s); first: {new[0]}", output
    return "pass", f"fingerprint {fp} gone; no new violation ({after.report.summary()})", output


def step_end_to_end(ctx: Context) -> StepResult:
    if not ctx.case.model:
        return "skip", "this case names no model to judge end to end", {}
    _build_model(ctx)
    from hfadapt.adapters.registry import Registry

    stock = run_forward(ctx.model, ctx.inputs)
    adapted = copy.deepcopy(ctx.model)
    Registry(adapters=[ctx.draft]).apply(adapted)  # enabled: the draft runs on the CPU too
    cpu = run_forward(adapted, ctx.inputs)
    cpu_cos = token_cosine(stock, cpu, ctx.mask)
    output: dict[str, Any] = {
        "cpu_vs_stock_min_token_cosine": cpu_cos,
        "cpu_threshold": CPU_COSINE_MIN,
    }
    if not cpu_cos >= CPU_COSINE_MIN:
        return (
            "fail",
            f"CPU with the draft vs stock: min per-token cosine {cpu_cos:.6f} < {CPU_COSINE_MIN}",
            output,
        )
    if ctx.device_outputs is None:
        return "fail", "no device output to compare (the device step did not run)", output
    if ctx.job.get("output_dir"):  # handed back as data: the parent judges them again
        from safetensors.torch import save_file

        from hfadapt.agent import end_to_end

        tensors = end_to_end.pack(main_tensor(cpu), main_tensor(ctx.device_outputs))
        save_file(tensors, str(Path(ctx.job["output_dir"]) / end_to_end.FILE))
    dev_cos = token_cosine(stock, ctx.device_outputs, ctx.mask)
    output.update(
        {"device_vs_cpu_min_token_cosine": dev_cos, "device_threshold": DEVICE_COSINE_MIN}
    )
    if not dev_cos >= DEVICE_COSINE_MIN:
        return (
            "fail",
            f"device vs CPU reference: min per-token cosine {dev_cos:.6f} < {DEVICE_COSINE_MIN}",
            output,
        )
    return (
        "pass",
        f"CPU vs stock min token cosine {cpu_cos:.6f} >= {CPU_COSINE_MIN}; "
        f"device vs CPU {dev_cos:.6f} >= {DEVICE_COSINE_MIN}",
        output,
    )


STEPS: dict[str, Callable[[Context], StepResult]] = {
    "load": step_load,
    "equivalence": step_equivalence,
    "device": step_device,
    "end_to_end": step_end_to_end,
}
SANDBOX_STEPS = tuple(STEPS)
