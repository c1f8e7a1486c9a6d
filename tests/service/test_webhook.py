"""``hfadapt cycle --webhook URL``: a cycle that regressed POSTs its summary to a loopback
server this test runs; a webhook that fails is one line of warning and the cycle stands (exit
4, recorded done); the URL's path and query (where webhooks keep their secret) never printed."""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.service import cycle as cycle_module
from hfadapt.service.webhook import post_summary

SECRET = "T0KEN-s3cr3t"


class _Hook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]
    status: list[int]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.received.append({"path": self.path, "type": self.headers["content-type"],
                              "body": json.loads(body)})  # fmt: skip
        self.send_response(self.status[0])
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, list[dict[str, Any]], list[int]]]:
    """(its URL, with a secret in path and query; the POSTs it received; the status it answers)."""
    received: list[dict[str, Any]] = []
    status = [200]
    handler = type("Hook", (_Hook,), {"received": received, "status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/services/{SECRET}?token={SECRET}"
    yield url, received, status
    server.shutdown()
    server.server_close()


def _passed(db: Path, sweep_id: int) -> list[str]:
    with sqlite3.connect(db) as conn:
        sql = "SELECT model_id FROM run WHERE sweep_id = ? AND verdict = 'pass' ORDER BY id"
        return [r[0] for r in conn.execute(sql, (sweep_id,))]


def test_a_regressed_cycle_posts_its_summary_and_a_failing_hook_is_a_warning(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fake_worker: str,
    hook: tuple[str, list[dict[str, Any]], list[int]],
) -> None:
    url, received, status = hook
    # the cycle's sweep runs the stand-in worker (a crash on the models $HFADAPT_FAKE_CRASH names)
    real = cycle_module.run_sweep
    monkeypatch.setattr(cycle_module, "run_sweep", functools.partial(real, worker=fake_worker))
    db = tmp_path / "runs.db"
    base = ["cycle", "--offline", "--top", "8", "--limit", "50", "--workers", "1", "--db", str(db)]
    code, _, err = run_cli([*base, "--webhook", url], monkeypatch, capsys)
    assert code == 0 and received == [], (code, err, received)  # nothing regressed: no POST
    first, second = _passed(db, 1)[:2]

    status[0] = 500  # the hook fails: one warning line, the cycle stands
    monkeypatch.setenv("HFADAPT_FAKE_CRASH", first)
    code, out, err = run_cli([*base, "--webhook", url], monkeypatch, capsys)
    warnings = [line for line in err.splitlines() if line.startswith("warning: the webhook")]
    assert code == 4 and out.split("\t")[0] == first, (code, out, err)
    assert len(warnings) == 1 and "HTTP 500" in warnings[0], err
    assert SECRET not in out + err and "/services" not in err, err
    assert len(received) == 1 and received[0]["body"]["models"][0]["model_id"] == first

    status[0] = 200
    monkeypatch.setenv("HFADAPT_FAKE_CRASH", second)
    code, out, err = run_cli([*base, "--webhook", url], monkeypatch, capsys)
    assert code == 4 and "warning" not in err and SECRET not in out + err, (code, err)
    sent = received[-1]
    assert sent["type"] == "application/json" and sent["path"].endswith(f"?token={SECRET}")
    body = sent["body"]
    assert (body["cycle"], body["baseline_cycle"], body["regressions"]) == (3, 2, 1), body
    assert body["models"][0]["model_id"] == second and body["models"][0]["before"] == "pass"
    assert body["text"].startswith("hfadapt cycle 3: 1 model(s) that passed in cycle 2"), body
    with sqlite3.connect(db) as conn:
        states = [r[0] for r in conn.execute("SELECT status FROM cycle ORDER BY id")]
    assert states == ["done"] * 3, states


def test_an_unreachable_hook_is_one_line_without_the_secret(tmp_path: Path) -> None:
    url = f"http://user:{SECRET}@127.0.0.1:9/hook/{SECRET}"  # port 9 (discard): refused
    warning = post_summary(url, {"text": "x"}, timeout=5)
    assert warning is not None and "\n" not in warning and SECRET not in warning, warning
    assert warning.startswith("warning: the webhook at http://127.0.0.1:9/... was not notified")


@pytest.mark.parametrize("url", ["ftp://example.com/x", "hooks.example.com/x", "http://:80/x"])
def test_a_bad_webhook_url_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str
) -> None:
    db = tmp_path / "runs.db"
    code, _, err = run_cli(
        ["cycle", "--offline", "--top", "3", "--webhook", url, "--db", str(db)], monkeypatch, capsys
    )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--webhook takes an http" in lines[0], (code, err)
    assert not db.exists() or sqlite3.connect(db).execute(
        "SELECT count(*) FROM crawl"
    ).fetchone() == (0,)
