"""What this machine has proven: graph adapter folders hfadapt accepted (or re-proved with
``hfadapt adapters verify``) here, recorded outside the folders.

A folder's content digest (sha256 over every file's name and bytes) is signed with HMAC-SHA256
under a per-machine secret key (``$HFADAPT_HOME/proof.key``, 32 random bytes, created 0600 on
first use); the signatures live in ``$HFADAPT_HOME/proven.json``. A folder copied from
elsewhere, written by hand or edited by one byte has no signature here that matches, and the
registry refuses it until it is proven again. Nothing stored beside the data vouches for it: a
checksum anyone can recompute is not a proof."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from hfadapt import settings
from hfadapt.errors import GraphError

KEY_FILE = "proof.key"
RECORD_FILE = "proven.json"
KEY_BYTES = 32
MAX_FILES = 16
MAX_FOLDER_BYTES = 600 * 1024 * 1024
MAX_RECORD_BYTES = 16 * 1024 * 1024


def content_digest(folder: Path) -> str:
    """sha256 over the folder's regular files (names and bytes, sorted by name). A subfolder,
    a symlink or anything but a regular file makes the folder unprovable."""
    from hfadapt.graphs.artifact import read_plain_file

    h = hashlib.sha256()
    entries = sorted(os.listdir(folder))
    if len(entries) > MAX_FILES:
        raise GraphError(f"{folder.name} holds {len(entries)} entries, more than {MAX_FILES}")
    total = 0
    for name in entries:
        info = os.lstat(folder / name)
        if not stat.S_ISREG(info.st_mode):
            raise GraphError(f"{folder.name}/{name} is not a regular file")
        data = read_plain_file(folder / name, MAX_FOLDER_BYTES - total)
        total += len(data)
        raw = name.encode("utf-8", errors="surrogateescape")
        h.update(len(raw).to_bytes(8, "big") + raw + len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def _home() -> Path:
    return settings.drafts_home()


def machine_key(create: bool = True) -> bytes | None:
    """The per-machine secret key, created (0600, never overwritten) when ``create``."""
    path = _home() / KEY_FILE
    try:
        return _read_key(path)
    except FileNotFoundError:
        if not create:
            return None
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # another process made it first
        return _read_key(path)
    with os.fdopen(fd, "wb") as fh:
        fh.write(secrets.token_bytes(KEY_BYTES))
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077:
            raise GraphError(f"{path} is not a private regular file (mode 0600 expected)")
        key = fh.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise GraphError(f"{path} does not hold a {KEY_BYTES}-byte key")
    return key


def signature(digest: str, key: bytes) -> str:
    return hmac.new(key, b"hfadapt-proven-graph\0" + digest.encode(), hashlib.sha256).hexdigest()


@contextlib.contextmanager
def _locked() -> Iterator[Path]:
    home = _home()
    home.mkdir(parents=True, exist_ok=True)
    with open(home / (RECORD_FILE + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield home / RECORD_FILE
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_record(path: Path) -> dict[str, object]:
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(MAX_RECORD_BYTES))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def record_proven(folder: Path, name: str, how: str, digest: str | None = None) -> str:
    """Record that ``folder``, as it is now, was proven on this machine; returns its digest.
    ``digest``: the content that was proven (GraphError when the folder no longer holds it)."""
    now = content_digest(folder)
    if digest is not None and now != digest:
        raise GraphError(f"{folder.name} changed while it was proven")
    digest = now
    key = machine_key(create=True)
    assert key is not None
    with _locked() as path:
        data = _read_record(path)
        data[signature(digest, key)] = {
            "name": name,
            "folder": str(folder.resolve()),
            "how": how,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        tmp = path.with_name(f".{RECORD_FILE}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    return digest


def proven_digest(folder: Path) -> str | None:
    """``folder``'s content digest when this machine proved it with exactly that content."""
    key = machine_key(create=False)
    if key is None:
        return None
    data = _read_record(_home() / RECORD_FILE)
    if not data:
        return None
    digest = content_digest(folder)
    return digest if signature(digest, key) in data else None


def forget_proven(folder: Path) -> int:
    """Drop every record of ``folder`` (by its path) from this machine's proven records, so
    that a folder put back at that path is not trusted without a new proof; returns how many."""
    where = str(folder.resolve())
    if not (_home() / RECORD_FILE).exists():
        return 0
    with _locked() as path:
        data = _read_record(path)
        kept = {
            k: v for k, v in data.items() if not (isinstance(v, dict) and v.get("folder") == where)
        }
        if len(kept) == len(data):
            return 0
        tmp = path.with_name(f".{RECORD_FILE}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(kept, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    return len(data) - len(kept)


def is_proven(folder: Path) -> bool:
    """Whether this machine proved ``folder`` with exactly its present content."""
    return proven_digest(folder) is not None


__all__ = [
    "content_digest",
    "forget_proven",
    "is_proven",
    "machine_key",
    "proven_digest",
    "record_proven",
    "signature",
]
