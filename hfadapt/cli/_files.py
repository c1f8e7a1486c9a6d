"""Output files a command writes (``report --html/--output/--csv``, ``agent-eval --output``):
each path is checked before any work starts, so a mistyped folder fails in a second instead
of after the whole report or evaluation, and a write that still fails (a full disk,
``/dev/full``) is one line, never a traceback. Nothing is created by the check."""

from __future__ import annotations

import os
from pathlib import Path

from hfadapt.errors import OutputError

__all__ = ["check_output", "write_output"]


def check_output(path: Path | None, flag: str) -> None:
    """OutputError naming ``flag`` when ``path`` cannot be written: its folder is missing or
    read-only, or it is a directory or a read-only file."""
    if path is None:
        return
    shown = f"{flag} {path}"
    if str(path) in ("", "-"):
        raise OutputError(f"{flag} needs a file path (got {str(path)!r})")
    if path.is_dir():
        raise OutputError(f"{shown} is a directory: pass a file path inside it")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.exists():
        raise OutputError(f"{shown}: the folder {folder} does not exist (create it first)")
    if not folder.is_dir():
        raise OutputError(f"{shown}: {folder} is not a folder")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise OutputError(f"{shown} is read-only: pass another path")
    elif not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{shown}: the folder {folder} is read-only: pass another path")


def write_output(path: Path, text: str, flag: str) -> None:
    """Write ``text`` to ``path``; OutputError in one line when the system refuses it (and a
    file this call created is removed again, not left half-written)."""
    existed = path.exists()
    try:
        with path.open("w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        if not existed and path.is_file():
            path.unlink(missing_ok=True)
        why = exc.strerror or type(exc).__name__
        raise OutputError(f"cannot write {flag} {path}: {why}") from exc
