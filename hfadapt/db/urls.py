"""Which database hfadapt uses and how it is named in messages: the URL (an explicit one,
``$HFADAPT_DB``, or ``runs.db`` in the working directory), the SQLite file behind it, and a
short password-free description."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import URL, Engine, make_url

from hfadapt import settings

DEFAULT_URL = "sqlite:///runs.db"
ENV_VAR = settings.HFADAPT_DB.name

__all__ = ["DEFAULT_URL", "ENV_VAR", "describe", "resolve_url", "sqlite_path"]


def resolve_url(url: str | None = None) -> str:
    """The database URL to use: ``url``, else ``$HFADAPT_DB``, else ``sqlite:///runs.db``.

    A value without ``://`` is a path to an SQLite file; ``:memory:`` is an in-memory database.
    """
    raw = (url or settings.database() or DEFAULT_URL).strip()
    if "://" in raw:
        return raw
    if raw == ":memory:":
        return "sqlite://"
    return f"sqlite:///{Path(raw).expanduser()}"


def sqlite_path(url: str | URL) -> Path | None:
    """The file behind an SQLite URL, or None (another database, or in memory)."""
    parsed = make_url(url) if isinstance(url, str) else url
    if not parsed.drivername.startswith("sqlite"):
        return None
    database = parsed.database
    if not database or database == ":memory:" or parsed.query.get("mode") == "memory":
        return None
    if database.startswith("file:"):  # URI filenames: sqlite:///file:path?uri=true
        database = database[len("file:") :]
    return Path(database)


def describe(engine_or_url: Engine | str) -> str:
    """A short, password-free name of a database for messages: the file path, or the URL."""
    url = engine_or_url.url if isinstance(engine_or_url, Engine) else make_url(engine_or_url)
    path = sqlite_path(url)
    if path is not None:
        return str(path)
    if url.drivername.startswith("sqlite"):
        return "in-memory SQLite"
    return url.render_as_string(hide_password=True)
