"""hfadapt.report.coverage on hand-made runs (conftest REPORT_MODELS: seven models, 2,000 downloads,
two sweeps): the failure census, pass rates by count and downloads, per model_type, the
cumulative curve, adapter impact, agreement with is_supported, the sweep diff; and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.errors import NotFoundError, UsageError
from hfadapt.report.coverage import (
    FAIL,
    IMPROVED,
    PASS,
    XFAIL,
    build_report,
    diff_sweeps,
    failures,
    label,
)


def test_failure_census_of_the_newest_sweep(report_engine: Any) -> None:
    census = failures(report_engine)  # sweep 2
    got = [(f.fingerprint, f.count, f.downloads, f.models) for f in census]
    # F2 blocks m/three (300) and m/six (30); F1 m/three; F3 m/four (100). Passing runs count for none.
    assert got == [
        ("F2", 2, 330, ["m/three", "m/six"]),
        ("F1", 1, 300, ["m/three"]),
        ("F3", 1, 100, ["m/four"]),
    ], got
    top = census[0]
    assert (top.rule_id, top.op) == ("rule.F2", "aten::op_f2")
    assert top.site == "transformers/models/bert/modeling_bert.py:42 in forward", top.site
    assert top.share == pytest.approx(330 / 2000)
    assert [f.fingerprint for f in failures(report_engine, top=1)] == ["F2"]


def test_failure_census_of_an_older_sweep(report_engine: Any) -> None:
    got = [(f.fingerprint, f.count, f.downloads) for f in failures(report_engine, sweep_id=1)]
    assert got == [("F1", 2, 800), ("F2", 2, 330)], got
    with pytest.raises(NotFoundError, match="no sweep 9"):
        failures(report_engine, sweep_id=9)


def test_pass_rates_by_count_downloads_and_model_type(report_engine: Any) -> None:
    r = build_report(report_engine)
    # m/five's pass (60 downloads) rests on its type's defaults: beside the headline, not in it
    assert (r.models, r.passed, r.downloads, r.passed_downloads) == (7, 2, 2000, 1500)
    assert r.pass_rate == pytest.approx(2 / 7) and r.pass_rate_downloads == pytest.approx(0.75)
    assert (r.passed_architecture, r.passed_architecture_downloads) == (1, 60)
    types = {
        t.model_type: (t.models, t.passed, t.passed_architecture, t.downloads, t.passed_downloads)
        for t in r.by_model_type
    }
    assert types == {
        "bert": (3, 2, 0, 1800, 1500),
        "qwen3": (2, 0, 1, 160, 0),
        "mpnet": (2, 0, 0, 40, 0),
    }, types
    levels = {lv.level: (lv.models, lv.passed, lv.downloads) for lv in r.by_evidence}
    assert levels == {
        "weights": (1, 0, 30),
        "config": (5, 2, 1910),
        "architecture": (1, 1, 60),
    }, levels
    assert [t.model_type for t in r.by_model_type] == ["bert", "qwen3", "mpnet"]
    verdict_rows = {v: (n, d) for v, n, d in r.verdicts}
    assert verdict_rows == {
        "pass": (3, 1560),
        "lowering_failed": (3, 430),
        "custom_code": (1, 10),
    }, verdict_rows
    assert r.sweep is not None and r.sweep["id"] == 2 and r.sweep["status"] == "done"


def test_cumulative_downloads_against_rank(report_engine: Any) -> None:
    points = build_report(report_engine).cumulative
    expected = [
        (1, 0.5, 0.5),
        (2, 0.75, 0.75),
        (3, 0.9, 0.75),
        (4, 0.95, 0.75),
        (5, 0.98, 0.75),
        (6, 0.995, 0.75),
        (7, 1.0, 0.75),
    ]
    assert [p[0] for p in points] == [e[0] for e in expected]
    for got, want in zip(points, expected, strict=True):
        assert got[1] == pytest.approx(want[1]) and got[2] == pytest.approx(want[2]), (got, want)


def test_adapters_unblock_only_models_that_failed_without_them(report_engine: Any) -> None:
    """Applied is not unblocked. Sweep 2: a1 applied to m/one (1,000), which never failed:
    unblocked nothing; a2 applied to m/two (500), which failed in sweep 1 without it:
    unblocked it. Sweep 1: m/four passed with a1 and a2 and fails in sweep 2 with neither, so
    both unblocked it (100); m/one (a1) never failed."""
    from hfadapt.report.coverage import AdapterImpact

    now = build_report(report_engine).adapters
    assert now == [
        AdapterImpact("a2", applied=1, applied_downloads=500, unblocked=1, unblocked_downloads=500),
        AdapterImpact("a1", applied=1, applied_downloads=1000, unblocked=0, unblocked_downloads=0),
    ], now
    before = build_report(report_engine, sweep_id=1).adapters
    assert before == [
        AdapterImpact(
            "a1", applied=2, applied_downloads=1100, unblocked=1, unblocked_downloads=100
        ),
        AdapterImpact("a2", applied=1, applied_downloads=100, unblocked=1, unblocked_downloads=100),
    ], before


def test_agreement_with_is_supported(report_engine: Any) -> None:
    a = build_report(report_engine).agreement
    counts = (a.both_yes, a.both_no, a.only_ours, a.only_theirs, a.unknown)
    assert counts == (2, 2, 1, 1, 1), counts  # m/six has no reference value
    assert (a.only_ours_models, a.only_theirs_models) == (["m/five"], ["m/four"])
    assert a.compared == 6 and a.rate == pytest.approx(4 / 6)


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        ("pass", "pass", PASS),
        ("lowering_failed", "pass", IMPROVED),
        ("pass", "worker_timeout", FAIL),
        ("skipped", "load_failed", XFAIL),
    ],
)
def test_labels_follow_the_benchmark_harness(before: str, after: str, expected: str) -> None:
    assert label(before, after) == expected


def test_diff_between_two_sweeps(report_engine: Any) -> None:
    d = diff_sweeps(report_engine, 2, 1)
    assert d.counts == {PASS: 1, XFAIL: 3, FAIL: 1, IMPROVED: 2}, d.counts
    assert [(c.model_id, c.before, c.after, c.label) for c in d.changed] == [
        ("m/four", "pass", "lowering_failed", FAIL),
        ("m/two", "lowering_failed", "pass", IMPROVED),
        ("m/five", "verification_failed", "pass", IMPROVED),
    ]
    assert (d.only_current, d.only_baseline) == (0, 0)
    report = build_report(report_engine, against=1)
    assert report.diff is not None and report.diff.counts == d.counts
    with pytest.raises(NotFoundError, match="no sweep 7"):
        build_report(report_engine, against=7)


def test_other_failures_group_runs_without_a_fingerprint(report_engine: Any) -> None:
    assert build_report(report_engine).other_failures == [
        ("custom_code", "needs the repository's own code", 1, 10)
    ]
    assert build_report(report_engine, sweep_id=1).other_failures[0] == (
        "verification_failed",
        "verification_failed of m/five",
        1,
        60,
    )


def test_without_sweeps_the_latest_run_of_each_model_counts(tmp_path: Path) -> None:
    from hfadapt.db.engine import get_engine, session
    from hfadapt.db.tables import Run

    engine = get_engine(str(tmp_path / "plain.db"))
    with pytest.raises(UsageError, match="run `hfadapt sweep` first"):
        build_report(engine)
    with session(engine) as sess:
        sess.add(Run(model_id="x/a", verdict="lowering_failed", fingerprints=["F9"]))
        sess.add(Run(model_id="x/a", verdict="pass"))  # newer: x/a passes now (level unknown)
        sess.add(Run(model_id="x/b", verdict="lowering_failed", fingerprints=["F9"]))
    r = build_report(engine)
    # a pass with no evidence level recorded (a row older than m005) is counted beside
    assert (r.sweep, r.models, r.passed, r.passed_unknown) == (None, 2, 0, 1)
    assert [(lv.level, lv.models, lv.passed) for lv in r.by_evidence][-1] == ("unknown", 2, 1)
    assert [(f.fingerprint, f.models) for f in r.fingerprints] == [("F9", ["x/b"])]
    engine.dispose()


def test_report_json_round_trips(report_engine: Any) -> None:
    data = json.loads(json.dumps(build_report(report_engine, against=1).to_dict(), default=str))
    assert data["pass_rate_downloads"] == pytest.approx(0.75) and data["agreement"]["compared"] == 6
    rows = {
        m["model_id"]: (m["rank"], m["verdict"], m["evidence_level"]) for m in data["model_rows"]
    }
    assert rows["m/five"] == (5, "pass", "architecture") and len(rows) == 7, rows
    assert data["blockers"] == [
        {"verdict": "custom_code", "downloads": 10, "models": ["m/seven"], "share": 10 / 2000,
         "example_reason": "custom_code of m/seven", "count": 1}
    ], data["blockers"]  # fmt: skip
    assert data["fingerprints"][0]["fingerprint"] == "F2" and data["fingerprints"][0]["count"] == 2
    assert data["diff"]["counts"] == {"PASS": 1, "XFAIL": 3, "FAIL": 1, "IMPROVED": 2}


def test_cli_failures_and_report(
    report_engine: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hfadapt.db.engine import sqlite_path

    def run(args: list[str]) -> tuple[int, str, str]:
        return run_cli(args, monkeypatch, capsys)

    db = str(sqlite_path(report_engine.url))
    code, out, err = run(["failures", "--db", db])
    assert code == 0, err
    assert out.index("F2") < out.index("F1") < out.index("F3"), out
    assert out.index("custom_code") < out.index("F2"), out
    code, out, err = run(["failures", "--db", db, "--json", "--sweep", "1"])
    got = [(f.get("fingerprint") or f["group"], f["downloads"]) for f in json.loads(out)]
    # every failing row: fingerprints, then the rows without one grouped by verdict
    assert got == [("F1", 800), ("F2", 330), ("verification_failed", 60), ("custom_code", 10)], got
    html, js, table = tmp_path / "r.html", tmp_path / "r.json", tmp_path / "r.csv"
    code, out, err = run(
        ["report", "--db", db, "--against", "1", "--html", str(html), "--output", str(js),
         "--csv", str(table)]
    )  # fmt: skip
    assert code == 0, err
    assert "own weights or config 2 (28.6% by count, 75.0% by downloads)" in out, out
    assert "architecture passes 1 (this model's shapes were not checked)" in out, out
    lines = table.read_text().splitlines()
    assert (
        lines[0]
        == "rank,model_id,model_type,verdict,evidence_level,downloads,note,hub_url,run_id,bound_used"
    ), lines[0]
    five = next(line for line in lines if ",m/five," in line)
    assert five.startswith(
        "5,m/five,qwen3,pass,architecture,60,architecture passes; this model's shapes were not checked,https://huggingface.co/m/five,"
    ), five
    assert len(lines) == 8, lines
    assert "PASS 1, XFAIL 3, FAIL 1, IMPROVED 2" in out and "66.7%" in out, out
    assert (
        html.read_text().startswith("<!DOCTYPE html>") and json.loads(js.read_text())["models"] == 7
    )
    # --json is a flag, as everywhere else: the report on stdout, nothing else.
    code, out, err = run(["report", "--db", db, "--json"])
    assert code == 0 and json.loads(out)["models"] == 7, (code, out, err)
    code, out, err = run(["report", "--db", db, "--sweep", "5"])
    assert code == 2 and err.count("\n") == 1 and "5" in err, (code, err)


def test_report_against_the_reported_sweep_refuses(
    report_engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.db.engine import sqlite_path

    db = str(sqlite_path(report_engine.url))
    for args in (["--against", "2"], ["--sweep", "1", "--against", "1"]):
        code, out, err = run_cli(["report", "--db", db, *args], monkeypatch, capsys)
        assert code == 2 and err.startswith("error: --against ") and err.count("\n") == 1, (
            args,
            code,
            err,
        )
        assert "is the sweep being reported" in err and not out, (args, out, err)
    with pytest.raises(UsageError, match=r"^against=2 is the sweep being reported"):
        build_report(report_engine, against=2)


@pytest.mark.parametrize(
    "command", ["report", "failures", "models", "attempts", "census", "sweeps"]
)
def test_read_only_commands_refuse_a_missing_database(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in ("typo.db", "::::"):
        missing = tmp_path / name
        code, out, err = run_cli([command, "--db", str(missing)], monkeypatch, capsys)
        assert (code, err.count("\n")) == (2, 1), (command, name, code, out, err)
        assert err.startswith(f"error: no database at {missing}"), err
        assert not missing.exists(), f"{command} created {missing}"


def test_failures_at_80_columns_keep_each_call_site_line_number(
    report_engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.db.engine import sqlite_path

    db = str(sqlite_path(report_engine.url))
    _, out, _ = run_cli(["failures", "--db", db, "--json"], monkeypatch, capsys)
    sites = [f["site"] for f in json.loads(out) if f.get("site")]
    assert sites, out
    code, out, _ = run_cli(["failures", "--db", db], monkeypatch, capsys, columns=80)
    widest = max(len(line) for line in out.splitlines())
    assert code == 0 and widest <= 80, f"{widest} columns:\n{out}"
    for site in sites:
        where = site.partition(" in ")[0].rpartition("/")[2]  # file.py:LINE
        assert any(where in line for line in out.splitlines()), f"{where} cut:\n{out}"
