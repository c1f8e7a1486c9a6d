"""The README against the program: its adapter table is what ``hfadapt adapters list
--markdown`` prints for the bundled adapters (every one of them named), and it states where
hfadapt keeps its files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.cli_runner import run_cli

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_adapter_table_is_the_registry(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.adapters.registry import default_registry

    text = README.read_text()
    block = re.search(
        r"<!-- adapter table: hfadapt adapters list --markdown -->\n(.*?)\n<!-- end of adapter table -->",
        text,
        re.S,
    )
    assert block is not None, "the README has no generated adapter table"
    code, out, err = run_cli(["adapters", "list", "--markdown"], monkeypatch, capsys)
    assert code == 0, err
    assert block.group(1) == out.rstrip("\n"), (
        "README's table is stale: paste the output of hfadapt adapters list --markdown"
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
