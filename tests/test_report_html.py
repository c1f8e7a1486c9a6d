"""The HTML report: one self-contained file, opened in headless Chromium (Debian's ``chromium``),
its rendered DOM and a screenshot checked."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hfadapt.report.coverage import build_report
from hfadapt.report.html import render_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install -y chromium; .ci/run installs it)",
)


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def html_file(report_engine: Any, tmp_path: Path) -> Path:
    path = tmp_path / "report.html"
    path.write_text(render_html(build_report(report_engine, against=1)), encoding="utf-8")
    return path


def test_the_file_is_self_contained(html_file: Path) -> None:
    text = html_file.read_text()
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|@import|url\(", text), (
        "the report fetches something"
    )
    # links to Hub pages are followed by the reader, never fetched by the page
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg|huggingface\.co/)", text), (
        "a URL other than the SVG namespace and Hub model pages"
    )
    assert text.count("<svg") == 4, text.count(
        "<svg"
    )  # verdicts, cumulative, model types, fingerprints


@needs_chromium
def test_chromium_renders_every_chart_and_number(html_file: Path, tmp_path: Path) -> None:
    done = _chromium(tmp_path, "--dump-dom", html_file.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None, dom[:500]
    # The inline script ran after layout and measured 4 charts, each with a real size.
    assert 'data-charts="4"' in body.group(1) and 'data-charts-drawn="4"' in body.group(1), (
        body.group(1)
    )
    text = re.sub(r"<[^>]+>", " ", dom)
    for needle in (
        "28.6%",  # 2 of 7 pass on their own weights or config
        "75.0%",
        "1.5k",
        "architecture passes (1, 60 downloads) are beside it",
        "showing 7 of 7 matching models",
        "hfadapt coverage: sweep 2",
        "Agreement on 6 models: 66.7%",
    ):
        assert needle in text, needle
    assert 'data-label="IMPROVED">IMPROVED 2<' in dom and 'data-label="FAIL">FAIL 1<' in dom
    assert text.index("F2 rule.F2") < text.index("F1 rule.F1") < text.index("F3 rule.F3")
    points = re.search(r'data-series="passing"', dom)
    assert points is not None


@needs_chromium
def test_chromium_screenshot_is_a_full_page(html_file: Path, tmp_path: Path) -> None:
    png = tmp_path / "report.png"
    done = _chromium(tmp_path, "--window-size=1200,2400", f"--screenshot={png}", html_file.as_uri())
    assert done.returncode == 0 and png.exists(), done.stderr[-2000:]
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1200, 2400), (width, height)
    assert len(data) > 40_000, f"{len(data)} bytes: a blank page?"


@needs_chromium
@pytest.mark.parametrize("width", [1280, 1920])
def test_chromium_nothing_overflows_or_is_clipped(
    html_file: Path, tmp_path: Path, width: int
) -> None:
    """At 1280 and 1920 px: no table wider than the page column, no chart label cut at the
    chart's edge, and the per-model table drew every model with a Hub link."""
    done = _chromium(tmp_path, f"--window-size={width},2000", "--dump-dom", html_file.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", done.stdout)
    assert body is not None, done.stdout[:500]
    attrs = dict(re.findall(r'(data-[a-z-]+)="([^"]*)"', body.group(1)))
    seen = {
        k: attrs.get(k)
        for k in ("data-tables-overflowing", "data-labels-clipped", "data-models-shown")
    }
    assert seen == {
        "data-tables-overflowing": "0",
        "data-labels-clipped": "0",
        "data-models-shown": "7",
    }, seen
    assert 'href="https://huggingface.co/m/five"' in done.stdout, "no Hub link for m/five"
