"""Load-time use of the adapter registry: ``hfadapt.load`` and ``hfadapt.adapt``.

import hfadapt
model = hfadapt.load("sentence-transformers/all-MiniLM-L6-v2")   # adapted, fp16, on spyre
embeddings = model.encode(["hello world"])                       # sentence-transformers
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from hfadapt.adapters.registry import AppliedAdapters, Registry, default_registry
from hfadapt.errors import ModelNotFoundError, UsageError
from hfadapt.options import DType


def adapt(
    model: torch.nn.Module,
    *,
    device: str | None = "spyre",
    registry: Registry | None = None,
    only: list[str] | None = None,
    exclude: list[str] | tuple[str, ...] = (),
) -> AppliedAdapters:
    """Apply every matching adapter to this model instance (and its submodules, e.g. the
    transformer inside a SentenceTransformer). ``device=None`` keeps the patches dormant on the
    host, so a CPU run stays bit-identical to stock. Returns the handle (``.remove()``)."""
    reg = registry or default_registry()
    return reg.apply(model, device=device, only=only, exclude=exclude)


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    dt: torch.dtype = getattr(torch, DType.parse(dtype, "dtype").torch_name)
    return dt


def _is_sentence_transformer(folder: Path | None) -> bool:
    return folder is not None and (folder / "modules.json").is_file()


def load(
    model_id_or_path: str | os.PathLike[str],
    *,
    device: str | None = "spyre",
    dtype: torch.dtype | str = torch.float16,
    adapters: bool = True,
    trust_remote_code: bool = False,
    sentence_transformers: bool | None = None,
    registry: Registry | None = None,
) -> Any:
    """Load a Hub model (HF cache or download) or a local folder, apply the registry's adapters,
    convert to ``dtype`` and move it to ``device`` ("spyre" registers the simulated device
    unless the real torch-spyre is installed). A sentence-transformers model comes back as a
    ``SentenceTransformer`` whose ``encode()`` then runs on the device (``sentence_transformers``
    None: decide by the presence of modules.json). The applied adapters are at
    ``model._hfadapt_applied``."""
    from hfadapt.hub import resolve as locate
    from hfadapt.judge import load as loading

    ref = os.fspath(model_id_or_path)
    source = locate.resolve(ref)
    folder = Path(source.folder) if getattr(source, "folder", None) else None
    want_st = (
        _is_sentence_transformer(folder) if sentence_transformers is None else sentence_transformers
    )
    torch_dtype = _dtype(dtype)
    if want_st:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise UsageError(
                "this is a sentence-transformers model: pip install 'hfadapt[st]'"
            ) from exc
        if folder is None:
            raise ModelNotFoundError(
                f"{ref}: no local copy to load as a sentence-transformers model"
            )
        model: Any = SentenceTransformer(
            str(folder), device="cpu", trust_remote_code=trust_remote_code
        )
    else:
        model = loading.load(ref, trust_remote_code=trust_remote_code).model
    model.eval()
    if adapters:
        adapt(model, device=device, registry=registry)
    model.to(torch_dtype)
    if device is not None:
        if device.split(":")[0] == "spyre":
            from hfadapt.spyre.eager import device as spyre_device

            spyre_device.register()
        model.to(device)
    return model
