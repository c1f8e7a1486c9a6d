"""Every verdict says what it rests on: the evidence level of run rows (weights / config /
architecture), old rows read as unknown, each sweep member's own level, and a model whose
config is in the HF cache judged on its own shapes (cointegrated/rubert-tiny2, hidden 312)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from support.sweeps import store_crawl

from hfadapt import verdicts
from hfadapt.db.engine import get_engine
from hfadapt.hub.crawl import snapshot_records
from hfadapt.judge.evidence import describe_source, level_of_source, pass_note
from hfadapt.sweep.options import SweepOptions
from hfadapt.sweep.run import run_sweep

RUBERT = "cointegrated/rubert-tiny2"
# cointegrated/rubert-tiny2's config.json (its shapes: hidden 312, 12 heads, intermediate 600)
RUBERT_CONFIG = {
    "architectures": ["BertForPreTraining"],
    "attention_probs_dropout_prob": 0.1,
    "emb_size": 312,
    "gradient_checkpointing": False,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 312,
    "initializer_range": 0.02,
    "intermediate_size": 600,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 2048,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 3,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "transformers_version": "4.48.0",
    "type_vocab_size": 2,
    "use_cache": True,
    "vocab_size": 83828,
}


def _cache_config(hf_home: Path, repo: str, config: dict[str, Any]) -> Path:
    """Put ``config`` in the HF cache as huggingface_hub lays it out (refs/main -> snapshot)."""
    root = hf_home / "hub" / ("models--" + repo.replace("/", "--"))
    sha = "0123456789abcdef0123456789abcdef01234567"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(sha)
    snap = root / "snapshots" / sha
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(config))
    return snap


def _rows(engine: Any, sweep_id: int) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        result = conn.execute(sa.text("SELECT * FROM run WHERE sweep_id = :s"), {"s": sweep_id})
        return {r["model_id"]: dict(r) for r in result.mappings()}


def test_sources_map_to_levels() -> None:
    got = {
        s: getattr(level_of_source(s), "value", None)
        for s in ("cache", "structural:cache", "structural:bundled", "structural:crawl",
                  "structural:defaults", "nowhere", None)
    }  # fmt: skip
    assert got == {
        "cache": "weights",
        "structural:cache": "config",
        "structural:bundled": "config",
        "structural:crawl": "config",
        "structural:defaults": "architecture",
        "nowhere": None,
        None: None,
    }, got
    assert "shapes were not checked" in describe_source("structural:defaults")
    assert pass_note("architecture") == "architecture passes; this model's shapes were not checked"


def test_old_rows_read_unknown_after_m005(tmp_path: Path) -> None:
    """A database at m004 with a run row: migrating adds evidence_level, the old row is NULL."""
    from hfadapt.db import migrations

    path = tmp_path / "old.db"
    raw = sa.create_engine(f"sqlite:///{path}")
    upto = [m for m in migrations.MIGRATIONS if m.__name__ != "m005_run_evidence_level"]
    with raw.begin() as conn:
        migrations._migrations_table.create(conn, checkfirst=True)
        for fn in upto:
            fn(conn)
            conn.execute(
                migrations._migrations_table.insert().values(name=fn.__name__, applied_at="x")
            )
        # m001 creates today's run table: take the column away again, as a m004 database had it
        conn.execute(sa.text("DROP INDEX IF EXISTS ix_run_evidence_level"))
        conn.execute(sa.text("ALTER TABLE run DROP COLUMN evidence_level"))
        cols = {c["name"] for c in sa.inspect(conn).get_columns("run")}
        conn.execute(sa.text("INSERT INTO run (model_id, verdict, mode, execution, dtype, started_at) "
                             "VALUES ('old/model', 'pass', 'structural', 'eager', 'fp16', '2026-01-01')"))  # fmt: skip
    raw.dispose()
    assert "evidence_level" not in cols, cols
    engine = get_engine(str(path))
    with engine.connect() as conn:
        level = conn.execute(sa.text("SELECT evidence_level FROM run")).scalar_one()
        names = [
            r[0]
            for r in conn.execute(sa.text("SELECT name FROM _hfadapt_migrations ORDER BY rowid"))
        ]
    engine.dispose()
    assert level is None and names[-1] == "m005_run_evidence_level", (level, names)


def test_each_member_carries_its_own_level(tmp_path: Path, fake_worker: str) -> None:
    """Three BERTs: one with a crawled config, one with hfadapt's bundled real config, one with
    only its model_type (defaults). The level follows each model's own config, never its
    representative's."""
    wanted = ("sentence-transformers/all-MiniLM-L6-v2", "BAAI/bge-small-en-v1.5",
              "intfloat/multilingual-e5-small")  # fmt: skip
    records = [r for r in snapshot_records(100) if r.id in wanted]
    crawled = next(r for r in records if r.id == "intfloat/multilingual-e5-small")
    crawled.config = {"model_type": "bert", "hidden_size": 384, "num_attention_heads": 12,
                      "intermediate_size": 1536, "vocab_size": 250037}  # fmt: skip
    engine = get_engine(str(tmp_path / "runs.db"))
    store_crawl(engine, records)
    result = run_sweep(engine, SweepOptions(workers=1, resume=False), worker=fake_worker)
    rows = _rows(engine, result.sweep_id)
    engine.dispose()
    got = {
        m: (r["evidence_level"], json.loads(r["evidence"]).get("config_source"))
        for m, r in rows.items()
    }
    assert got == {
        "sentence-transformers/all-MiniLM-L6-v2": ("config", "structural:bundled"),
        "BAAI/bge-small-en-v1.5": ("architecture", "structural:defaults"),
        "intfloat/multilingual-e5-small": ("config", "structural:crawl"),
    }, got


