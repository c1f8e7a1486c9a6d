"""The results database: SQLite and PostgreSQL engines, migrations. The shared fixtures this part's
tests use, from tests/support."""

from __future__ import annotations

from support.pg_server import pg_url, postgres_server
from support.sweeps import fake_worker

__all__ = ["fake_worker", "pg_url", "postgres_server"]
