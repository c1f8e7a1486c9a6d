"""Which database hfadapt uses and how it is named in messages: the URL (an explicit one,
``$HFADAPT_DB``, or ``runs.db`` in the working directory), the SQLite file behind it, a
short password-free description, and a password-free ``--db`` value for a hint to type."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import URL, Engine, make_url

from hfadapt import settings
from hfadapt.untrusted import HIDDEN, hide_url_credentials

DEFAULT_URL = "sqlite:///runs.db"
ENV_VAR = settings.HFADAPT_DB.name

__all__ = [
    "DEFAULT_URL",
    "ENV_VAR",
    "PASSWORD_SOURCES",
    "describe",
    "hint_value",
    "resolve_url",
    "sqlite_path",
]

# Where libpq finds the password of a URL that names none: what a hint that leaves it out says.
PASSWORD_SOURCES = "the password from $PGPASSWORD or ~/.pgpass"


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
    # hide_password leaves the query alone: ?password=... is hidden here
    return hide_url_credentials(url.render_as_string(hide_password=True))


def hint_value(value: str) -> tuple[str, bool]:
    """A ``--db`` value as a hint to type may show it: (the value without its password, whether
    a password was left out). A URL with a password becomes the same URL without it, which
    libpq completes from ``$PGPASSWORD`` or ``~/.pgpass`` (:data:`PASSWORD_SOURCES`); a path or
    a URL without one is returned as it is. Secret-named query parameters are left out too."""
    try:
        url = make_url(value) if "://" in value else None
    except Exception:  # not a URL make_url reads: hide what looks like a password
        shown = hide_url_credentials(value)
        return shown, shown != value
    if url is None:
        return value, False
    secret_keys = [k for k in url.query if hide_url_credentials(f"?{k}=x").endswith(HIDDEN)]
    if url.password is None and not secret_keys:
        return value, False
    bare = URL.create(
        url.drivername, url.username, None, url.host, url.port, url.database, url.query
    ).difference_update_query(secret_keys)
    return bare.render_as_string(hide_password=False), True
