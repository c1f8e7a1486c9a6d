"""The bundled snapshot and configs: the real top-10,000 listing, unmodified, typed, with its
attribution; and the real config files of the most-downloaded models."""

from __future__ import annotations

import csv
import gzip
import hashlib
import itertools
from collections import Counter
from pathlib import Path

import pytest

from hfadapt.errors import ConfigError
from hfadapt.hub.snapshot import (
    CONFIGS_DIR,
    SNAPSHOT_FILE,
    bundled_config,
    bundled_config_dir,
    bundled_config_ids,
    parse_snapshot,
    read_snapshot,
)

# sha256 of torch-spyre/hf-adapters' resources/top_embedding_models_DEPRECATED.csv at 341f21c:
# the bundled copy is only gzipped, never edited.
SNAPSHOT_SHA256 = "991547efd2201c4624b23333e734bf2a1ff2b11565e757627fe0a9501dede122"
REPO_ROOT = Path(__file__).resolve().parents[2]


def test_bundled_csv_is_the_unmodified_original() -> None:
    digest = hashlib.sha256(gzip.decompress(SNAPSHOT_FILE.read_bytes())).hexdigest()
    assert digest == SNAPSHOT_SHA256, f"bundled snapshot sha256 {digest}"


def test_snapshot_has_10000_ranked_models() -> None:
    rows = read_snapshot()
    assert len(rows) == 10_000, f"{len(rows)} rows"
    assert [r.rank for r in rows] == list(range(1, 10_001))
    assert rows[0].model_id == "sentence-transformers/all-MiniLM-L6-v2"
    assert rows[0].downloads == 167_480_843 and rows[0].architectures == ("BertModel",)
    assert len({r.model_id for r in rows}) == 10_000, "duplicate model ids"
    falls = [r.rank for a, r in itertools.pairwise(rows) if r.downloads > a.downloads]
    assert not falls, f"downloads increase at ranks {falls[:5]}"


@pytest.mark.parametrize(
    ("model_type", "models", "share"),
    [
        ("bert", 3198, 71.4),
        ("xlm-roberta", 1855, 9.6),
        ("mpnet", 529, 6.7),
        ("qwen3", 384, 2.3),
        ("nomic_bert", 79, 4.0),
    ],
)
def test_snapshot_census_matches_the_published_figures(
    model_type: str, models: int, share: float
) -> None:
    rows = read_snapshot()
    total = sum(r.downloads for r in rows)
    mine = [r for r in rows if r.model_type == model_type]
    measured = 100 * sum(r.downloads for r in mine) / total
    assert len(mine) == models, f"{model_type}: {len(mine)} rows, expected {models}"
    assert abs(measured - share) < 0.05, (
        f"{model_type}: {measured:.2f}% of downloads, expected {share}%"
    )


def test_snapshot_flags_are_typed() -> None:
    rows = read_snapshot()
    counts = Counter()
    for r in rows:
        counts.update(
            {
                "custom": r.is_custom_code,
                "supported": r.is_supported,
                "no_type": r.model_type is None,
                "moe": r.is_moe,
            }
        )
    assert (counts["custom"], counts["supported"], counts["no_type"], counts["moe"]) == (
        928,
        6730,
        55,
        13,
    ), counts
    trelis = next(r for r in rows if r.model_id == "Trelis/all-MiniLM-L12-v2-ft-Llama-3-70B")
    assert trelis.parameters == 70_000_000_000 and trelis.parameters_from_name
    assert not rows[0].parameters_from_name and rows[0].parameters == 22_713_728


def test_malformed_snapshot_text_names_the_line() -> None:
    with gzip.open(SNAPSHOT_FILE, "rt", encoding="utf-8") as fh:
        first_line = fh.readline()  # the real header, then one bad row
    bad = (
        first_line
        + "1,a/b,10,1,bert,BertModel,,,sentence-transformers,maybe,False,False,False,,True,2024\n"
    )
    with pytest.raises(ConfigError) as exc:
        parse_snapshot(bad)
    assert str(exc.value) == "bundled snapshot line 2: is_gated='maybe' is not a boolean"
    with pytest.raises(ConfigError, match="lacks columns: rank"):
        parse_snapshot("model_id\nx\n")


def test_every_indexed_config_is_bundled_and_readable() -> None:
    with (CONFIGS_DIR / "INDEX.csv").open(encoding="utf-8", newline="") as fh:
        index = list(csv.DictReader(fh))
    assert len(index) == len(bundled_config_ids()) == 32, f"{len(index)} configs indexed"
    for row in index:
        config = bundled_config(row["model_id"])
        assert config is not None, f"{row['model_id']}: no config.json"
        assert config["model_type"] == row["model_type"], (
            f"{row['model_id']}: {config['model_type']}"
        )
        folder = bundled_config_dir(row["model_id"])
        assert folder is not None
        for name in row["files"].split(";"):
            assert (folder / name).is_file(), f"{row['model_id']}: {name} listed but missing"
    assert bundled_config("sentence-transformers/all-MiniLM-L6-v2")["hidden_size"] == 384  # type: ignore[index]
    assert bundled_config("nobody/nothing") is None


def test_attribution_ships_with_the_data() -> None:
    notice = (REPO_ROOT / "NOTICE").read_text(encoding="utf-8")
    readme = (SNAPSHOT_FILE.parent / "README.md").read_text(encoding="utf-8")
    for raw, name in ((notice, "NOTICE"), (readme, "hfadapt/data/README.md")):
        text = " ".join(raw.split())  # wrapped lines
        for needle in (
            "torch-spyre/hf-adapters",
            "resources/top_embedding_models_DEPRECATED.csv",
            "341f21c",
            "Apache",
            "Copyright IBM Corp. and the hf-adapters contributors",
        ):
            assert needle in text, f"{name} lacks {needle!r}"
