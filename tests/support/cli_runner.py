"""Running the real ``hfadapt`` entry point (``hfadapt.cli.main``, what the console script
calls) inside a test: argv set, a wide terminal unless a test asks for a narrow one,
SystemExit turned into an exit code; the garbage collector left as it was."""

from __future__ import annotations

import gc
import sys

import pytest

from hfadapt.cli import main


def run_cli(
    args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    columns: int = 220,
) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``hfadapt *args`` in a terminal ``columns`` wide."""
    from hfadapt.cli._app import console, err_console

    monkeypatch.setattr(sys, "argv", ["hfadapt", *args])
    monkeypatch.setenv("COLUMNS", str(columns))  # rich wraps tables at the terminal width
    # The consoles read COLUMNS once, when hfadapt.cli is first imported (in some test, in a
    # terminal of some width): each run sets the width it asks for.
    for c in (console, err_console):
        monkeypatch.setattr(c, "_width", columns)  # rich's own field: undo restores "unset"
    code = 0
    threshold = gc.get_threshold()
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:  # the command tunes its own process's collector (hfadapt.own_process): not ours
        gc.set_threshold(*threshold)
        gc.unfreeze()
    out, err = capsys.readouterr()
    return code, out, err
