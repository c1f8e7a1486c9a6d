"""The issue's "done when": two real cycles on one database (the second with an adapter left
out) exit 0 then 4 naming the regressions; ``hfadapt serve`` as a real process on a free
loopback port answers a regressed model's verdict with both cycles' history; headless Chromium
loads the dashboard and the model's page (screenshots in the test's folder) with no console
message; the server stops on SIGINT."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _chromium(tmp_path: Path, url: str, png: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr",
             "--v=0", "--window-size=1200,1600", f"--screenshot={png}"]  # fmt: skip
    return subprocess.run([CHROMIUM, *flags, url], capture_output=True, text=True, timeout=120)


# the first of the two tests sharing them also runs the two cycles (~9 min on a busy machine)
@pytest.mark.timeout(1800)
@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"
)
def test_two_cycles_then_the_server_answers_and_the_dashboard_renders(
    tmp_path: Path, two_real_cycles: Any
) -> None:
    """The two cycles of ``two_real_cycles`` (tests/service/conftest.py), then the server."""
    db, first, second = two_real_cycles.db, two_real_cycles.first, two_real_cycles.second
    assert first.code == 0, f"first cycle exit {first.code}: {first.err}"
    code, out = second.code, second.out
    regressed = [line.split("\t")[0] for line in out.splitlines()]
    print(
        f"\ntwo cycles: {first.seconds + second.seconds:.0f} s; {len(regressed)} regressions named"
    )
    assert code == 4 and len(regressed) >= 10, f"exit {code} (4: regressions), named {regressed}"
    model = regressed[0]

    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "hfadapt", "serve", "--port", str(port), "--db", str(db)],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    root = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, health = _get(f"{root}/api/healthz")
                break
            except OSError:
                assert server.poll() is None, f"serve exited {server.returncode}"
                assert time.monotonic() < deadline, "serve did not answer within 60 s"
                time.sleep(0.3)
        assert status == 200 and health["cycles"] == 2, health
        status, card = _get(f"{root}/api/models/{model}")
        history = [(h["cycle"], h["verdict"]) for h in card["history"]]
        assert status == 200 and card["verdict"] != "pass" and card["regressed"], card
        assert history == [(1, "pass"), (2, card["verdict"])], history
        assert card["next_step"] and card["violations"], card
        status, missing = _get(f"{root}/api/models/no-such/model")
        assert status == 404 and "no run of no-such/model" in missing["detail"], missing

        for name, url in (("dashboard", f"{root}/"), ("model", f"{root}/models/{model}")):
            png = tmp_path / f"{name}.png"
            done = _chromium(tmp_path, url, png)
            console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
            assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
            assert console == [], f"{name}: console messages {console}"
            data = png.read_bytes()
            width, height = struct.unpack(">II", data[16:24])
            print(f"{name}: {png} ({width}x{height}, {len(data):,} bytes)")
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and (width, height) == (1200, 1600)
            assert len(data) > 30_000, f"{name}: {len(data)} bytes: a blank page?"
    finally:
        server.send_signal(signal.SIGINT)
        try:
            _, log = server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            _, log = server.communicate()
    assert server.returncode in (0, 130), (server.returncode, log)
    assert f"serving http://127.0.0.1:{port}/" in log, log


def test_serve_refuses_a_missing_database_and_a_busy_port_in_one_line(
    tmp_path: Path,
    history_db: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(["serve", "--db", str(tmp_path / "none.db")], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "no database at" in lines[0], (code, err)
    assert "hfadapt cycle" in lines[0] and not (tmp_path / "none.db").exists()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code, _, err = run_cli(
            ["serve", "--db", str(history_db), "--port", str(port)], monkeypatch, capsys
        )
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, (code, err)
    assert lines[0].startswith(f"error: cannot listen on 127.0.0.1:{port}"), lines[0]
