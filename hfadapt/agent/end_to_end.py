"""The end-to-end verdict, judged again by the parent. The sandbox hands back the adapted
model's main output on the CPU and on the simulated device as safetensors (``FILE``); the
parent, which never imported the draft, rebuilds the stock model and its probe inputs from the
case's trusted model builder, runs it on the CPU and computes the per-token cosines itself.

Cases whose model is a Hub model (``ref``) are not re-judged here: rebuilding it would load the
model a second time in the parent; their end-to-end verdict stays the sandbox's."""

from __future__ import annotations

from typing import Any

import torch

# End-to-end thresholds (docs/design.md, "Validating an adapter").
CPU_COSINE_MIN = 0.999
DEVICE_COSINE_MIN = 0.99
FILE = "end_to_end.safetensors"
CPU = "cpu"
DEVICE = "device"


def run_forward(model: Any, inputs: Any) -> Any:
    with torch.no_grad():
        return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def main_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state") and out.last_hidden_state is not None:
        return out.last_hidden_state
    values = out.values() if isinstance(out, dict) else out
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"no tensor in the model output ({type(out).__name__})")


def token_cosine(ref: Any, cand: Any, mask: torch.Tensor | None) -> float:
    """Minimum cosine over tokens (rows of the last dimension), pads excluded; two all-zero
    rows count as identical."""
    a, b = main_tensor(ref).detach().cpu().double(), main_tensor(cand).detach().cpu().double()
    if a.shape != b.shape:
        return float("nan")
    if mask is not None and a.dim() == 3 and tuple(mask.shape) == tuple(a.shape[:2]):
        a, b = a[mask.bool()], b[mask.bool()]
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    cos = (a * b).sum(-1) / (na * nb).clamp(min=1e-300)
    cos = torch.where((na == 0) & (nb == 0), torch.ones_like(cos), cos)
    return float(cos.min()) if cos.numel() else float("nan")


def pack(cpu: torch.Tensor, device: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The tensors the sandbox writes: float32, contiguous, on the CPU."""
    out = {CPU: cpu.detach().cpu().float().contiguous()}
    if device is not None:
        out[DEVICE] = device.detach().cpu().float().contiguous()
    return out


def stock_run(model_spec: dict[str, Any]) -> tuple[Any, torch.Tensor | None] | None:
    """The stock model's output and mask from the trusted builder (seed 0, as the sandbox
    builds it), with the caller's random state left as it was; None for a Hub model."""
    from hfadapt.agent.cases import resolve_ref

    if "builder" not in model_spec:
        return None
    with torch.random.fork_rng(devices=[]):
        model, inputs = resolve_ref(model_spec["builder"])(0)
        mask = inputs.get("attention_mask") if isinstance(inputs, dict) else None
        return run_forward(model.float().eval(), inputs), mask


def judge(model_spec: dict[str, Any], data: bytes) -> tuple[str, str, dict[str, Any]]:
    """(status, summary, numbers) of the parent's end-to-end check on the sandbox's bytes."""
    from safetensors.torch import load

    stock = stock_run(model_spec)
    if stock is None:
        return "skip", "not run: a Hub model is not rebuilt in the parent", {}
    try:
        produced = load(data)
    except Exception as exc:  # untrusted bytes: a malformed file is the draft's failure
        return "fail", f"the sandbox's end-to-end outputs do not read as safetensors: {exc}", {}
    if CPU not in produced or DEVICE not in produced:
        return "fail", f"the sandbox's end-to-end outputs lack {CPU!r} or {DEVICE!r}", {}
    ref, mask = stock
    cpu_cos = token_cosine(ref, produced[CPU], mask)
    dev_cos = token_cosine(ref, produced[DEVICE], mask)
    numbers = {
        "cpu_vs_stock_min_token_cosine": cpu_cos,
        "device_vs_stock_min_token_cosine": dev_cos,
    }
    if not cpu_cos >= CPU_COSINE_MIN:
        return (
            "fail",
            f"CPU with the draft vs stock: min token cosine {cpu_cos:.6f} < {CPU_COSINE_MIN}",
            numbers,
        )
    if not dev_cos >= DEVICE_COSINE_MIN:
        return (
            "fail",
            f"device with the draft vs stock: min token cosine {dev_cos:.6f} < {DEVICE_COSINE_MIN}",
            numbers,
        )
    return "pass", f"CPU {cpu_cos:.6f}, device {dev_cos:.6f} vs stock", numbers
