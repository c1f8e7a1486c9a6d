"""Failures with no error: a device defect (profile ``defects``) that fired silently while the
model lowered, found by ``diagnose`` (``evidence["defects"]``, :mod:`hfadapt.judge.defect_evidence`)
and localized to the first divergent module (:mod:`hfadapt.judge.localize`). Each defect
becomes a case whose target is the ``forward`` of the model's module where it fired: the module
whose output is misread when the defect names one (``defect.post_ln_handoff``: "the output of
embeddings.LayerNorm", which the model's ``BertEmbeddings`` returns), else the module that
misreads; a module of torch's own (``LayerNorm``, ``Linear``) stands for its nearest model
class above it. The device step checks that the defect no longer fires there
(:func:`hfadapt.agent.graph_proof.step_device`), the end-to-end step that the model got better."""

from __future__ import annotations

import hashlib
import inspect
import re
from typing import Any

import torch

from hfadapt.adapters.graph_adapter import TARGET_PACKAGES
from hfadapt.agent.cases import FailureCase, target_source
from hfadapt.judge.evidence_types import Evidence

__all__ = ["DEFECT_MATCH", "defect_cases", "defect_fingerprint", "producer_of", "target_module"]

# FailureCase.match for a defect case: the device step looks for the defect's firings.
DEFECT_MATCH = "defect"
# The module whose output a cross-graph defect misreads, as the compiled backend words it
# (hfadapt.spyre.compile.handoff: "... (the output of embeddings.LayerNorm)").
_PRODUCER = re.compile(r"\(the output of ([A-Za-z0-9_.]+)\)\s*$")


def producer_of(effect: str) -> str | None:
    """The module path whose output the defect misreads, when the firing's effect names one."""
    found = _PRODUCER.search(effect or "")
    return found.group(1) if found else None


def _submodule(model: torch.nn.Module, path: str) -> tuple[str, torch.nn.Module] | None:
    """(path in ``model``, module) for a path recorded on the device, which may carry a
    wrapper's prefix (a pipeline with heads): leading parts are dropped until it resolves."""
    parts = [p for p in path.split(".") if p]
    for start in range(len(parts) + 1):
        rest = ".".join(parts[start:])
        try:
            return rest, model.get_submodule(rest) if rest else model
        except AttributeError:
            continue
    return None


def _draftable(module: torch.nn.Module) -> bool:
    cls = type(module)
    return cls.__module__.startswith(TARGET_PACKAGES) and "forward" in vars(cls)


def target_module(model: torch.nn.Module, path: str) -> tuple[str, str] | None:
    """(module path, target "module:Class.forward") for the module at ``path`` or its nearest
    ancestor whose class a graph may replace (a model class defining its own forward); None
    when there is none below the root."""
    found = _submodule(model, path)
    if found is None:
        return None
    rest, _ = found
    parts = rest.split(".") if rest else []
    while parts:
        here = ".".join(parts)
        module = model.get_submodule(here)
        if _draftable(module):
            cls = type(module)
            return here, f"{cls.__module__}:{cls.__qualname__}.forward"
        parts.pop()
    return None


def defect_fingerprint(defect_id: str, op: str, dtype: str, target: str) -> str:
    """Stable id of (defect, op, dtype, target class), shaped like a violation's fingerprint."""
    key = "|".join((defect_id, op, dtype, target))
    return hashlib.sha1(key.encode()).hexdigest()[:12]


def _location(target: str) -> str:
    import pkgutil

    try:
        fn = pkgutil.resolve_name(target)
        _, start = inspect.getsourcelines(fn)
        return f"{inspect.getsourcefile(fn)}:{start} in {fn.__qualname__}"
    except (ImportError, AttributeError, OSError, TypeError):
        return ""


def defect_cases(
    evidence: Evidence,
    model: torch.nn.Module,
    *,
    divergence: Any = None,
    base: dict[str, Any] | None = None,
) -> list[FailureCase]:
    """One case per (defect, target module) among the defects that fired
    (``evidence["defects"]``): the target the module where it fired (see the module doc), its
    evidence the defect, its source, the firings, the module localized as first divergent
    (``divergence``) and the model's metrics. ``base``: FailureCase fields every case takes
    (model, execution, profile)."""
    cases: dict[str, FailureCase] = {}
    localized = divergence.to_dict() if divergence is not None else None
    for entry in evidence.get("defects") or []:
        defect_id, source, effect = entry["defect_id"], entry["source"], entry["effect"]
        for firing in entry.get("firings", []):
            misread = producer_of(effect)
            place = misread or firing["module"]
            found = target_module(model, place) or target_module(model, firing["module"])
            if found is None:
                continue
            module_path, target = found
            fp = defect_fingerprint(defect_id, firing["op"], firing["dtype"], target)
            case = cases.get(fp)
            if case is not None:
                case.evidence["firings"].append(firing)
                continue
            case = FailureCase(
                name=fp,
                fingerprint=fp,
                rule_id=defect_id,
                op=firing["op"],
                message=(
                    f"no error: the model lowers and runs, and the card computes wrong numbers. "
                    f"Device defect {defect_id} fired in {firing['module']} "
                    f"({firing['module_class']}, {firing['op']})"
                    + (f", reading the output of {misread}" if misread else "")
                    + f": {effect}"
                ),
                target=target,
                kind="method",
                location=_location(target),
                dtype=firing["dtype"],
                evidence={
                    "defect": {"id": defect_id, "source": source, "effect": effect},
                    "module": module_path,
                    "module_class": target.rpartition(":")[2].rpartition(".")[0],
                    "output_misread": misread,
                    "firings": [firing],
                    "first_divergent_module": localized,
                },
                enclosing_source=target_source(target),
                match=DEFECT_MATCH,
                **(base or {}),
            )
            cases[fp] = case
    return list(cases.values())
