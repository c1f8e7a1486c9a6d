"""The docs against the program: the adapter table in docs/adapters.md is what ``hfadapt
adapters list --markdown`` prints for the bundled adapters (every one of them named); the README
states where hfadapt keeps its files, stays a five-minute read, and names a script for every
figure it quotes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ADAPTERS = ROOT / "docs" / "adapters.md"


def test_the_adapter_table_is_the_registry(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.adapters.registry import default_registry

    text = ADAPTERS.read_text()
    block = re.search(
        r"<!-- adapter table: hfadapt adapters list --markdown -->\n(.*?)\n<!-- end of adapter table -->",
        text,
        re.S,
    )
    assert block is not None, "docs/adapters.md has no generated adapter table"
    code, out, err = run_cli(["adapters", "list", "--markdown"], monkeypatch, capsys)
    assert code == 0, err
    assert block.group(1) == out.rstrip("\n"), (
        "docs/adapters.md's table is stale: paste the output of hfadapt adapters list --markdown"
    )
    bundled = [a.name for a in default_registry().adapters if a.source == "bundled"]
    named = set(re.findall(r"`([a-z0-9-]+)`", block.group(1)))
    assert set(bundled) <= named, sorted(set(bundled) - named)
    assert f"All {len(bundled)} bundled adapters" in text, len(bundled)


def test_the_readme_says_where_files_go() -> None:
    flat = " ".join(README.read_text().split())
    for needle in (
        "`$HFADAPT_HOME` (default `~/.local/share/hfadapt`)",
        "`~/.cache/hfadapt`",
        "`$HFADAPT_CACHE_DIR`",
    ):
        assert needle in flat, needle


def test_the_readme_is_a_five_minute_read() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines"
    longest = max(len(line) for line in lines)
    assert longest <= 400, f"a README line of {longest} characters"


def test_every_readme_figure_names_its_script() -> None:
    """A paragraph of the README that quotes a measured figure (a time, a ratio, a download
    share) names the script that reproduces it, or points to docs/performance.md."""
    text = README.read_text()
    figure = re.compile(r"\d+(\.\d+)?\s?(s\b|ms\b|x\b|%|M downloads)")
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if not p.lstrip().startswith(("```", "|"))]
    unsourced = [
        p.strip()[:120]
        for p in paragraphs
        if figure.search(p) and "benchmarks/" not in p and "docs/performance.md" not in p
    ]
    assert unsourced == [], unsourced
