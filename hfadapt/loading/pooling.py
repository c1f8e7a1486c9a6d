"""How a model pools its token vectors into one sentence vector, as its sentence-transformers
configuration (``1_Pooling/config.json``, ``modules.json``) says: read with the model when it
loads, applied when its numbers are judged."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["POOLING_MODES", "PoolingSpec", "pool", "pooling_from_folder", "pooling_mode"]

POOLING_MODES = ("mean", "cls", "lasttoken", "max", "mean_sqrt_len")


@dataclass(frozen=True)
class PoolingSpec:
    """How token states become one sentence vector: sentence-transformers' Pooling (+ Normalize)."""

    mode: str = "mean"
    normalize: bool = False
    source: str = "default"  # "modules.json" / "1_Pooling/config.json", or "default"

    def describe(self) -> str:
        return f"{self.mode}{' + normalize' if self.normalize else ''} ({self.source})"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def pooling_mode(cfg: dict[str, object]) -> str | None:
    """The pooling mode a Pooling module's config.json names (None: none hfadapt knows)."""
    # sentence-transformers >= 5 writes "pooling_mode": "cls"; older files one flag per mode.
    mode = cfg.get("pooling_mode")
    if isinstance(mode, str):
        mode = {"mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max"}.get(mode, mode)
        return mode if mode in POOLING_MODES else None
    flags = (
        ("pooling_mode_cls_token", "cls"),
        ("pooling_mode_lasttoken", "lasttoken"),
        ("pooling_mode_max_tokens", "max"),
        ("pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len"),
        ("pooling_mode_mean_tokens", "mean"),
    )
    for key, name in flags:
        if cfg.get(key):
            return name
    return None


def pooling_from_folder(folder: str | Path | None) -> PoolingSpec:
    """The pooling a sentence-transformers folder declares; mean pooling when it declares none."""
    if folder is None:
        return PoolingSpec()
    root = Path(folder)
    modules = _read_json(root / "modules.json")
    pooling_dir = root / "1_Pooling"
    normalize = False
    source = "default"
    if isinstance(modules, list):
        for entry in modules:
            if not isinstance(entry, dict):
                continue
            kind = str(entry.get("type", ""))
            if kind.endswith("Pooling") and entry.get("path"):
                pooling_dir = root / str(entry["path"])
            normalize = normalize or kind.lower().endswith("normalize")
        source = "modules.json"
    cfg = _read_json(pooling_dir / "config.json")
    mode = pooling_mode(cfg) if isinstance(cfg, dict) else None
    if mode is None:
        return PoolingSpec(normalize=normalize, source=source)
    return PoolingSpec(mode=mode, normalize=normalize, source=f"{pooling_dir.name}/config.json")


def pool(hidden: torch.Tensor, mask: torch.Tensor, spec: PoolingSpec) -> torch.Tensor:
    """Sentence vectors [batch, hidden] from token states [batch, seq, hidden], pads excluded."""
    m = mask.to(hidden.dtype).unsqueeze(-1)
    counts = m.sum(dim=1).clamp(min=1.0)
    if spec.mode == "cls":
        out = hidden[:, 0]
    elif spec.mode == "lasttoken":
        # The last real token of each row, whichever side the tokenizer padded.
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = torch.where(mask > 0, positions, torch.full_like(positions, -1)).amax(dim=1)
        out = hidden[torch.arange(hidden.shape[0]), last.clamp(min=0)]
    elif spec.mode == "max":
        out = hidden.masked_fill(m == 0, float("-inf")).amax(dim=1)
    elif spec.mode == "mean_sqrt_len":
        out = (hidden * m).sum(dim=1) / counts.sqrt()
    else:
        out = (hidden * m).sum(dim=1) / counts
    if spec.normalize:
        out = torch.nn.functional.normalize(out, p=2.0, dim=-1)
    return out