def test_offline_sweep_judges_a_cached_config_on_its_shapes(
    tmp_path: Path, isolated_state: Path, monkeypatch: Any
) -> None:
    """rubert-tiny2 with its config.json in the HF cache, offline, real worker: hidden 312 is
    off the stick, so the verdict is unsupported_model, with config evidence from the cache."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cache_config(isolated_state, RUBERT, RUBERT_CONFIG)
    records = [r for r in snapshot_records(200) if r.id == RUBERT]
    assert len(records) == 1 and records[0].config is None
    engine = get_engine(str(tmp_path / "runs.db"))
    store_crawl(engine, records)
    result = run_sweep(engine, SweepOptions(workers=1, resume=False))
    row = _rows(engine, result.sweep_id)[RUBERT]
    engine.dispose()
    evidence = json.loads(row["evidence"])
    seen = (row["verdict"], row["evidence_level"], evidence.get("config_source"))
    assert seen == (verdicts.UNSUPPORTED_MODEL, "config", "structural:cache"), (seen, row["reason"])
    assert "312" in row["reason"], row["reason"]


def test_diagnose_header_says_where_the_config_came_from(capsys: Any) -> None:
    """The structural header names the config source and the level; never "real config" for a
    model type's defaults (bge-small judged as BERT-base was the bug)."""
    from hfadapt.cli.diagnose import render
    from hfadapt.judge.diagnosis import Diagnosis

    shown = {}
    for source, level in (
        ("structural:defaults", "architecture"),
        ("structural:bundled", "config"),
    ):
        diag = Diagnosis(model_id="BAAI/bge-small-en-v1.5", verdict="pass", reason="ok",
                         mode="structural", execution="eager", dtype="fp16", structural=True,
                         config_source=source, evidence_level=level)  # fmt: skip
        render(diag)
        shown[source] = " ".join(capsys.readouterr().out.split())
    defaults, bundled = shown["structural:defaults"], shown["structural:bundled"]
    assert (
        "structural run (architecture evidence): config: the model_type's default config"
        in defaults
    ), defaults
    assert "own shapes were not checked" in defaults and "real config" not in defaults, defaults
    assert (
        "structural run (config evidence): config: its own config.json, from the real configs bundled"
        in bundled
    ), bundled
