"""The bundled snapshot: the top 10,000 Hugging Face embedding models as typed records, and
the real config files of a few of them; what hfadapt crawls when the Hub cannot be reached.

Source and licence (Apache-2.0, Copyright IBM Corp. and the hf-adapters contributors) are in
``hfadapt/data/README.md`` and the top-level NOTICE.
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

from hfadapt.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
SNAPSHOT_FILE = DATA_DIR / "top_embedding_models.csv.gz"
CONFIGS_DIR = DATA_DIR / "configs"
# Where the snapshot comes from; shown wherever a crawl of it is reported.
SNAPSHOT_SOURCE = "torch-spyre/hf-adapters@341f21c:resources/top_embedding_models_DEPRECATED.csv"
SNAPSHOT_DATE = "July 2026"  # when that commit ranked the Hub

_COLUMNS = [
    "rank",
    "model_id",
    "downloads",
    "likes",
    "model_type",
    "architectures",
    "parameters (str)",
    "parameters",
    "library",
    "is_gated",
    "is_moe",
    "is_multimodal",
    "is_custom_code",
    "config_class",
    "is_supported",
    "Year",
]


@dataclass(frozen=True, slots=True)
class SnapshotModel:
    """One row of the snapshot, typed; empty cells are None."""

    rank: int
    model_id: str
    downloads: int
    likes: int
    model_type: str | None
    architectures: tuple[str, ...]
    parameters_str: (
        str | None
    )  # as hf-adapters wrote it: "0.02B", or a size token from the id ("7b")
    parameters: int | None
    library: str | None
    is_gated: bool
    is_moe: bool
    is_multimodal: bool
    is_custom_code: bool
    config_class: str | None
    is_supported: bool  # hf-adapters' verdict on real Spyre at snapshot time: a reference only
    year: int | None

    @property
    def parameters_from_name(self) -> bool:
        """True when the parameter count was read off the repo name, not counted from weights.

        hf-adapters prefers a size token in the id ("...-7b") over the safetensors total, so
        ``all-MiniLM-L12-v2-ft-Llama-3-70B`` reads as 70B: such a count is only a hint.
        """
        if not self.parameters_str:
            return False
        return self.parameters_str.lower() in re.split(r"[^a-z0-9.]+", self.model_id.lower())


def _bool(value: str, column: str, line: int) -> bool:
    if value in ("True", "true", "1"):
        return True
    if value in ("False", "false", "0", ""):
        return False
    raise ConfigError(f"bundled snapshot line {line}: {column}={value!r} is not a boolean")


def _int(value: str, column: str, line: int) -> int | None:
    if value == "":
        return None
    try:
        return int(float(value)) if "." in value or "e" in value.lower() else int(value)
    except ValueError:
        raise ConfigError(
            f"bundled snapshot line {line}: {column}={value!r} is not a number"
        ) from None


def parse_snapshot(text: str) -> list[SnapshotModel]:
    """Parse snapshot CSV text (the bundled file's format) into records, in file order."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ConfigError(f"snapshot CSV lacks columns: {', '.join(missing)}")
    rows = []
    for line, row in enumerate(reader, start=2):
        rank = _int(row["rank"], "rank", line)
        if rank is None or not row["model_id"]:
            raise ConfigError(f"bundled snapshot line {line}: no rank or model_id")
        archs = tuple(a for a in row["architectures"].replace(",", ";").split(";") if a)
        rows.append(
            SnapshotModel(
                rank=rank,
                model_id=row["model_id"],
                downloads=_int(row["downloads"], "downloads", line) or 0,
                likes=_int(row["likes"], "likes", line) or 0,
                model_type=row["model_type"] or None,
                architectures=archs,
                parameters_str=row["parameters (str)"] or None,
                parameters=_int(row["parameters"], "parameters", line),
                library=row["library"] or None,
                is_gated=_bool(row["is_gated"], "is_gated", line),
                is_moe=_bool(row["is_moe"], "is_moe", line),
                is_multimodal=_bool(row["is_multimodal"], "is_multimodal", line),
                is_custom_code=_bool(row["is_custom_code"], "is_custom_code", line),
                config_class=row["config_class"] or None,
                is_supported=_bool(row["is_supported"], "is_supported", line),
                year=_int(row["Year"], "Year", line),
            )
        )
    return rows


@functools.cache
def read_snapshot() -> tuple[SnapshotModel, ...]:
    """The bundled snapshot, ranked 1..10,000 by 30-day downloads (read once, then cached)."""
    with gzip.open(SNAPSHOT_FILE, "rt", encoding="utf-8", newline="") as fh:
        return tuple(parse_snapshot(fh.read()))


def _config_dir(model_id: str) -> Path:
    return CONFIGS_DIR / model_id.replace("/", "__")


@functools.cache
def bundled_config_ids() -> tuple[str, ...]:
    """Model ids whose real config.json ships with hfadapt (from configs/INDEX.csv)."""
    with (CONFIGS_DIR / "INDEX.csv").open(encoding="utf-8", newline="") as fh:
        return tuple(row["model_id"] for row in csv.DictReader(fh))


def bundled_config_dir(model_id: str) -> Path | None:
    """The folder holding a model's bundled config files (config.json, modules.json, ...), or None."""
    folder = _config_dir(model_id)
    return folder if (folder / "config.json").is_file() else None


def bundled_config(model_id: str) -> dict[str, object] | None:
    """A model's bundled config.json as a dict, or None when hfadapt does not ship it."""
    folder = bundled_config_dir(model_id)
    if folder is None:
        return None
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"bundled config.json of {model_id} is unreadable: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"bundled config.json of {model_id} is not a JSON object")
    return data
