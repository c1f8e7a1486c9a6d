"""How one model is judged, as one frozen value handed down from the caller (``diagnose``, a
sweep, the drafting agent) to every phase: the load mode, how the device runs it and in what
dtype, the profile, which adapters apply (and which registry adapters are left out), whether a numeric failure is localized, and whether
the model's own code may run (sandboxed). Strings are accepted where an enum is expected and
checked once, here, with a UsageError that names the parameter."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Self

from hfadapt.errors import UsageError, option
from hfadapt.options import DType, Execution, Mode

__all__ = ["AUTO", "JudgeOptions", "dtype_option"]

AUTO = "auto"  # a dtype option meaning "the profile's dtype for the model's family"


def dtype_option(value: DType | str | None, parameter: str = "dtype") -> DType | None:
    """A dtype option as a member, or None for the profile's family dtype (None or "auto")."""
    if value is None or value == AUTO:
        return None
    return DType.parse(value, parameter)


@dataclass(frozen=True)
class JudgeOptions:
    """How to judge a model (see module doc). ``dtype`` None: the profile's dtype for the
    model's family (bf16 for Gemma and T5, fp16 otherwise), recorded with its source."""

    mode: Mode = Mode.FULL
    execution: Execution = Execution.COMPILE
    dtype: DType | None = None
    profile: str | None = None  # a device profile name (None: the default profile)
    adapters: bool = True  # apply the registry's adapters to the device copy
    without_adapters: tuple[str, ...] = ()  # ... except these (by name): what does one buy?
    localize: bool = True  # find the first divergent module of a numeric failure
    trust_remote_code: bool = False  # run the model's own code, only in the OS sandbox
    unsafe_no_isolation: bool = False  # ... even where bubblewrap cannot isolate it

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode.parse(self.mode, "mode"))
        object.__setattr__(self, "execution", Execution.parse(self.execution, "execution"))
        object.__setattr__(self, "dtype", dtype_option(self.dtype))
        left_out = tuple(dict.fromkeys(str(n).strip() for n in self.without_adapters))
        object.__setattr__(self, "without_adapters", left_out if self.adapters else ())
        if self.unsafe_no_isolation and not self.trust_remote_code:
            raise UsageError(
                f"{option('unsafe_no_isolation')} applies only with {option('trust_remote_code')}"
            )

    @property
    def structural(self) -> bool:
        return self.mode == Mode.STRUCTURAL

    @property
    def dtype_name(self) -> str:
        """The dtype as stored with a run or a sweep: its value, or "auto"."""
        return self.dtype.value if self.dtype is not None else AUTO

    def but(self, **changes: Any) -> Self:
        """A copy with ``changes`` (checked like the original)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (enums as their strings), for a job file or a stored record."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = list(value)
            out[f.name] = value.value if hasattr(value, "value") else value
        return out
