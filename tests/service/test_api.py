"""``hfadapt serve``'s app in process (httpx2's ASGI transport, no socket): a model's verdict
with its history across three cycles, paged sweeps with their bounds, a diff, one-line 404
and 400 errors, the dashboard's pages escaped and self-contained, and a database the server
opens read-only (a write refused, an older schema refused, nothing changed on disk)."""

from __future__ import annotations

import asyncio
import hashlib
import re
import sqlite3
from pathlib import Path
from typing import Any

import httpx2
import pytest
from support.cycle_history import FINGERPRINT, HOSTILE

from hfadapt.db.engine import session
from hfadapt.db.tables import Cycle
from hfadapt.errors import SchemaVersionError, UsageError
from hfadapt.service.api import create_app
from hfadapt.service.database import open_results
from hfadapt.service.queries import Results


def _get(db: Path, *paths: str) -> list[httpx2.Response]:
    """GET each path from the app over ``db`` (opened as ``hfadapt serve`` opens it)."""
    engine = open_results(str(db))
    app = create_app(Results(engine))

    async def fetch() -> list[httpx2.Response]:
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.get(p, headers={"accept": "application/json"}) for p in paths]

    try:
        return asyncio.run(fetch())
    finally:
        engine.dispose()


def _page(db: Path, path: str) -> httpx2.Response:
    engine = open_results(str(db))
    app = create_app(Results(engine))

    async def fetch() -> httpx2.Response:
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.get(path, headers={"accept": "text/html"})

    try:
        return asyncio.run(fetch())
    finally:
        engine.dispose()


def test_a_model_has_its_verdict_and_its_history_across_cycles(history_db: Path) -> None:
    (found,) = _get(history_db, "/api/models/org/alpha")
    assert found.status_code == 200, found.text
    card: dict[str, Any] = found.json()
    history = [(h["cycle"], h["verdict"], h["label"]) for h in card["history"]]
    assert history == [(1, "pass", None), (2, "pass", "PASS"), (3, "lowering_failed", "FAIL")], (
        history
    )
    assert card["verdict"] == "lowering_failed" and card["regressed"] is True, card
    assert card["evidence_level"] == "config" and card["adapters"] == ["gelu-exact-host"], card
    assert [v["rule_id"] for v in card["violations"]] == ["dtype.cast"], card["violations"]
    # the next step in words (hfadapt.report.next_steps): draft for the fingerprint that blocks it
    assert f"hfadapt draft --fingerprint {FINGERPRINT}" in card["next_step"], card["next_step"]
    (beta,) = _get(history_db, "/api/models/org/beta")
    assert beta.json()["regressed"] is False and beta.json()["verdict"] == "pass", beta.json()


@pytest.mark.parametrize(
    ("path", "status", "needle"),
    [
        ("/api/models/org/nothing-here", 404, "no run of org/nothing-here"),
        ("/api/sweeps/3/diff/99", 404, "no sweep 99"),
        ("/api/sweeps?limit=0", 400, "limit: Input should be greater than or equal to 1"),
        ("/api/sweeps?limit=201", 400, "limit: Input should be less than or equal to 200"),
        ("/api/sweeps?offset=-1", 400, "offset: Input should be greater than or equal to 0"),
        ("/api/sweeps?limit=ten", 400, "limit: Input should be a valid integer"),
        ("/api/sweeps/x/diff/1", 400, "sweep_id: Input should be a valid integer"),
        ("/api/models/" + "a" * 301, 400, "model_id: String should have at most 300"),
        ("/api/nothing", 404, "no such page: /api/nothing"),
    ],
)
def test_errors_are_json_with_a_one_line_detail(
    history_db: Path, path: str, status: int, needle: str
) -> None:
    (answer,) = _get(history_db, path)
    detail = answer.json().get("detail")
    assert answer.status_code == status, (answer.status_code, answer.text)
    assert isinstance(detail, str) and "\n" not in detail and needle in detail, detail


