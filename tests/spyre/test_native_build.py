"""A failed build of the C kernels is reported once per process with the compiler's message,
remembered per source hash, compiler and flags (a record in the cache folder that later
processes read instead of running the compiler again), and retried after ``hfadapt cache
clear``; meanwhile every op takes the torch path. ``hfadapt cache info`` says whether this
process uses the kernels and AMX's tiles, and why not."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.cli_runner import run_cli
from support.native_loaders import loaders, loaders_not_run

from hfadapt.spyre.numerics import dl16, dl16_native, native_build

COMPILER_SAYS = "dl16.c:1:10: fatal error: stdint.h: No such file or directory"


def _fake_compiler(folder: Path, body: str) -> tuple[Path, Path]:
    """An executable ``cc`` in ``folder`` that notes each call (its arguments, a line) in
    ``calls`` and then runs ``body``; (its path, the calls file)."""
    folder.mkdir(parents=True, exist_ok=True)
    calls = folder / "calls"
    cc = folder / "cc"
    cc.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\n{body}\n')
    cc.chmod(0o755)
    return cc, calls


def _failing(folder: Path) -> tuple[Path, Path]:
    return _fake_compiler(
        folder, f'echo "{COMPILER_SAYS}" >&2\necho "compilation terminated." >&2\nexit 1'
    )


def _calls(calls: Path) -> list[str]:
    return calls.read_text().splitlines() if calls.exists() else []


A_PROCESS = """
import json, torch
from hfadapt.spyre.numerics import dl16, dl16_native, kernels
loaders = [n for n in dir(dl16_native) if n.startswith("load")]
found = {n: getattr(dl16_native, n)() is not None for n in loaders}
x = torch.randn(64, 300) * 1e3
rounded = dl16.round_dl16_(x.clone())
same = torch.equal(rounded, dl16._round_inplace(x.clone(), dl16.DEFAULT_FORMAT))
status = dl16_native.native_status().as_dict()
print(json.dumps({"found": found, "same": same, "status": status}))
"""


def _process(env: dict[str, str]) -> tuple[dict[str, object], list[str]]:
    """A new interpreter's kernels, rounding and status; and its warning lines about them."""
    done = subprocess.run(
        [sys.executable, "-c", A_PROCESS], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    warned = [line for line in done.stderr.splitlines() if "native DL16 kernels" in line]
    return json.loads(done.stdout.strip().splitlines()[-1]), warned


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """native_build as a new process finds it (nothing opened or built yet), with a cache
    folder of this test's own; its path."""
    monkeypatch.setattr(native_build, "_opened", {})
    monkeypatch.setattr(native_build, "_built", {})
    monkeypatch.setenv("HFADAPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HFADAPT_NATIVE_DL16", raising=False)
    monkeypatch.delenv("HFADAPT_NATIVE_AMX", raising=False)
    return tmp_path / "cache"


def _this_process(caplog: pytest.LogCaptureFixture) -> tuple[dict[str, object], list[str]]:
    """What A_PROCESS finds, asked here with no kernel loader run yet (and the fresh_process
    fixture's state of native_build); and the warnings about the kernels logged meanwhile."""
    with caplog.at_level(logging.WARNING, logger=native_build.__name__), loaders_not_run():
        found = {loader.__name__: loader() is not None for loader in loaders()}
        x = torch.randn(64, 300) * 1e3
        rounded = dl16.round_dl16_(x.clone())
        same = torch.equal(rounded, dl16._round_inplace(x.clone(), dl16.DEFAULT_FORMAT))
        status = dl16_native.native_status().as_dict()
    warned = [r.getMessage() for r in caplog.records if "native DL16 kernels" in r.getMessage()]
    return {"found": found, "same": same, "status": status}, warned


def test_a_failed_build_warns_once_with_the_compilers_message_and_is_not_retried(
    fresh_process: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first process (this one, as a new process finds it) runs the failing compiler once
    and warns once; a second interpreter reads the record and runs no compiler."""
    cc, calls = _failing(tmp_path / "bin")
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("HFADAPT_NATIVE_DL16", "1")
    first, warned = _this_process(caplog)
    print(first, warned, sep="\n")
    assert len(_calls(calls)) == 1, f"the compiler ran {_calls(calls)}"
    assert len(warned) == 1 and COMPILER_SAYS in warned[0], warned
    [record] = fresh_process.glob("dl16-*.failed.json")
    assert f"recorded in {record}" in warned[0] and "hfadapt cache clear" in warned[0], warned
    assert len(first["found"]) >= 9 and not any(first["found"].values()), first["found"]  # type: ignore[attr-defined]
    assert first["same"] is True, "the torch path did not round as itself"
    saved = json.loads(record.read_text())
    assert COMPILER_SAYS in saved["stderr"] and saved["compiler"] == str(cc), saved
    assert saved["source_sha256"] and "-fopenmp" in saved["command"], saved

    second, warned = _process(dict(os.environ))
    assert len(_calls(calls)) == 1, f"the second process ran the compiler again: {_calls(calls)}"
    assert len(warned) == 1 and COMPILER_SAYS in warned[0] and str(record) in warned[0], warned
    assert second["status"] == {**first["status"]}, (first["status"], second["status"])
    assert second["status"]["kernels"] == "failed" and second["status"]["record"] == str(record)  # type: ignore[index]


def test_cache_info_shows_the_failure_and_cache_clear_asks_for_another_try(
    fresh_process: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cc, calls = _failing(tmp_path / "bin")
    monkeypatch.setenv("CC", str(cc))
    with caplog.at_level(logging.WARNING, logger=native_build.__name__):
        code, out, err = run_cli(["cache", "info", "--json"], monkeypatch, capsys)
        assert code == 0, err
        native = json.loads(out)["native"]
        code, text, _ = run_cli(["cache", "info"], monkeypatch, capsys)
    record = fresh_process / Path(native["record"]).name
    assert native == {
        "kernels": "failed", "library": str(record).replace(".failed.json", ".so"),
        "record": str(record), "compiler": str(cc), "message": COMPILER_SAYS,
        "amx": "no kernels", "path": str(fresh_process), "failure_records": 1,
    }, native  # fmt: skip
    assert [r.getMessage().count(COMPILER_SAYS) for r in caplog.records] == [1], caplog.text
    assert len(_calls(calls)) == 1, _calls(calls)
    line = text.splitlines()[-1]
    assert line.startswith("native kernels ") and "not built: the build failed" in line, text
    assert COMPILER_SAYS in line and str(record) in line and "AMX tiles: unused" in line, line

    code, out, _ = run_cli(["cache", "clear"], monkeypatch, capsys)
    assert (
        code == 0 and f"removed 1 failed-build records of the C kernels from {fresh_process}" in out
    ), out
    assert not record.exists()
    monkeypatch.setattr(native_build, "_opened", {})  # the next process
    assert dl16_native.native_status().kernels == "failed"
    assert len(_calls(calls)) == 2, f"after cache clear the build was not tried: {_calls(calls)}"


def test_without_openmp_the_build_retries_single_threaded_and_other_errors_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiler that lacks OpenMP (says so about -fopenmp) gets a second call without it; a
    compiler that fails otherwise is called once."""
    monkeypatch.setenv("HFADAPT_CACHE_DIR", str(tmp_path / "cache"))
    no_omp, calls = _fake_compiler(
        tmp_path / "no-omp",
        'case "$*" in *-fopenmp*) echo "cc: error: unsupported option \'-fopenmp\'" >&2; exit 1;; esac\n'
        'while [ "$1" != "-o" ]; do shift; done; touch "$2"',
    )
    target = tmp_path / "cache" / "dl16-x.so"
    native_build._compile(str(no_omp), target)
    made = _calls(calls)
    assert target.exists() and len(made) == 2, made
    assert "-fopenmp" in made[0] and "-fopenmp" not in made[1], made
    broken, calls = _failing(tmp_path / "broken")
    with pytest.raises(native_build._BuildFailed) as info:
        native_build._compile(str(broken), tmp_path / "cache" / "dl16-y.so")
    assert len(_calls(calls)) == 1 and COMPILER_SAYS in info.value.stderr, _calls(calls)


def test_a_timed_out_build_is_not_recorded(
    fresh_process: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A build that outlasts BUILD_TIMEOUT (a busy machine) warns but writes no record: the
    next process tries again."""
    slow, calls = _fake_compiler(tmp_path / "slow", "exec sleep 5")
    monkeypatch.setenv("CC", str(slow))
    monkeypatch.setattr(native_build, "BUILD_TIMEOUT", 0.3)
    with caplog.at_level(logging.WARNING, logger=native_build.__name__):
        state = native_build.state()
    assert state.state == "failed" and state.record is None, state
    assert "timed out" in state.message and "not recorded" in caplog.text, caplog.text
    assert native_build.failure_records() == [], native_build.failure_records()
    assert len(_calls(calls)) == 1, _calls(calls)


def test_cache_info_says_what_the_settings_turn_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The kernels in use (here, as the device has them), AMX's tiles off with
    HFADAPT_NATIVE_AMX=0, and both off with HFADAPT_NATIVE_DL16=0; in text and JSON."""
    in_use = dl16_native.available()
    tiles = dl16_native.load_amx() is not None

    def native(**env: str) -> tuple[dict[str, object], str]:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        code, out, err = run_cli(["cache", "info", "--json"], monkeypatch, capsys)
        assert code == 0, err
        code, text, err = run_cli(["cache", "info"], monkeypatch, capsys)
        assert code == 0, err
        return json.loads(out)["native"], text.splitlines()[-1]

    got, line = native()
    assert (got["kernels"] == "built") == in_use, (got, in_use)
    assert (got["amx"] == "available") == tiles, (got, tiles)
    if in_use:
        assert "built, in use" in line and str(got["library"]) in line, line
    got, line = native(HFADAPT_NATIVE_AMX="0")
    assert got["amx"] == "disabled" and "AMX tiles: off (HFADAPT_NATIVE_AMX=0)" in line, (got, line)
    got, line = native(HFADAPT_NATIVE_DL16="0", HFADAPT_NATIVE_AMX="1")
    assert (got["kernels"], got["amx"]) == ("disabled", "no kernels"), got
    assert "off (HFADAPT_NATIVE_DL16=0); AMX tiles: unused (no C kernels)" in line, line
