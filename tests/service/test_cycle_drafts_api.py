"""What ``hfadapt cycle --draft`` recorded, where the service shows it: ``GET
/api/cycles/{id}/drafts`` (totals over every row, a page of rows most downloads blocked
first, 404 for an unknown cycle, 400 for a bad page) in process with FastAPI's TestClient, and
the regression webhook's JSON carrying the cycle's drafting summary."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from hfadapt.db.engine import get_engine, session
from hfadapt.db.tables import CycleDraft
from hfadapt.service.api import create_app
from hfadapt.service.compare import Change
from hfadapt.service.database import open_results
from hfadapt.service.drafting import DraftBudget, DraftingResult
from hfadapt.service.queries import Results
from hfadapt.service.webhook import regression_summary

ADAPTERS = Path("/home/someone/.hfadapt/adapters")
# cycle 3's drafts: (fingerprint, model, downloads blocked, outcome, attempts, tokens in, out)
DRAFTS = [
    ("aaaa11111111", "org/n1", 9_000, "accepted", 2, 2400, 600),
    ("bbbb22222222", "org/n2", 5_000, "refused", 3, 3600, 900),
    ("cccc33333333", "org/n3", 3_000, "skipped_budget", 0, 0, 0),
]


def _rows(cycle_id: int) -> list[CycleDraft]:
    return [
        CycleDraft(cycle_id=cycle_id, fingerprint=fp, model_id=model, downloads=downloads,
                   outcome=outcome, attempts=attempts, tokens_in=t_in, tokens_out=t_out,
                   reason=None if outcome == "accepted" else f"{outcome} reason",
                   adapter_path=str(ADAPTERS / f"draft-{fp}") if outcome == "accepted" else None)
        for fp, model, downloads, outcome, attempts, t_in, t_out in DRAFTS
    ]  # fmt: skip


@pytest.fixture
def client(history_db: Path) -> Iterator[TestClient]:
    """The app over history_db (three completed cycles) with DRAFTS recorded for cycle 3."""
    writer = get_engine(str(history_db))
    with session(writer) as sess:
        sess.add_all(_rows(3))
    writer.dispose()
    engine = open_results(str(history_db))
    with TestClient(create_app(Results(engine))) as test_client:
        yield test_client
    engine.dispose()


def test_a_cycles_drafts_are_paged_with_totals_over_every_row(client: TestClient) -> None:
    first = client.get("/api/cycles/3/drafts", params={"limit": 2})
    assert first.status_code == 200, first.text
    page = first.json()
    totals = {k: page[k] for k in ("cycle", "fingerprints", "accepted", "attempts", "tokens")}
    # attempts 2 + 3 + 0; tokens 2400 + 600 + 3600 + 900
    assert totals == {"cycle": 3, "fingerprints": 3, "accepted": 1, "attempts": 5,
                      "tokens": 7500}, totals  # fmt: skip
    assert page["outcomes"] == {"accepted": 1, "refused": 1, "skipped_budget": 1}, page
    assert (page["total"], page["limit"], page["offset"]) == (3, 2, 0), page
    assert [i["fingerprint"] for i in page["items"]] == ["aaaa11111111", "bbbb22222222"], page
    assert page["items"][0]["adapter_path"].endswith("draft-aaaa11111111"), page["items"][0]
    rest = client.get("/api/cycles/3/drafts", params={"limit": 2, "offset": 2}).json()
    assert [(i["fingerprint"], i["outcome"]) for i in rest["items"]] == [
        ("cccc33333333", "skipped_budget")
    ], rest
    assert rest["accepted"] == 1 and rest["tokens"] == 7500, rest  # totals do not page
    none = client.get("/api/cycles/1/drafts").json()  # a cycle that drafted nothing
    assert (none["total"], none["items"], none["tokens"]) == (0, [], 0), none


@pytest.mark.parametrize(
    ("path", "status", "needle"),
    [
        ("/api/cycles/99/drafts", 404, "no cycle 99 in"),
        ("/api/cycles/0/drafts", 400, "cycle_id: Input should be greater than or equal to 1"),
        ("/api/cycles/x/drafts", 400, "cycle_id: Input should be a valid integer"),
        ("/api/cycles/3/drafts?limit=500", 400, "limit: Input should be less than or equal to 200"),
    ],
)
def test_an_unknown_cycle_or_a_bad_page_is_one_line(
    client: TestClient, path: str, status: int, needle: str
) -> None:
    answer = client.get(path, headers={"accept": "application/json"})
    detail = answer.json().get("detail", "")
    assert answer.status_code == status and needle in detail, (answer.status_code, detail)
    assert "\n" not in detail, detail


def test_the_endpoint_is_in_the_openapi_schema(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "/api/cycles/{cycle_id}/drafts" in paths, sorted(paths)


def _cycle_result(drafting: DraftingResult | None) -> SimpleNamespace:
    regressed = Change("org/alpha", "pass", "lowering_failed", "dtype.cast", 9_000)
    comparison = SimpleNamespace(
        regressions=[regressed], baseline_sweep=2, counts={"FAIL": 1},
        environment_changes=[],
    )  # fmt: skip
    return SimpleNamespace(cycle_id=3, baseline_cycle=2, comparison=comparison,
                           sweep=SimpleNamespace(sweep_id=3), drafting=drafting)  # fmt: skip


def test_the_webhook_carries_the_cycles_drafting_summary() -> None:
    drafted = DraftingResult(DraftBudget(8, 200_000), "http://127.0.0.1:1/v1", ADAPTERS)
    drafted.rows = _rows(3)
    drafted.note = "attempt budget spent (5 of 8)"
    body = regression_summary(_cycle_result(drafted), "runs.db")
    sent = body["drafting"]
    print(f"\n{body['text']}\n{sent}")
    counts = {k: sent[k] for k in ("new_fingerprints", "drafted", "accepted", "refused",
                                   "skipped_budget", "attempts", "tokens")}  # fmt: skip
    assert counts == {"new_fingerprints": 3, "drafted": 2, "accepted": 1, "refused": 1,
                      "skipped_budget": 1, "attempts": 5, "tokens": 7500}, counts  # fmt: skip
    assert sent["budget"] == {"attempts": 8, "tokens": 200_000}, sent
    # the accepted adapter by folder name: the path on this machine is not sent
    assert sent["accepted_adapters"] == [
        {"fingerprint": "aaaa11111111", "model_id": "org/n1", "adapter": "draft-aaaa11111111"}
    ], sent
    assert str(ADAPTERS) not in str(body), body
    assert body["text"].endswith("; drafting: 1 adapter(s) accepted for 3 new fingerprint(s)")
    plain = regression_summary(_cycle_result(None), "runs.db")
    assert plain["drafting"] is None and "drafting" not in plain["text"], plain