def test_sweeps_are_paged_newest_first(history_db: Path) -> None:
    first, second, beyond = _get(
        history_db, "/api/sweeps?limit=2", "/api/sweeps?limit=2&offset=2", "/api/sweeps?offset=9"
    )
    one, two = first.json(), second.json()
    assert (one["total"], one["limit"], one["offset"]) == (3, 2, 0), one
    assert [s["id"] for s in one["items"]] == [3, 2] and [s["id"] for s in two["items"]] == [1]
    assert [s["cycle"] for s in one["items"]] == [3, 2], one["items"]
    assert one["items"][0]["counts"] == {"lowering_failed": 2, "pass": 2, "verification_failed": 1}
    assert beyond.json()["items"] == [] and beyond.json()["total"] == 3, beyond.json()


def test_a_diff_names_the_regressions_and_the_health_check_counts(history_db: Path) -> None:
    diff, health = _get(history_db, "/api/sweeps/3/diff/2", "/api/healthz")
    data = diff.json()
    assert sorted(r["model_id"] for r in data["regressions"]) == [HOSTILE, "org/alpha"], data
    assert data["counts"] == {"PASS": 2, "XFAIL": 1, "FAIL": 2, "IMPROVED": 0}, data["counts"]
    assert health.json() | {"database": ""} == {
        "status": "ok",
        "database": "",
        "cycles": 3,
        "latest_cycle": 3,
        "sweeps": 3,
    }, health.json()


def test_the_dashboard_shows_coverage_regressions_and_fingerprints(history_db: Path) -> None:
    page = _page(history_db, "/")
    html = page.text
    assert (
        page.status_code == 200 and "default-src 'none'" in page.headers["content-security-policy"]
    )
    assert re.search(r'data-points="3"', html), "the coverage chart does not have 3 cycles"
    assert html.count("<circle") == 3, html.count("<circle")
    assert (
        'href="/models/org/alpha"' in html and "Regressions in cycle 3 (against cycle 2): 2" in html
    )
    assert "f00dfeedf00d" in html and "60.0%" in html and "40.0%" in html, (
        "coverage or census missing"
    )
    # nothing fetched from elsewhere: no script, no external URL but Hub links
    assert "<script" not in html and not re.search(r"\bsrc=", html), "the page loads something"
    assert HOSTILE not in html and "evil/&lt;script&gt;" in html, "the hostile id is not escaped"


def test_a_model_page_answers_does_it_run_and_what_to_do(history_db: Path) -> None:
    failing = _page(history_db, "/models/org/alpha").text
    assert (
        "No: lowering failed." in failing and "passed in cycle 2 and fails since cycle 3" in failing
    )
    assert "What to do:" in failing and "dtype.cast" in failing
    passing = _page(history_db, "/models/org/gamma").text
    assert "Yes: it runs on Spyre (simulated)." in passing, passing[:2000]
    hostile = _page(history_db, "/models/evil/%3Cscript%3Ealert(1)%3C/script%3E")
    assert hostile.status_code == 200 and "<script>alert" not in hostile.text, hostile.text[:500]
    missing = _page(history_db, "/models/org/nothing")
    assert missing.status_code == 404 and "no run of org/nothing" in missing.text


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_database_is_opened_read_only(history_db: Path) -> None:
    before = _digest(history_db)
    responses = _get(history_db, "/api/models/org/alpha", "/api/sweeps", "/api/sweeps/3/diff/1")
    assert [r.status_code for r in responses] == [200, 200, 200]
    engine = open_results(str(history_db))
    try:
        with pytest.raises(Exception, match="is read-only"), session(engine) as sess:
            sess.add(Cycle(key="{}"))
    finally:
        engine.dispose()
    assert _digest(history_db) == before, "the server changed the database file"


def test_a_missing_empty_or_older_database_is_refused(tmp_path: Path, history_db: Path) -> None:
    with pytest.raises(UsageError, match="no database at"):
        open_results(str(tmp_path / "none.db"))
    sqlite3.connect(tmp_path / "empty.db").execute("CREATE TABLE t (x)").connection.close()
    with sqlite3.connect(history_db) as conn:
        conn.execute("DELETE FROM _hfadapt_migrations WHERE name = 'm008_cycles'")
    with pytest.raises(SchemaVersionError, match=r"older hfadapt .* from m008_cycles"):
        open_results(str(history_db))
