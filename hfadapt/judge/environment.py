"""What a run rests on besides the model and its options: the versions of every package that
can move a verdict, and the numeric path the simulated device takes on this machine. One flat
``dict[str, str]`` with the stable keys of ``KEYS`` (docs/design.md, "The environment of a
run"); it is what ``Diagnosis.versions``, the ``versions`` column of runs.db and
``hfadapt diagnose --json`` hold, and what a resumed sweep and ``hfadapt report --against``
compare.

Cheap to ask: package versions come from their installed metadata (nothing is imported for
them), and the numeric path is read from the DL16 kernels' loaders when this process has
loaded them, else predicted as they would decide (no compiler is run just to ask). A run
asks again once the device has run, so what it records is what it used.

No torch at import time: reports and ``hfadapt show`` use the comparison and the summary."""

from __future__ import annotations

import platform
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from typing import Any

from hfadapt import settings

__all__ = [
    "ABSENT",
    "KEYS",
    "NUMERIC_KEYS",
    "PACKAGES",
    "UNRECORDED",
    "EnvChange",
    "changes",
    "describe_changes",
    "distinct",
    "environment",
    "numeric_path",
    "package_versions",
    "summary",
    "unrecorded_keys",
]

ABSENT = "absent"  # an optional package that is not installed
UNRECORDED = "unrecorded"  # a key a stored run did not record (rows older than the key)

# key -> distribution name: every package whose release can change a verdict (kernels: pulled
# in by transformers 5.25, it swaps hub kernels into models; the rest load, tokenize, pool).
PACKAGES: tuple[tuple[str, str], ...] = (
    ("torch", "torch"),
    ("transformers", "transformers"),
    ("kernels", "kernels"),
    ("sentence-transformers", "sentence-transformers"),
    ("huggingface_hub", "huggingface-hub"),
    ("safetensors", "safetensors"),
    ("tokenizers", "tokenizers"),
)
# The simulated device's arithmetic on this machine: DL16 kernels native (C) or torch ops,
# products on AMX's bf16 tiles or the fp32 path, torch's CPU ISA, float32 matmul precision.
NUMERIC_KEYS: tuple[str, ...] = (
    "numeric.dl16",
    "numeric.amx",
    "numeric.cpu",
    "numeric.matmul_precision",
)
KEYS: tuple[str, ...] = (
    "hfadapt",
    "profile",
    "python",
    *(key for key, _ in PACKAGES),
    *NUMERIC_KEYS,
)
# what a one-line summary shows, in this order (the full dict is in --json)
_SUMMARY = (
    "profile",
    "torch",
    "transformers",
    "kernels",
    "sentence-transformers",
    "numeric.dl16",
    "numeric.amx",
    "numeric.cpu",
)
# CPU flags (Linux /proc/cpuinfo) that hfadapt_amx_ready asks CPUID for
_AMX_FLAGS = frozenset({"amx_bf16", "amx_tile", "avx512f", "avx512bw"})


def environment(profile: Any) -> dict[str, str]:
    """The run's environment: ``KEYS`` in order, every value a string (see module doc).
    ``profile``: the device profile (its ``name`` and ``version``)."""
    from hfadapt.version import __version__

    return {
        "hfadapt": __version__,
        "profile": f"{profile.name}@{profile.version}",
        "python": platform.python_version(),
        **package_versions(),
        **numeric_path(),
    }


