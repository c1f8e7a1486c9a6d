"""How close each model came to its verdict's bounds, where users read it: ``hfadapt show``
(text and JSON), the report's per-model rows (JSON, CSV, the HTML table's data) and the
service's model answer. A run recorded before margins shows a dash, never a crash."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from typing import Any

import httpx2
import pytest
from sqlmodel import col, select
from support.cli_runner import run_cli

from hfadapt.db.engine import session, sqlite_path
from hfadapt.db.tables import Run
from hfadapt.judge.margin import margin_of
from hfadapt.judge.metrics import Metrics
from hfadapt.report.card import model_card
from hfadapt.report.coverage import build_report
from hfadapt.report.html import render_html
from hfadapt.report.models import rows_csv

# m/one's newest run: min token cosine 0.99994 and norm error 4.27% (0.04266 / 0.05 = 85.3%
# of its bound, the worst); m/two passed before margins were recorded
SHARE = 0.04266 / 0.05


def _with_margin(engine: Any, model_id: str = "m/one") -> None:
    metrics = Metrics(
        min_token_cosine=0.99994, mean_token_cosine=0.99999, pooled_cosine=0.99999,
        max_abs_diff=0.01, has_nan=False, has_inf=False, tokens=40, nonfinite_tokens=0,
        worst_token=(0, 1), max_norm_error=0.04266,
    )  # fmt: skip
    with session(engine) as sess:
        stmt = select(Run).where(col(Run.model_id) == model_id).order_by(col(Run.id).desc())
        run = sess.exec(stmt).first()
        assert run is not None
        run.evidence = {**(run.evidence or {}), "margin": margin_of(metrics).to_dict()}
        sess.add(run)


def test_the_card_and_show_give_the_share_and_a_dash_for_old_runs(
    report_engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _with_margin(report_engine)
    card, old = model_card(report_engine, "m/one"), model_card(report_engine, "m/two")
    assert card["bound_used"] == pytest.approx(SHARE, abs=1e-12), card["bound_used"]
    assert card["margin"]["worst"] == "max token norm error", card["margin"]
    assert (old["bound_used"], old["margin"]) == (None, None), old
    db = str(sqlite_path(report_engine.url))
    code, out, err = run_cli(["show", "m/one", "--db", db], monkeypatch, capsys)
    assert code == 0, err
    assert "margin: 85% of the bound used at worst (max token norm error)" in out, out
    assert "max token norm error 4.27% of 5.00% (85% of the bound used)" in out, out
    assert "min token cosine 0.999940, 0.0099 above its bound 0.99" in out, out
    code, out, err = run_cli(["show", "m/two", "--db", db], monkeypatch, capsys)
    assert code == 0 and "  margin: -\n" in out, (code, out, err)
    code, out, err = run_cli(["show", "m/one", "--db", db, "--json"], monkeypatch, capsys)
    assert json.loads(out)["bound_used"] == pytest.approx(SHARE), out


def test_the_report_rows_csv_and_html_carry_the_share(report_engine: Any) -> None:
    _with_margin(report_engine)
    report = build_report(report_engine)
    shares = {r.model_id: r.bound_used for r in report.model_rows}
    assert shares["m/one"] == pytest.approx(SHARE, abs=1e-12), shares
    assert [m for m, s in shares.items() if s is not None] == ["m/one"], shares
    table = {
        row["model_id"]: row for row in csv.DictReader(io.StringIO(rows_csv(report.model_rows)))
    }
    assert float(table["m/one"]["bound_used"]) == pytest.approx(SHARE), table["m/one"]
    assert table["m/two"]["bound_used"] == "", table["m/two"]
    html = render_html(report)
    assert "<th data-key='bound_used' class='n'>bound used</th>" in html, "no column heading"
    assert '"bound_used": 0.853' in html, "the share is not in the rows' data"
    assert 'typeof r.bound_used === "number"' in html, "the table's script draws no share"


def test_the_service_model_answer_has_the_share(report_engine: Any) -> None:
    from hfadapt.service.api import create_app
    from hfadapt.service.database import open_results
    from hfadapt.service.queries import Results

    _with_margin(report_engine)
    engine = open_results(str(sqlite_path(report_engine.url)))

    async def fetch(path: str, accept: str = "application/json") -> httpx2.Response:
        transport = httpx2.ASGITransport(app=create_app(Results(engine)))
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get(path, headers={"accept": accept})

    try:
        one, two = asyncio.run(fetch("/api/models/m/one")), asyncio.run(fetch("/api/models/m/two"))
        page, old = (asyncio.run(fetch(f"/models/{m}", "text/html")) for m in ("m/one", "m/two"))
    finally:
        engine.dispose()
    assert one.status_code == 200 and two.status_code == 200, (one.text, two.text)
    answer = one.json()
    assert answer["bound_used"] == pytest.approx(SHARE), answer
    assert answer["margin"]["text"].startswith("85% of the bound used"), answer["margin"]
    assert two.json()["bound_used"] is None and two.json()["margin"] is None, two.json()
    # the dashboard's model page says it in words, a dash for the old run
    assert page.status_code == 200 and "max token norm error 4.27% of 5.00%" in page.text, page.text
    assert "<b>How close to the bounds:</b> &mdash;</p>" in old.text, old.text
