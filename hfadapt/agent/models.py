"""The model a failure case is judged on, built by the parent from trusted code only: one of
hfadapt's model builders (``{"builder": "pkg.mod:fn"}``, seed 0) or a model loaded exactly as
``hfadapt diagnose`` loads it (``{"ref": id or folder, "structural": bool}``) with its probe
inputs. Built once per process and handed out as copies (proofs convert dtypes and devices)."""

from __future__ import annotations

import copy
import pkgutil
import threading
from dataclasses import dataclass
from typing import Any

import torch

from hfadapt.errors import UsageError

BUILDER_MODULES = ("hfadapt.agent.evalcases:", "hfadapt.adapters.examples:")


@dataclass
class CaseModel:
    model: torch.nn.Module  # float32, eval, on the CPU
    inputs: dict[str, Any]
    mask: torch.Tensor | None


_CACHE: dict[tuple[str, bool], CaseModel] = {}
_LOCK = threading.Lock()


def _build(spec: dict[str, Any]) -> CaseModel:
    if "builder" in spec:
        ref = str(spec["builder"])
        if not ref.startswith(BUILDER_MODULES):
            raise UsageError(f"model builder {ref!r} is not one of hfadapt's")
        with torch.random.fork_rng(devices=[]):
            model, inputs = pkgutil.resolve_name(ref)(0)
        mask = inputs.get("attention_mask") if isinstance(inputs, dict) else None
        return CaseModel(model.float().eval(), inputs, mask)
    from hfadapt.loading.loader import load_model
    from hfadapt.loading.probes import build_probes, model_inputs

    loaded = load_model(spec["ref"], "structural" if spec.get("structural", True) else "full")
    if hasattr(loaded.config, "use_cache"):
        loaded.config.use_cache = False
    batch = build_probes(loaded)
    inputs = model_inputs(loaded.model, batch)
    return CaseModel(loaded.model.float().eval(), inputs, batch.attention_mask)


def case_model(spec: dict[str, object] | None) -> CaseModel:
    """A fresh copy of the case's model with its inputs (UsageError when the case names none)."""
    if not spec:
        raise UsageError("this case names no model to judge on")
    key = (str(spec.get("builder") or spec.get("ref")), bool(spec.get("structural", True)))
    with _LOCK:
        found = _CACHE.get(key)
        if found is None:
            found = _CACHE[key] = _build(spec)
            while len(_CACHE) > 2:
                _CACHE.pop(next(iter(_CACHE)))
    return CaseModel(copy.deepcopy(found.model), found.inputs, found.mask)


def remember(
    spec: dict[str, Any], model: torch.nn.Module, inputs: dict[str, Any], mask: torch.Tensor | None
) -> None:
    """Keep a model the parent has already loaded (``hfadapt draft`` diagnosed it) for the
    proofs of the cases found on it, so it is not loaded twice."""
    key = (str(spec.get("builder") or spec.get("ref")), bool(spec.get("structural", True)))
    with _LOCK:
        _CACHE[key] = CaseModel(copy.deepcopy(model).float().eval(), inputs, mask)


__all__ = ["CaseModel", "case_model", "remember"]
