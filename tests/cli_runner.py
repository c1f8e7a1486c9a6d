"""Running the real ``hfadapt`` entry point inside a test: argv set, a wide terminal so rich
tables are not truncated, SystemExit turned into an exit code."""

from __future__ import annotations

import sys

import pytest

from hfadapt.cli import main


def run_cli(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``hfadapt *args``."""
    monkeypatch.setattr(sys, "argv", ["hfadapt", *args])
    monkeypatch.setenv("COLUMNS", "220")  # rich wraps tables at the terminal width
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
