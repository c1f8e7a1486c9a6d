"""`hfadapt crawl`, `models` and `census` through the real entry point: output, JSON, exit
codes, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli_runner import run_cli as run
from support.hub_server import FakeHub, refused_url

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def test_crawl_offline_prints_a_summary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["crawl", "--offline"], monkeypatch, capsys)
    assert code == 0, err
    # what a crawl did is a summary: stderr; stdout stays empty for a pipe
    assert out == "", out
    assert (
        "crawled the bundled snapshot" in err and "seen 10,000, kept 9,907, excluded 93" in err
    ), err
    for reason, count in (("onnx_gguf_mlx_only", "74"), ("moe", "13"), ("adapter_only", "6")):
        assert any(reason in line and count in line for line in err.splitlines()), (
            f"{reason} {count} missing:\n{err}"
        )
    assert "does not know: new (239)" in err


def test_crawl_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = tmp_path / "other.db"
    code, out, err = run(
        ["crawl", "--offline", "--limit", "100", "--db", str(db), "--json"], monkeypatch, capsys
    )
    assert code == 0, err
    data = json.loads(out)
    assert (data["seen"], data["source"], data["db"]) == (100, "snapshot", str(db)), data
    assert db.is_file() and not (tmp_path / "runs.db").exists(), "--db was not used"


def test_models_and_filters(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run(["crawl", "--offline"], monkeypatch, capsys)
    code, out, err = run(["models", "--top", "3", "--json"], monkeypatch, capsys)
    assert code == 0, err
    rows = json.loads(out)
    assert next((r["rank"], r["id"]) for r in rows) == (1, MINILM) and len(rows) == 3, rows
    code, out, _ = run(
        ["models", "--model-type", "mpnet", "--top", "5", "--json"], monkeypatch, capsys
    )
    mpnet = json.loads(out)
    assert len(mpnet) == 5 and {r["model_type"] for r in mpnet} == {"mpnet"}, mpnet
    assert mpnet[0]["id"] == "sentence-transformers/all-mpnet-base-v2"
    code, out, _ = run(
        ["models", "--library", "PyLate", "--top", "1000", "--all", "--json"], monkeypatch, capsys
    )
    assert len(json.loads(out)) == 111, (
        f"{len(json.loads(out))} PyLate models (the snapshot has 111)"
    )
    code, out, _ = run(["models", "--top", "2"], monkeypatch, capsys)
    assert MINILM in out and "BAAI/bge-small-en-v1.5" in out and "167,480,843" in out, out


def test_models_all_shows_excluded_with_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run(["crawl", "--offline", "--limit", "200"], monkeypatch, capsys)
    _, kept, _ = run(["models", "--top", "200", "--json"], monkeypatch, capsys)
    _, every, _ = run(["models", "--top", "200", "--all", "--json"], monkeypatch, capsys)
    excluded = [r for r in json.loads(every) if r["excluded_reason"]]
    assert len(json.loads(every)) == 200 and len(json.loads(kept)) == 200 - len(excluded) > 0, (
        excluded
    )
    assert all(
        r["excluded_reason"] in ("onnx_gguf_mlx_only", "moe", "adapter_only") for r in excluded
    ), excluded


def test_census(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run(["crawl", "--offline"], monkeypatch, capsys)
    code, out, err = run(["census", "--json"], monkeypatch, capsys)
    assert code == 0, err
    data = json.loads(out)
    bert = data["model_types"][0]
    assert (bert["model_type"], bert["models"]) == ("bert", 3198), bert
    assert abs(100 * bert["share"] - 71.4) < 0.05, f"bert share {100 * bert['share']:.2f}%"
    code, out, _ = run(["census"], monkeypatch, capsys)
    bert_line = next(line for line in out.splitlines() if " bert " in f" {line} ")
    assert "3,198" in bert_line and "71.4%" in bert_line, bert_line


@pytest.mark.parametrize("command", ["models", "census"])
def test_before_any_crawl_is_one_line(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.db.engine import get_engine

    code, out, err = run([command], monkeypatch, capsys)  # no database at all: not created
    assert (code, err.count("\n")) == (2, 1), (code, out, err)
    assert err.startswith("error: no database at ") and "hfadapt crawl" in err, err
    get_engine(None).dispose()  # an empty database: no crawl in it yet
    code, out, err = run([command], monkeypatch, capsys)
    assert code == 2, (code, out, err)
    assert (
        err.count("\n") == 1 and err.startswith("error: no crawl in ") and "hfadapt crawl" in err
    ), err


def test_bad_input_is_one_line_with_exit_code(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    online: None,
) -> None:
    down = refused_url()
    code, _, err = run(["crawl", "--endpoint", down, "--limit", "5"], monkeypatch, capsys)
    assert code == 3 and err.count("\n") == 1 and err.startswith(f"error: cannot reach {down} ("), (
        err
    )
    assert err.endswith("crawl the bundled snapshot (offline) with --offline\n"), err
    code, _, err = run(["crawl", "--limit", "0"], monkeypatch, capsys)
    assert (code, err) == (
        2,
        "error: Invalid value for '--limit': Input should be greater than or equal to 1 (see hfadapt crawl --help)\n",
    ), err
    corrupt = tmp_path / "corrupt.db"
    corrupt.write_bytes(b"not a database at all" * 10)
    code, _, err = run(["models", "--db", str(corrupt)], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and "is not an SQLite database" in err, err
    code, _, err = run(["crawl", "--offline", "--endpoint", down], monkeypatch, capsys)
    assert code == 2 and "cannot be combined" in err, err


def test_crawl_online_through_the_cli(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["crawl", "--endpoint", fake_hub.url, "--json"], monkeypatch, capsys)
    assert code == 0, err
    data = json.loads(out)
    assert (data["source"], data["seen"], data["excluded"]["reranker"]) == (
        fake_hub.url,
        len(fake_hub.models),
        1,
    ), data
    configs = data["configs"]  # every kept model's config.json was asked for: had, or why not
    had = configs["fetched"] + sum(len(ids) for ids in configs["failed"].values())
    assert had == data["kept"] and configs["fetched"] > 0, configs


def test_a_failed_online_crawl_leaves_no_database_it_created(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    online: None,
) -> None:
    fresh = tmp_path / "fresh.db"
    code, out, err = run(["crawl", "--online", "--endpoint", refused_url(), "--db", str(fresh)],
                         monkeypatch, capsys)  # fmt: skip
    assert (code, out, err.count("\n")) == (3, "", 1), (code, out, err)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("fresh")) == []
    # a database that was there before keeps what it had (the failed crawl is recorded)
    run(["crawl", "--offline", "--limit", "5", "--db", str(fresh)], monkeypatch, capsys)
    code, _, err = run(
        ["crawl", "--endpoint", refused_url(), "--db", str(fresh)], monkeypatch, capsys
    )
    assert code == 3 and fresh.is_file(), (code, err)
    code, out, _ = run(["models", "--db", str(fresh), "--json"], monkeypatch, capsys)
    assert len(json.loads(out)) == 5, out
