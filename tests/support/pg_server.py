"""A real PostgreSQL server for tests, from Debian's package (``apt-get install postgresql``,
which .ci/run does): ``initdb`` into a fresh temporary folder, ``postgres`` on 127.0.0.1 at
a free port (password authentication, SCRAM), stopped and its folder removed afterwards.

PostgreSQL refuses to run as root: under root (CI) the server runs as the ``postgres`` user the
package creates (else ``nobody``), started with that user's ids. Where no server can be started
the fixtures skip, except under CI=true, where that is a failure.

Fixtures: ``postgres_server`` (one server per test process) and ``pg_url`` (a new, empty
database on it for each test, dropped afterwards)."""

from __future__ import annotations

import ctypes
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SUPERUSER = "hfadapt"


def _bindir() -> Path | None:
    """The folder of initdb and postgres: on PATH, else Debian's newest version."""
    found = shutil.which("postgres")
    if found and shutil.which("initdb"):
        return Path(os.path.realpath(found)).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    return Path(versions[-1]) if versions else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_LIBC = ctypes.CDLL(
    None, use_errno=True
)  # loaded here: the server's user may not read Python's files


def _die_with_parent() -> None:
    """In the server's process, before exec: SIGQUIT (immediate shutdown) when the test
    process dies. Runs after the switch of user, which would clear it."""
    _LIBC.prctl(1, signal.SIGQUIT)  # PR_SET_PDEATHSIG


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL tests cannot run in CI: {why}")
    pytest.skip(why)


class PostgresServer:
    """One server in its own temporary folder; ``url(database)`` names a database on it."""

    def __init__(self) -> None:
        bindir = _bindir()
        if bindir is None:
            _unavailable("no PostgreSQL server binaries (apt-get install postgresql)")
        assert bindir is not None
        self.bindir = bindir
        self.password = secrets.token_hex(12)
        self.port = _free_port()
        self.uid: int | None = None
        self.gid: int | None = None
        if os.geteuid() == 0:  # initdb and postgres refuse root: a user of the system runs them
            for name in ("postgres", "nobody"):
                try:
                    entry = pwd.getpwnam(name)
                except KeyError:
                    continue
                self.uid, self.gid = entry.pw_uid, entry.pw_gid
                break
            else:
                _unavailable("running as root, and no postgres or nobody user to run the server")
        self.root = Path(tempfile.mkdtemp(prefix="hfpg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        kwargs: dict[str, Any] = {}
        if self.uid is not None:
            kwargs.update(user=self.uid, group=self.gid, extra_groups=[])
        return subprocess.run(
            [str(self.bindir / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.root,
            **kwargs,
        )

    def start(self) -> PostgresServer:
        if self.uid is not None:
            os.chown(self.root, self.uid, self.gid or 0)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self.uid is not None:
            os.chown(pwfile, self.uid, self.gid or 0)
        init = self._run(
            "initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=scram-sha-256",
            f"--pwfile={pwfile}", "--encoding=UTF8", "--no-locale", "--no-sync",
        )  # fmt: skip
        pwfile.unlink()
        if init.returncode != 0:
            _unavailable(f"initdb failed: {(init.stderr or init.stdout).strip()[-300:]}")
        # The postmaster runs in the foreground as this process's child, with a parent-death
        # signal: it shuts down even when the test process is killed (pg_ctl would detach it).
        command = [
            str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port),
            "-k", str(self.root), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
            "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
            "-c", "max_connections=60",
        ]  # fmt: skip
        kwargs: dict[str, Any] = {}
        if self.uid is not None:
            kwargs.update(user=self.uid, group=self.gid, extra_groups=[])
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                preexec_fn=_die_with_parent, **kwargs,
            )  # fmt: skip
        if not self._wait_ready():
            log_text = self.log.read_text(errors="replace")[-500:]
            self.stop()
            _unavailable(f"the PostgreSQL server did not start: {log_text}")
        return self

    def _wait_ready(self, timeout: float = 60.0) -> bool:
        import psycopg

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # "fast" shutdown: sessions end, no wait
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres", *, user: str = SUPERUSER, password: str | None = None) -> str:  # fmt: skip
        secret = self.password if password is None else password
        return f"postgresql://{user}:{secret}@127.0.0.1:{self.port}/{database}"

    def execute(self, *statements: str, database: str = "postgres") -> None:
        """Run statements as the superuser, each in autocommit (CREATE DATABASE needs it)."""
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            for statement in statements:
                conn.execute(statement)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("no PostgreSQL driver: pip install '.[postgres]'")
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def pg_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a new, empty database for this test (dropped afterwards)."""
    name = f"t_{secrets.token_hex(6)}"
    postgres_server.execute(f"CREATE DATABASE {name}")
    try:
        yield postgres_server.url(name)
    finally:
        postgres_server.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
