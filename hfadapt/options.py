"""The option types shared by the library and the CLI: one StrEnum per choice, so the allowed
values are written once. The library validates with ``parse`` and names the *parameter* in its
error; the CLI hands the same enums to typer, which names the *flag*."""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from hfadapt.errors import UsageError

__all__ = ["DType", "EvidenceLevel", "Execution", "Executor", "Mode", "OptionEnum"]


class OptionEnum(StrEnum):
    """A choice among fixed strings; ``parse`` turns a string (or a member) into a member."""

    @classmethod
    def choices(cls) -> tuple[str, ...]:
        return tuple(member.value for member in cls)

    @classmethod
    def parse(cls, value: str | Self, parameter: str) -> Self:
        """``value`` as a member, or a UsageError naming ``parameter`` and the allowed values."""
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(cls.choices())
            raise UsageError(f"{parameter} must be one of {allowed}, not {value!r}") from None


class Mode(OptionEnum):
    """How a model is loaded for judging: its real weights, or its config with seeded weights."""

    FULL = "full"
    STRUCTURAL = "structural"


class Execution(OptionEnum):
    """How the simulated device runs a model: op by op, or as one compiled graph."""

    EAGER = "eager"
    COMPILE = "compile"


class DType(OptionEnum):
    """The dtype a model runs in on the device (the CPU reference is always fp32)."""

    FP16 = "fp16"
    BF16 = "bf16"
    FP32 = "fp32"

    @property
    def torch_name(self) -> str:
        """The torch dtype's attribute name (``getattr(torch, d.torch_name)``); options stay
        importable without torch."""
        return {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[self.value]


class Executor(OptionEnum):
    """Where a sweep's units run: a local process pool, or Ray tasks."""

    LOCAL = "local"
    RAY = "ray"


class EvidenceLevel(OptionEnum):
    """What a verdict rests on: the model's own weights, its own config, or only its model
    type's defaults (then the model's own shapes were not checked)."""

    WEIGHTS = "weights"
    CONFIG = "config"
    ARCHITECTURE = "architecture"
