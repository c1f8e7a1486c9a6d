"""One in-process Ray instance at a time on this machine, and none of its process-wide
environment left behind (``ray.init`` exports RAY_* variables, among them its token-auth mode:
the next ``ray.init`` in the process, under another HOME with no token, then starts a GCS that
aborts). Also: pytest-xdist workers that each start
a local Ray (tests/sweep/test_ray_executor.py, test_memory_oom.py) would otherwise race for the
same GCS port and one of them times out waiting for its GCS. The lock is an flock on a file in
the system's temporary folder, held for the Ray instance's lifetime."""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

LOCK = Path(tempfile.gettempdir()) / "hfadapt-tests-ray.lock"


@contextmanager
def one_local_ray() -> Iterator[None]:
    with LOCK.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # waits while another worker's Ray runs
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ray_environment() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k.startswith("RAY_")}


def forget_ray_environment(before: dict[str, str]) -> None:
    """Drop the RAY_* variables set since ``before`` and put back the ones it held."""
    import os

    for key in [k for k in os.environ if k.startswith("RAY_")]:
        if key not in before:
            del os.environ[key]
    os.environ.update(before)


_home: list[str] = []


def ray_home() -> str:
    """One HOME for every in-process Ray of this test process: Ray keeps the auth token it made
    under the first HOME loaded in the process, so a second ``ray.init`` under another HOME
    starts a GCS that finds no token and aborts. Short: Ray's socket paths must fit 107 bytes."""
    if not _home:
        _home.append(tempfile.mkdtemp(prefix="hfray-"))
    return _home[0]


@contextmanager
def local_ray(ray: Any, num_cpus: int, tests: Path) -> Iterator[Any]:
    """A local Ray instance (no dashboard) whose workers import from ``tests``, started under
    the process's Ray HOME while no other worker's Ray runs; on exit it is shut down and
    PYTHONPATH, HOME and the RAY_* variables are as they were."""
    import os

    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "HOME")}
    home = ray_home()
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(tests), saved["PYTHONPATH"]) if p)
    os.environ["HOME"] = home
    with one_local_ray():
        before = ray_environment()
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     _temp_dir=os.path.join(home, "r"))  # fmt: skip
            yield ray
        finally:
            ray.shutdown()
            forget_ray_environment(before)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
