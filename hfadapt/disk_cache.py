"""A folder of cache entries with a size bound, shared by processes: what hfadapt's persistent
caches (the compile cache, hfadapt.spyre.compile.cache; the CPU reference cache,
hfadapt.judge.reference_cache) keep their files in.

- an entry is one file ``<key><suffix>``, written to a temporary file in the folder and renamed,
  so concurrent sweep workers see a whole entry or none;
- reading an entry touches it; when a write takes the folder past its bound, the least
  recently used entries go first;
- a read-only or full disk is not an error: the caller computes what it wanted to read;
- a writer killed between its temporary file and the rename leaves ``.tmp-<pid>-*`` behind:
  ``info`` counts such leftovers, eviction removes those untouched for ``STALE_SECONDS`` (an
  hour: a write takes seconds, and the folder may be shared by processes of other hosts or pid
  namespaces, where a pid says nothing about whether its writer still runs), ``clear`` removes
  them all.

This module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from pathlib import Path

__all__ = ["STALE_SECONDS", "TMP_PREFIX", "BoundedFolder"]

log = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"  # a write in progress, or one whose writer was killed
STALE_SECONDS = 3600.0  # a temporary file untouched this long has no writer left


class BoundedFolder:
    """Entries ``<key><suffix>`` in ``root``, at most ``max_bytes`` in all (see module doc)."""

    def __init__(self, root: Path, max_bytes: int, suffix: str) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.suffix = suffix

    def path(self, key: str) -> Path:
        return self.root / f"{key}{self.suffix}"

    def read(self, key: str) -> bytes | None:
        """The entry's bytes, None when there is none (or it cannot be read)."""
        try:
            return self.path(key).read_bytes()
        except OSError:
            return None

    def touch(self, key: str) -> None:
        """Mark the entry used now (least recently used entries are evicted first)."""
        with contextlib.suppress(OSError):
            os.utime(self.path(key))

    def write(self, key: str, data: bytes) -> tuple[bool, int]:
        """Write the entry atomically, then evict down to the bound: (written, entries
        evicted). Not written on a read-only or full disk."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(
                dir=self.root, prefix=f"{TMP_PREFIX}{os.getpid()}-", suffix=self.suffix
            )
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, self.path(key))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            log.info("cache %s: cannot write (%s)", self.root, exc)
            return False, 0
        return True, self.evict()

    def entries(self) -> list[Path]:
        try:
            return [
                p
                for p in self.root.iterdir()
                if p.name.endswith(self.suffix) and not p.name.startswith(".")
            ]
        except OSError:
            return []

    def leftovers(self) -> list[Path]:
        """The temporary files in the folder: writes in progress, or left by a killed writer."""
        try:
            return [p for p in self.root.iterdir() if p.name.startswith(TMP_PREFIX)]
        except OSError:
            return []

    def remove_stale(self, older_than: float = STALE_SECONDS) -> int:
        """Remove the temporary files untouched for ``older_than`` seconds; the number removed."""
        removed = 0
        now = time.time()
        for p in self.leftovers():
            try:
                if now - p.stat().st_mtime >= older_than:
                    p.unlink()
                    removed += 1
            except OSError:
                pass  # renamed by its writer, or removed by another process
        return removed

    def evict(self) -> int:
        """Remove stale temporary files (``remove_stale``), then the least recently used entries
        until the folder fits ``max_bytes``; the number of files removed."""
        removed = self.remove_stale()
        sized = []
        for p in self.entries():
            try:
                st = p.stat()
            except OSError:
                continue
            sized.append((st.st_mtime, st.st_size, p))
        total = sum(s for _, s, _ in sized)
        for _, size, p in sorted(sized, key=lambda e: e[0]):
            if total <= self.max_bytes:
                break
            try:
                p.unlink()
                removed += 1
            except OSError:
                pass  # another worker removed it
            total -= size
        return removed

    def clear(self) -> tuple[int, int]:
        """Remove every entry and every temporary file (a concurrent writer's rename then
        fails, and it carries on without the entry): (entries, temporary files) removed."""
        counts = [0, 0]
        for kind, paths in enumerate((self.entries(), self.leftovers())):
            for p in paths:
                try:
                    p.unlink()
                    counts[kind] += 1
                except OSError:
                    pass
        return counts[0], counts[1]

    @staticmethod
    def _sizes(paths: list[Path]) -> list[int]:
        sizes = []
        for p in paths:
            try:
                sizes.append(p.stat().st_size)
            except OSError:
                continue
        return sizes

    def info(self) -> dict[str, object]:
        """Where the folder is, its entries and their bytes, its bound, and the temporary files
        in it (``leftovers``, ``leftover_bytes``)."""
        sizes = self._sizes(self.entries())
        left = self._sizes(self.leftovers())
        return {
            "path": str(self.root),
            "entries": len(sizes),
            "bytes": sum(sizes),
            "max_bytes": self.max_bytes,
            "leftovers": len(left),
            "leftover_bytes": sum(left),
        }
