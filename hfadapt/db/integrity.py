"""Whether a database file can be trusted before hfadapt reads or writes it: an SQLite file
must start with SQLite's header and pass SQLite's own ``PRAGMA quick_check`` (pages, b-trees
and record formats; not the slower index cross-check of ``integrity_check``). A damaged file is
refused in one line and left exactly as it was. Other databases (PostgreSQL) guard their own
pages: nothing to check here.

Also the JSON reader every engine uses for JSON columns: a value nested deeper than any row
hfadapt writes, or larger than any, reads as None instead of raising RecursionError or filling
memory in every command that touches the row (rows can hold text from the Hub, an endpoint or
a sandbox)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from hfadapt.db.urls import ENV_VAR, describe
from hfadapt.errors import DatabaseUnavailableError, option

__all__ = [
    "MAX_JSON_CHARS",
    "MAX_JSON_DEPTH",
    "SQLITE_HEADER",
    "check_header",
    "load_json",
    "quick_check",
]

SQLITE_HEADER = b"SQLite format 3\x00"
# hfadapt's own JSON values nest a few levels (evidence -> sweep -> ...); 64 is far past them.
MAX_JSON_DEPTH = 64
MAX_JSON_CHARS = 64 * 1024 * 1024
_ISSUES_SHOWN = 2  # quick_check lists up to 100 problems; the first two say enough


def _elsewhere() -> str:
    return f"move it aside or pass {option('db')} / set {ENV_VAR} to another file"


def check_header(path: Path) -> None:
    """Refuse a file that is not an SQLite database (an empty file is one: SQLite's own)."""
    with path.open("rb") as fh:
        head = fh.read(len(SQLITE_HEADER))
    if head and head != SQLITE_HEADER:
        raise DatabaseUnavailableError(
            f"{path} is not an SQLite database (corrupt or another kind of file); it was left "
            f"untouched: {_elsewhere()}"
        )


def quick_check(engine: Engine, where: str | None = None) -> None:
    """SQLite's ``PRAGMA quick_check`` on ``engine``'s database (named ``where`` in messages);
    DatabaseUnavailableError naming the first problems when it finds any. A no-op for other
    databases."""
    if not engine.url.drivername.startswith("sqlite"):
        return
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        try:
            rows = [str(row[0]) for row in cursor.execute("PRAGMA quick_check").fetchall()]
        finally:
            cursor.close()
    except Exception as exc:  # sqlite3.DatabaseError: SQLite could not even walk the file
        problems = [" ".join(str(exc).split())]
    else:
        problems = [] if rows == ["ok"] else rows
    finally:
        raw.close()
    if problems:
        shown = "; ".join(" ".join(p.split()) for p in problems[:_ISSUES_SHOWN])
        more = f" (+{len(problems) - _ISSUES_SHOWN} more)" if len(problems) > _ISSUES_SHOWN else ""
        engine.dispose()
        raise DatabaseUnavailableError(
            f"database {where or describe(engine)} is damaged (SQLite quick_check: {shown}{more}); it was "
            f"left untouched: restore it from a copy, {_elsewhere()}"
        )


def _depth(value: object) -> int:
    """How deeply ``value`` nests (iteratively: a deep value must not recurse here either)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def load_json(text: str | bytes) -> Any:
    """A JSON column's value, or None when it is nested deeper than MAX_JSON_DEPTH, longer
    than MAX_JSON_CHARS or not JSON at all (the row stays readable; the value is lost)."""
    if len(text) > MAX_JSON_CHARS:
        return None
    try:
        value = json.loads(text)
    except (RecursionError, ValueError):
        return None
    return None if _depth(value) > MAX_JSON_DEPTH else value
