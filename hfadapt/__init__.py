"""hfadapt: which Hugging Face embedding models run on IBM Spyre, and adapters that make more
of them run. Importing this package is cheap; torch and transformers load on first use.

    import hfadapt
    model = hfadapt.load("sentence-transformers/all-MiniLM-L6-v2")  # adapted, fp16, on spyre
    vectors = model.encode(["Spyre runs this."])
    print(hfadapt.applied(model).names)                              # the adapters it runs
    diag = hfadapt.diagnose("sentence-transformers/all-MiniLM-L6-v2", record=False)
    print(diag.verdict, diag.reason)

Everything a caller needs is named here; the modules behind these names are not an API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hfadapt.errors import (
    AdapterError,
    AgentError,
    ConfigError,
    CustomCodeError,
    DatabaseUnavailableError,
    DeviceError,
    DraftError,
    EndpointError,
    GraphError,
    HfadaptError,
    HubError,
    HubResponseError,
    HubUnreachableError,
    InputError,
    IsolationUnavailableError,
    MigrationImpossible,
    MissingDependencyError,
    ModelNotFoundError,
    NotFoundError,
    OutputError,
    ProfileError,
    PromptError,
    SandboxError,
    SchemaVersionError,
    SpyreLoweringError,
    SpyreOpError,
    SpyreOpNotImplementedError,
    SpyreUnsupportedModelError,
    StoreError,
    SweepError,
    TokenizerError,
    UntrustedDataError,
    UsageError,
    WeightsError,
)
from hfadapt.options import DType, EvidenceLevel, Execution, Executor, Mode
from hfadapt.verdicts import Verdict
from hfadapt.version import __version__

if TYPE_CHECKING:  # the lazy names below, typed for checkers and editors
    from hfadapt.adapters.registry import AppliedAdapters, Registry
    from hfadapt.api import adapt, applied, load, register_device
    from hfadapt.judge.diagnose import diagnose
    from hfadapt.judge.diagnosis import Diagnosis
    from hfadapt.noise import held_message_counts
    from hfadapt.spyre.rules.tracking import warning_counts as device_warning_counts

__all__ = [
    "AdapterError",
    "AgentError",
    "AppliedAdapters",
    "ConfigError",
    "CustomCodeError",
    "DType",
    "DatabaseUnavailableError",
    "DeviceError",
    "Diagnosis",
    "DraftError",
    "EndpointError",
    "EvidenceLevel",
    "Execution",
    "Executor",
    "GraphError",
    "HfadaptError",
    "HubError",
    "HubResponseError",
    "HubUnreachableError",
    "InputError",
    "IsolationUnavailableError",
    "MigrationImpossible",
    "MissingDependencyError",
    "Mode",
    "ModelNotFoundError",
    "NotFoundError",
    "OutputError",
    "ProfileError",
    "PromptError",
    "Registry",
    "SandboxError",
    "SchemaVersionError",
    "SpyreLoweringError",
    "SpyreOpError",
    "SpyreOpNotImplementedError",
    "SpyreUnsupportedModelError",
    "StoreError",
    "SweepError",
    "TokenizerError",
    "UntrustedDataError",
    "UsageError",
    "Verdict",
    "WeightsError",
    "__version__",
    "adapt",
    "applied",
    "device_warning_counts",
    "diagnose",
    "held_message_counts",
    "load",
    "register_device",
]

# The names that need torch, imported on first use.
_LAZY = frozenset(
    {"AppliedAdapters", "Diagnosis", "Registry", "adapt", "applied", "diagnose", "load"}
    | {"device_warning_counts", "held_message_counts", "register_device"}
)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'hfadapt' has no attribute {name!r}")
    if name in ("AppliedAdapters", "Registry"):
        from hfadapt.adapters import registry

        value: Any = getattr(registry, name)
    elif name == "Diagnosis":
        from hfadapt.judge.diagnosis import Diagnosis

        value = Diagnosis
    elif name == "device_warning_counts":
        from hfadapt.spyre.rules.tracking import warning_counts

        value = warning_counts
    elif name == "diagnose":  # library messages held while it runs, as the command line holds them
        from hfadapt.judge.diagnose import diagnose
        from hfadapt.noise import held

        value = held(diagnose)
    elif name == "held_message_counts":
        from hfadapt.noise import held_message_counts

        value = held_message_counts
    else:
        from hfadapt import api

        value = getattr(api, name)
    globals()[name] = value  # once: later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
