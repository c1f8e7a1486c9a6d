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
_no_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install -y chromium; .ci/run installs it)",
)


def needs_chromium(test: Any) -> Any:
    """Skipped without Chromium, except under CI=true, where a browser test must run."""
    return pytest.mark.browser(_no_chromium(test))


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


# ---- hostile strings: ids and metadata from a Hub mirror, stored before crawls checked ids ----

HOSTILE_ID = 'm/x\' autofocus onfocus=\'document.body.setAttribute("data-pwned","1")'
HOSTILE_TYPE = "bert\"><img src=x onerror=document.body.setAttribute('data-pwned','2')>"
HOSTILE_REASON = "</script><script>document.body.setAttribute('data-pwned','3')</script><!--"


@pytest.fixture
def hostile_html(tmp_path: Path) -> Path:
    from support.sweeps import store_crawl

    from hfadapt.db.engine import get_engine
    from hfadapt.hub.catalog import HubRecord
    from hfadapt.sweep.store import finish_sweep, open_sweep, write_rows

    engine = get_engine(str(tmp_path / "hostile.db"))
    store_crawl(engine, [HubRecord(id=HOSTILE_ID, downloads=5, model_type=HOSTILE_TYPE),
                         HubRecord(id="m/plain", downloads=3, model_type="bert")])  # fmt: skip
    sweep, _ = open_sweep(engine, {}, resume=False, mode="structural", models=2, units=2)
    assert sweep.id is not None
    write_rows(engine, sweep.id, [
        {"model_id": HOSTILE_ID, "verdict": "lowering_failed", "reason": HOSTILE_REASON,
         "model_type": HOSTILE_TYPE, "evidence_level": "config"},
        {"model_id": "m/plain", "verdict": "pass", "reason": "", "model_type": "bert",
         "evidence_level": "config"},
    ])  # fmt: skip
    finish_sweep(engine, sweep.id, seconds=1.0)
    path = tmp_path / "hostile.html"
    path.write_text(render_html(build_report(engine)), encoding="utf-8")
    engine.dispose()
    return path


@needs_chromium
def test_hostile_ids_and_metadata_stay_text(hostile_html: Path, tmp_path: Path) -> None:
    """The per-model rows are built with DOM calls: a quote in an id cannot close the href and
    add an event handler, markup in a model_type or reason stays text, and a "</script>" in the
    row data cannot end the data block."""
    done = _chromium(tmp_path, "--dump-dom", hostile_html.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    body = re.search(r"<body([^>]*)>", dom)
    assert body is not None, dom[:500]
    assert "data-pwned" not in body.group(1), body.group(1)
    assert 'data-models-shown="2"' in body.group(1), body.group(1)  # the script ran to the end
    # Chromium serializes every attribute as name="value" (a quote inside is &quot;)
    handlers = re.findall(r'<[a-z]+(?:\s+[a-z-]+(?:="[^"]*")?)*\s+on[a-z]+=', dom)
    assert handlers == [], handlers
    elements = re.sub(r"<script[^>]*>.*?</script>", "", dom, flags=re.S)  # script text is text
    assert not re.search(r"<img\b", elements), "markup from a model_type became an element"
    assert dom.count("<script") == 2, "a </script> in the row data ended the data block"
    # the id is the link's text, and its href is the percent-encoded Hub page
    link = re.search(r'<a href="(https://huggingface\.co/m/x[^"]*)">([^<]*)</a>', dom)
    assert link is not None, re.findall(r"<a [^>]*>", dom)
    assert "'" not in link.group(1) and " " not in link.group(1), link.group(1)
    assert link.group(2).startswith("m/x' autofocus onfocus="), link.group(2)


def test_verdict_and_type_bars_keep_architecture_passes_apart(html_file: Path) -> None:
    """Sweep 2 passes m/one and m/two on their config (1,500 of 2,000 downloads) and m/five on
    its type's defaults (60): the verdict bar beside the 28.6% headline shows them as two rows,
    and qwen3 (m/four fails, m/five architecture) reads 0% own and 50% architecture, with its
    architecture part drawn beside the own part, not as a pass."""
    text = html_file.read_text()
    chart = re.search(r'<svg[^>]*data-chart="verdicts".*?</svg>', text, re.S)
    assert chart is not None
    labels = re.findall(r"<title>([^<]*)</title>[^<]*</text>", chart.group(0))
    notes = re.findall(
        r'<text x="[\d.]+" y="[\d.]+" font-family[^>]*>([^<]*)</text>', chart.group(0)
    )
    rows = dict(zip(labels, notes, strict=True))
    assert rows["pass: own weights or config"] == "2 models, 75.0% of downloads", rows
    assert rows["pass: architecture only"] == "1 model, 3.0% of downloads", rows
    assert "pass" not in rows, rows
    types = re.search(r'<svg[^>]*data-chart="model-types".*?</svg>', text, re.S)
    assert types is not None
    assert "0.0% own, 50.0% arch., of 2 models" in types.group(0), types.group(0)
    assert types.group(0).count('data-part="beside"') == 1, "one type has architecture passes"


@needs_chromium
def test_chromium_draws_the_share_of_the_bound_used_and_a_dash_without_one(
    report_engine: Any, tmp_path: Path
) -> None:
    """The per-model table's "bound used" column: m/one's recorded margin (norm error 4.27% of
    5%: 85.3%) as a percent, a dash for the runs recorded without one."""
    from hfadapt.judge.margin import margin_of
    from hfadapt.judge.metrics import Metrics
    from hfadapt.sweep.store import finish_sweep, open_sweep, write_rows

    metrics = Metrics(
        min_token_cosine=0.99994, mean_token_cosine=0.99999, pooled_cosine=0.99999,
        max_abs_diff=0.01, has_nan=False, has_inf=False, tokens=40, nonfinite_tokens=0,
        worst_token=(0, 1), max_norm_error=0.04266,
    )  # fmt: skip
    sweep, _ = open_sweep(report_engine, {"n": 3}, resume=False, mode="full", models=2, units=2)
    assert sweep.id is not None
    write_rows(report_engine, sweep.id, [
        {"model_id": "m/one", "verdict": "pass", "reason": "", "model_type": "bert",
         "evidence_level": "weights", "evidence": {"margin": margin_of(metrics).to_dict()}},
        {"model_id": "m/two", "verdict": "pass", "reason": "", "model_type": "bert",
         "evidence_level": "weights"},
    ])  # fmt: skip
    finish_sweep(report_engine, sweep.id, seconds=1.0)
    path = tmp_path / "margin.html"
    path.write_text(render_html(build_report(report_engine)), encoding="utf-8")
    done = _chromium(tmp_path, "--dump-dom", path.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    cells = {
        model: re.findall(r'<td class="n">([^<]*)</td>', row)
        for model, row in re.findall(r">(m/[a-z]+)</a></td>(.*?)</tr>", done.stdout, re.S)
    }
    # each row's numeric cells after the id: downloads, bound used
    assert cells.get("m/one") == ["1,000", "85.3%"], cells
    assert cells.get("m/two") == ["500", "\u2014"], cells
