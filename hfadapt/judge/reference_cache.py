"""The CPU reference cache: a model's fp32 reference on the probes, kept on disk so that judging
the same model again (another ``diagnose`` of it: ``--eager``, another dtype, an adapter left
out) does not run the two reference forwards again (1.1 s of a 9 s diagnose of
all-MiniLM-L6-v2; about 10 s for a 335M-parameter model).

An entry is stored only after the reference passed its checks in the process that computed
it: two runs bit-identical, finite on real tokens. What it was computed from is all in its key,
so the same key means the same computation:

- the model: its class and the source file that defines it, its module tree, its config (the
  attention implementation included), and every parameter and buffer (name, dtype, shape and
  a sha256 of the bytes);
- the probe inputs (every tensor's bytes), and the code that reads the reference out
  (hfadapt.judge.metrics);
- where it ran: the torch and transformers versions, torch's CPU capability and thread count
  (fp32 sums can round otherwise), the hfadapt version;
- how torch computed float32 while it ran (hfadapt.spyre.numerics.host_state.state: the float32 matmul
  precision and every oneDNN fp32 setting, autocast, the default dtype, deterministic
  algorithms), read when the key is made. Judging runs under ``host_state.pinned()``, so these
  are constant there; a reference that was not computed in exact float32 (a caller's
  ``torch.set_float32_matmul_precision("medium")`` or autocast reaching it) is not keyed at all.

A model with forward hooks, or one whose own code runs (``trust_remote_code``, judged in the
sandbox, which has the cache off), is not cached. Entries are safetensors files (no pickles),
``<cache home>/reference/<key>.safetensors``, in a bounded folder (hfadapt.disk_cache):
``HFADAPT_REFERENCE_CACHE_MB`` (default 256), ``HFADAPT_REFERENCE_CACHE=0`` turns it off,
``hfadapt cache clear`` empties it. A sweep does not use it: each model is judged once.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from hfadapt import settings
from hfadapt.disk_cache import BoundedFolder
from hfadapt.spyre.numerics import host_state

__all__ = ["ReferenceCache", "cache_info", "clear", "default_cache"]

log = logging.getLogger(__name__)

FORMAT = "1"
DEFAULT_MB = 256
SUFFIX = ".safetensors"
NAME = "reference"


def directory() -> Path:
    return settings.kernel_cache() / "reference"


@lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """The hfadapt version and the source of what reads the reference out of a model's
    outputs (hfadapt.judge.metrics)."""
    from hfadapt.judge import metrics
    from hfadapt.version import __version__

    digest = hashlib.sha256(__version__.encode())
    try:
        digest.update(Path(str(metrics.__file__)).read_bytes())
    except OSError:
        digest.update(b"metrics")
    return digest.hexdigest()


def _source_digest(cls: type) -> str:
    try:
        return hashlib.sha256(Path(inspect.getfile(cls)).read_bytes()).hexdigest()
    except (OSError, TypeError):
        return "unknown"


def _hash_tensor(digest: Any, name: str, t: torch.Tensor) -> None:
    t = t.detach()
    digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|{t.device.type}|".encode())
    if t.device.type == "meta":
        return
    flat = t.contiguous().reshape(-1)
    if flat.numel():
        digest.update(flat.view(torch.uint8).numpy().data)


def _has_hooks(model: torch.nn.Module) -> bool:
    from torch.nn.modules import module as nn_module

    if any(
        getattr(nn_module, name, None)
        for name in ("_global_forward_hooks", "_global_forward_pre_hooks")
    ):
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def reference_key(model: torch.nn.Module, inputs: Mapping[str, object]) -> str | None:
    """The key of ``model``'s reference on ``inputs`` (see the module doc); None when it cannot
    be keyed (hooks, a model without a config, float32 not computed exactly now)."""
    import transformers

    config = getattr(model, "config", None)
    ambient = host_state.state()
    if config is None or _has_hooks(model) or not host_state.exact(ambient):
        return None
    weights = hashlib.sha256()
    for name, t in model.state_dict(keep_vars=False).items():
        _hash_tensor(weights, name, t)
    given = hashlib.sha256()
    for name in sorted(inputs):
        value = inputs[name]
        if isinstance(value, torch.Tensor):
            _hash_tensor(given, name, value)
        else:
            given.update(f"{name}={value!r}".encode())
    try:
        config_text = config.to_json_string(use_diff=False)
    except (TypeError, ValueError, AttributeError):
        return None
    cls = type(model)
    parts = {
        "format": FORMAT,
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "source": _source_digest(cls),
        "modules": repr(model),
        "config": config_text,
        "attention": str(getattr(config, "_attn_implementation", None)),
        "training": model.training,
        "weights": weights.hexdigest(),
        "inputs": given.hexdigest(),
        "hfadapt": _code_fingerprint(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "numerics": ambient,  # its default dtype too
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class ReferenceCache:
    """One cache folder, bounded to ``max_bytes``."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.folder = BoundedFolder(root, max_bytes, SUFFIX)

    def load(self, key: str) -> torch.Tensor | None:
        """The reference stored under ``key``; None on a miss or an entry that does not read
        back whole (which the next store replaces)."""
        raw = self.folder.read(key)
        if raw is None:
            return None
        from safetensors import SafetensorError
        from safetensors.torch import load as load_tensors

        try:
            tensors = load_tensors(raw)
        except (SafetensorError, ValueError, RuntimeError) as exc:
            log.info("reference cache: ignoring entry %s (%s)", key[:12], exc)
            return None
        key_tensor = tensors.get("key")
        value = tensors.get(NAME)
        if (
            not isinstance(value, torch.Tensor)
            or value.dtype != torch.float32
            or key_tensor is None
            or bytes(key_tensor.numpy().tobytes()) != key.encode()
        ):
            log.info("reference cache: ignoring entry %s (another key or dtype)", key[:12])
            return None
        self.folder.touch(key)
        return value

    def store(self, key: str, reference: torch.Tensor) -> bool:
        """Write the entry (atomically); False where the disk does not take it."""
        from safetensors.torch import save as save_tensors

        key_tensor = torch.frombuffer(bytearray(key.encode()), dtype=torch.uint8)
        data = save_tensors(
            {NAME: reference.detach().float().contiguous(), "key": key_tensor},
            metadata={"format": FORMAT},
        )
        written, _ = self.folder.write(key, data)
        return written

    def clear(self) -> tuple[int, int]:
        """Remove every entry and temporary file: (entries, temporary files) removed."""
        return self.folder.clear()

    def info(self) -> dict[str, object]:
        return {**self.folder.info(), "enabled": settings.reference_cache_enabled()}


def max_bytes() -> int:
    return max(int(settings.reference_cache_mb(DEFAULT_MB) * 2**20), 0)


def default_cache() -> ReferenceCache | None:
    """The cache in the cache home, None when turned off."""
    if not settings.reference_cache_enabled():
        return None
    return ReferenceCache(directory(), max_bytes())


def cache_info() -> dict[str, object]:
    return ReferenceCache(directory(), max_bytes()).info()


def clear() -> tuple[int, int]:
    """Remove every entry, and the temporary files of writes (killed writers' leftovers):
    (entries, temporary files) removed."""
    return ReferenceCache(directory(), max_bytes()).clear()
