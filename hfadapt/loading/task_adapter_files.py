"""Where a translated family's PEFT task adapters sit in its repository (jina-embeddings-v5
nano: ``adapters/<task>/adapter_config.json`` and ``adapter_model.safetensors``, one folder per
declared task): what an online load downloads beside the weights (hfadapt.loading.load) and
what hfadapt.loading.lora reads. No torch here."""

from __future__ import annotations

from typing import Any

from hfadapt.errors import WeightsError
from hfadapt.loading import translate

__all__ = ["PEFT_FILES", "peft_adapter_files", "task_folder"]

# One task's PEFT adapter, as ``PeftModel.load_adapter`` reads it from ``adapters/<task>/``.
PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


def task_folder(task: str) -> str:
    """``task`` as one folder name: a task name the config gives is joined onto a path (and a
    Hub file name), so one that would leave ``adapters/`` (``..``, a separator) is a
    WeightsError, never a path."""
    if not task or task in (".", "..") or any(c in task for c in "/\\\0"):
        raise WeightsError(f"task {task!r} is not a folder name under the adapters folder")
    return task


def peft_adapter_files(translated_from: dict[str, Any] | None) -> list[str]:
    """The repository files of a translated model's PEFT task adapters (``translated_from``:
    its translation's evidence), every declared task's PEFT_FILES in its folder; [] for a
    family that keeps its adapters in the checkpoint (jina v3), or a config that declares no
    tasks or no trained adapters."""
    spec = (translated_from or {}).get("task_lora")
    if not spec or not spec.get("trained", True):
        return []
    family = str((translated_from or {}).get("family"))
    fam = translate.family_named(family)
    table = fam.task_lora if fam is not None else None
    if not table or table.get("format") != "peft":
        return []
    root = str(table["adapters"])
    return [f"{root}/{task_folder(str(t))}/{name}" for t in spec["tasks"] for name in PEFT_FILES]