@lru_cache(maxsize=1)
def package_versions() -> dict[str, str]:
    """Each package of ``PACKAGES`` -> its installed version, or ``"absent"`` (read once per
    process: installing a package under a running process does not change what it imported)."""
    found: dict[str, str] = {}
    for key, dist in PACKAGES:
        try:
            found[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[key] = ABSENT
    return found


def numeric_path() -> dict[str, str]:
    """The ``numeric.*`` keys: what the device's arithmetic runs on in this process."""
    import torch

    dl16 = _dl16_path()
    return {
        "numeric.dl16": dl16,
        "numeric.amx": _amx_path(dl16),
        "numeric.cpu": str(torch.backends.cpu.get_cpu_capability()),
        "numeric.matmul_precision": _matmul_precision(),
    }


def _matmul_precision() -> str:
    """``torch.get_float32_matmul_precision()`` (``highest``: exact fp32); where torch refuses
    to say (per-backend settings that contradict it), oneDNN's matmul setting."""
    import torch

    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        setting = getattr(torch.backends.mkldnn, "matmul", None)
        return f"mkldnn:{getattr(setting, 'fp32_precision', '?')}"


def _dl16_path() -> str:
    """``native`` when the C DL16 kernels are (or would be) used, else ``torch``. Once any of
    their loaders has run in this process, its answer; before that, what ``_library`` would
    decide: not with HFADAPT_NATIVE_DL16=0, nor without a C compiler (a build that then fails
    is seen when the run asks again after the device ran)."""
    from hfadapt.spyre.numerics import dl16_native

    if _library_decided():
        return "native" if dl16_native.available() else "torch"
    if not settings.native_dl16():
        return "torch"
    return "native" if _compiler() else "torch"


def _library_decided() -> bool:
    """Whether a loader of the C kernels ran in this process (each goes through the one cached
    library load): then asking them builds nothing."""
    from hfadapt.spyre.numerics import dl16_native

    loaders = (
        dl16_native.load,
        dl16_native.load_sum_truncated,
        dl16_native.load_sum_truncated_round,
        dl16_native.load_accumulate_truncated,
        dl16_native.load_softmax_floor,
        dl16_native.load_layer_norm,
        dl16_native.load_aten_sum,
        dl16_native.load_row_program,
    )
    return any(loader.cache_info().currsize for loader in loaders)


def _compiler() -> str | None:
    """The C compiler dl16_native would build with ($CC, else cc or gcc on PATH)."""
    named = settings.c_compiler()
    if named:
        return shutil.which(named)
    return shutil.which("cc") or shutil.which("gcc")


def _amx_path(dl16: str) -> str:
    """``tiles`` when the device's products are (or would be) made on AMX's bf16 tiles, else
    ``fp32``. With the C kernels loaded, their own check (CPU and the kernel's grant of the
    tile state); before, predicted from the CPU flags."""
    if dl16 != "native" or not settings.native_amx():
        return "fp32"
    if _library_decided():
        from hfadapt.spyre.numerics import amx

        return "tiles" if amx.available() else "fp32"
    return "tiles" if _cpu_has_amx() else "fp32"


def _cpu_has_amx() -> bool:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return _AMX_FLAGS.issubset(line.partition(":")[2].split())
    except OSError:
        pass
    return False


# ---- reading and comparing recorded environments (no torch) ---------------------------------


def distinct(recorded: Iterable[object]) -> list[dict[str, str]]:
    """The distinct environments among stored ``versions`` values, in the order first seen;
    values that are not a non-empty dict (rows that recorded none) are left out."""
    seen: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for value in recorded:
        if not isinstance(value, Mapping) or not value:
            continue
        env = {str(k): str(v) for k, v in value.items()}
        seen.setdefault(tuple(sorted(env.items())), env)
    return list(seen.values())


@dataclass(frozen=True)
class EnvChange:
    """One key whose recorded values differ: the values before (and after), sorted."""

    key: str
    before: tuple[str, ...]
    after: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.key} {'/'.join(self.before)} -> {'/'.join(self.after)}"


def _ordered(keys: Iterable[str]) -> list[str]:
    """``KEYS`` first in their order, then any other key by name (a newer hfadapt's)."""
    keys = set(keys)
    return [k for k in KEYS if k in keys] + sorted(keys - set(KEYS))


def _values(envs: list[dict[str, str]], key: str) -> tuple[str, ...]:
    return tuple(sorted({env[key] for env in envs if key in env}))


def changes(
    before: Iterable[Mapping[str, object]], after: Iterable[Mapping[str, object]]
) -> list[EnvChange]:
    """The keys whose values differ between two sets of environments (each a ``versions``
    dict), as ``EnvChange``s in ``KEYS`` order. Only keys both sides recorded are compared:
    a key one side never recorded says nothing about a change (see ``unrecorded_keys``)."""
    old, new = distinct(before), distinct(after)
    found: list[EnvChange] = []
    for key in _ordered({k for env in old for k in env} & {k for env in new for k in env}):
        was, now = _values(old, key), _values(new, key)
        if was != now:
            found.append(EnvChange(key, was, now))
    return found


def unrecorded_keys(
    before: Iterable[Mapping[str, object]], after: Iterable[Mapping[str, object]]
) -> list[str]:
    """The keys only one side recorded (runs of an older hfadapt record fewer), when both
    recorded an environment at all."""
    old, new = distinct(before), distinct(after)
    if not old or not new:
        return []
    was = {k for env in old for k in env}
    now = {k for env in new for k in env}
    return _ordered(was ^ now)


def describe_changes(found: Iterable[EnvChange]) -> str:
    """``transformers 5.24.0 -> 5.25.0, kernels absent -> 0.19.1``."""
    return ", ".join(str(c) for c in found)


def summary(versions: Mapping[str, object]) -> str:
    """One line for a person: the profile, the packages most likely to move a verdict, the
    numeric path (``hfadapt diagnose``, ``hfadapt show``); the rest is in --json."""
    parts = []
    for key in _SUMMARY:
        if key in versions:
            name = key.removeprefix("numeric.")
            parts.append(f"{name} {versions[key]}")
    return ", ".join(parts) if parts else "not recorded"
