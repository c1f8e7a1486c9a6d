"""``hfadapt report --against`` says when the two sweeps' runs rested on different
environments (package versions, the device's numeric path: hfadapt.judge.environment), in the
terminal, the JSON and the HTML report; and says nothing when they match."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli
from support.sweeps import store_crawl

OLD = {
    "hfadapt": "0.1.0", "profile": "spyre-2026.07@2026.07.2", "python": "3.11.7",
    "torch": "2.13.0+cpu", "transformers": "5.24.0", "kernels": "absent",
    "numeric.dl16": "native", "numeric.amx": "tiles", "numeric.cpu": "AVX512",
}  # fmt: skip
NEW = {**OLD, "transformers": "5.25.0", "kernels": "0.19.1", "numeric.amx": "fp32"}
EXPECTED = "transformers 5.24.0 -> 5.25.0, kernels absent -> 0.19.1, numeric.amx tiles -> fp32"
MODELS = ("m/a", "m/b", "m/c")


@pytest.fixture
def env_engine(tmp_path: Path) -> Iterator[Any]:
    """Sweeps 1 and 2 over three models: 1 in OLD, 2 in NEW (its third row records none),
    3 in OLD again."""
    from hfadapt.db.engine import get_engine
    from hfadapt.hub.catalog import HubRecord
    from hfadapt.sweep.store import finish_sweep, open_sweep, write_rows

    engine = get_engine(str(tmp_path / "env.db"))
    store_crawl(engine, [HubRecord(id=m, downloads=10, model_type="bert") for m in MODELS])
    for index, versions in enumerate((OLD, NEW, OLD)):
        sweep, _ = open_sweep(engine, {"n": index}, resume=False, mode="structural", models=3)
        assert sweep.id is not None
        rows = [
            {"model_id": m, "verdict": "pass", "reason": "ok", "model_type": "bert",
             "evidence_level": "config",
             "versions": None if (versions is NEW and m == "m/c") else versions}
            for m in MODELS
        ]  # fmt: skip
        write_rows(engine, sweep.id, rows)
        finish_sweep(engine, sweep.id, seconds=1.0)
    yield engine
    engine.dispose()


def test_the_diff_names_each_key_that_differs(env_engine: Any) -> None:
    from hfadapt.report.coverage import build_report

    diff = build_report(env_engine, sweep_id=2, against=1).diff
    assert diff is not None
    line = diff.environment_line()
    print(f"\n{line}")
    assert [str(c) for c in diff.environment_changes] == EXPECTED.split(", "), line
    assert line == f"environments differ (sweep 1 -> sweep 2): {EXPECTED}", line
    assert diff.environments == {"baseline": 1, "current": 1}, diff.environments
    same = build_report(env_engine, sweep_id=3, against=1).diff
    assert same is not None and same.environment_changes == [] and same.environment_line() == ""


def test_report_against_prints_the_difference(
    env_engine: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hfadapt.db.engine import sqlite_path

    db = str(sqlite_path(env_engine.url))
    html, js = tmp_path / "r.html", tmp_path / "r.json"
    args = ["report", "--db", db, "--sweep", "2", "--against", "1"]
    code, out, err = run_cli([*args, "--html", str(html), "--output", str(js)], monkeypatch, capsys)
    assert code == 0, err
    line = next((x.strip() for x in out.splitlines() if "environments differ" in x), "")
    assert line == f"environments differ (sweep 1 -> sweep 2): {EXPECTED}", out
    changes = json.loads(js.read_text())["diff"]["environment_changes"]
    assert changes[0] == {"key": "transformers", "before": ["5.24.0"], "after": ["5.25.0"]}, changes
    assert len(changes) == 3, changes
    page = html.read_text()
    assert EXPECTED.replace(">", "&gt;") in page, page[page.find('id="diff"') :][:2000]
    code, out, err = run_cli(
        ["report", "--db", db, "--sweep", "3", "--against", "1"], monkeypatch, capsys
    )
    assert code == 0 and "against sweep 1" in out and "environments" not in out, (code, out, err)
