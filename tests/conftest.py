"""What every test gets: its database, HF cache and HF token store under its own tmp_path (so
nothing a test does touches the user's files or sends the user's token anywhere), no state
left by the test before, the native DL16 kernels built in a session folder, and, under
``CI=true``, a skipped containment or browser test counted as a failure, as is a skipped test
of the C kernels (marker ``native``) on a machine that can run them. Each folder's
conftest names the shared fixtures its part uses (from ``tests/support``)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def no_state_between_tests() -> Iterator[None]:
    """After each test: Dynamo's compiled frames dropped (a registry loads adapter files as new
    module objects, and a frame compiled against another test's module globals must not be
    reused); the default adapter registry forgotten (built from the test's own $HFADAPT_HOME,
    it would show a later test another test's drafts); and transformers' dynamic
    ``transformers_modules`` packages forgotten (each test has its own HF modules cache, which
    transformers appends to ``sys.path``: a stale entry earlier on the path would shadow the
    next test's ``transformers_modules`` package)."""
    saved_path = list(sys.path)
    yield
    sys.path[:] = saved_path
    registry = sys.modules.get("hfadapt.adapters.registry")
    if registry is not None:  # the process's default registry read this test's adapter folders
        registry._DEFAULT = None
    if "torch" in sys.modules:
        import torch

        torch._dynamo.reset()
    for name in [
        m
        for m in sys.modules
        if m == "transformers_modules" or m.startswith("transformers_modules.")
    ]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HFADAPT_DB, HF_HOME and HF_HUB_CACHE under tmp_path; no HF token. Returns the HF home."""
    import huggingface_hub.constants as hf_constants

    hf_home = tmp_path / "hf_home"
    paths = {
        "HF_HOME": hf_home,
        "HF_HUB_CACHE": hf_home / "hub",
        "HF_ASSETS_CACHE": hf_home / "assets",
        "HF_XET_CACHE": hf_home / "xet",
        "HF_TOKEN_PATH": hf_home / "token",
        "HF_STORED_TOKENS_PATH": hf_home / "stored_tokens",
    }
    monkeypatch.setenv("HFADAPT_DB", str(tmp_path / "runs.db"))
    # Accepted agent drafts land in $HFADAPT_HOME/adapters: never the user's folder.
    monkeypatch.setenv("HFADAPT_HOME", str(tmp_path / "hfadapt_home"))
    monkeypatch.delenv("HFADAPT_ADAPTERS_PATH", raising=False)
    for name, path in paths.items():
        monkeypatch.setenv(name, str(path))
        # huggingface_hub read these at import time: the environment alone is not enough.
        if hasattr(hf_constants, name):
            monkeypatch.setattr(hf_constants, name, str(path))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return hf_home


@pytest.fixture(autouse=True)
def fresh_device_warnings() -> None:
    """Each test sees the device's warn-once warnings anew (they are once per process)."""
    import sys

    tracking = sys.modules.get("hfadapt.spyre.rules.tracking")
    if tracking is not None:
        tracking.reset_warnings()


@pytest.fixture(scope="session", autouse=True)
def _native_dl16_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The C DL16 kernel (hfadapt.spyre.numerics.dl16_native) is built into a session tmp dir, not
    into the user's cache; the compile and reference caches are off."""
    import os

    names = ("HFADAPT_CACHE_DIR", "HFADAPT_COMPILE_CACHE", "HFADAPT_REFERENCE_CACHE")
    old = {name: os.environ.get(name) for name in names}
    os.environ["HFADAPT_CACHE_DIR"] = str(tmp_path_factory.mktemp("hfadapt-cache"))
    # The persistent compile cache is off: a test that patches the backend must compile afresh
    # (tests/test_compile_cache.py turns it on where it is the subject). To check that verdicts
    # hold when graphs come from the cache, run a test file twice with
    # HFADAPT_TEST_COMPILE_CACHE=<folder>: the cache is then on, in that folder.
    shared = os.environ.get("HFADAPT_TEST_COMPILE_CACHE")
    if shared:
        os.environ["HFADAPT_CACHE_DIR"] = shared
    os.environ["HFADAPT_COMPILE_CACHE"] = "1" if shared else "0"
    # so is the CPU reference cache: every test's reference is computed (and checked) afresh
    # (tests/judge/test_reference_cache.py turns it on where it is the subject)
    os.environ["HFADAPT_REFERENCE_CACHE"] = "0"
    yield
    for name, value in old.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# Under CI, a containment or browser test that would skip (no bubblewrap, no chromium) fails:
# what CI is for is proving those promises, and a skip would hide that it could not.
STRICT_MARKERS = ("containment", "browser")
# Tests of the C kernels (``native``; ``native(amx=True)``: of AMX's tiles) are as strict under
# CI wherever this machine can run them: a skip there means a kernel that did not build or load.
NATIVE_MARKER = "native"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{NATIVE_MARKER}: tests of the C DL16 kernels (amx=True: of AMX's bf16 tiles); under "
        "CI=true a skip is a failure where the machine has a C compiler (and, for amx, the "
        "CPU's tiles with the kernel's grant), unless HFADAPT_NATIVE_DL16/_AMX=0 turn them off",
    )


@functools.lru_cache(maxsize=2)
def native_capable(amx: bool) -> str | None:
    """What this machine has that the native tests need, said for a failure message (found
    without hfadapt's own kernels, which are what a skip may hide); None when it lacks any,
    or the settings turn the kernels off."""
    import shutil

    from hfadapt import settings

    if not settings.native_dl16() or (amx and not settings.native_amx()):
        return None
    named = settings.c_compiler()
    compiler = shutil.which(named) if named else shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    if not amx:
        return f"has a C compiler ({compiler})"
    flags = _cpu_flags()
    needed = {"amx_bf16", "amx_tile", "avx512f", "avx512bw"}
    if not needed <= flags or not _amx_granted():
        return None
    return f"has a C compiler ({compiler}) and AMX's bf16 tiles ({', '.join(sorted(needed))})"


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _amx_granted() -> bool:
    """Whether the kernel grants this process AMX's tile state (arch_prctl
    ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), asked as the kernels ask."""
    import ctypes
    import platform

    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.syscall(158, 0x1023, 18)) == 0  # SYS_arch_prctl on x86_64


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    strict = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    # an expected failure (xfail) is reported as skipped too: it ran, so it is not what this
    # guards against (and pytest would not count it as failed: "1 failed" with exit code 0)
    if not (strict and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(item.get_closest_marker(m) for m in STRICT_MARKERS):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run it: {reason}"
        return
    native = item.get_closest_marker(NATIVE_MARKER)
    has = native_capable(bool(native.kwargs.get("amx"))) if native is not None else None
    if has is not None:
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, but this machine {has}: {reason}"


# The order the suite runs in (tests/support/ordering.py): the long tests first, longest first
# by their measured durations (tests/durations.json), then the quick ones, so the first
# xdist worker starts on the longest while the others run the quick tests, and no long test is
# left to start near the end. The tests that read a once-per-run session fixture (the two real
# cycles, about three minutes; the agent's reference self-check, about two and a half) form one
# unit, so no worker waits on another's lock. A conftest copied into another folder (a test of
# this file's CI rules) has no tests/support beside it and keeps the collection order.
ONCE_PER_RUN_FIXTURES = ("two_real_cycles", "reference_eval")
# The tests that start an in-process Ray (test_ray_executor.py, test_memory_oom.py: a module
# fixture each, one Ray at a time on the machine, support/ray_lock.py) form one unit too: on two
# workers the second to start its Ray waited for the first's lock, 20 s of a worker doing nothing
# (measured 2026-12-06: the first out-of-memory test took 26.2 s, 2.2 s of it CPU; 6.2 s alone).
ONE_WORKER_FIXTURES = ("local_ray",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        from support.ordering import load_durations, plan
    except ImportError:
        return
    measured = load_durations()

    def shared(item: pytest.Item) -> str | None:
        fixtures = getattr(item, "fixturenames", ())
        together = (*ONCE_PER_RUN_FIXTURES, *ONE_WORKER_FIXTURES)
        return next((name for name in together if name in fixtures), None)

    items[:] = plan(
        items,
        seconds=lambda item: measured.get(item.nodeid),
        slow=lambda item: item.get_closest_marker("slow") is not None,
        shared=shared,
    )
