"""The persistent compile cache of the spyre backend (hfadapt.spyre.compile.cache): a second
process compiles from it with identical outputs; concurrent writers, a corrupt or tampered entry
and the size bound; ``hfadapt cache info`` / ``clear``; what the key depends on."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from support.cli_runner import run_cli

from hfadapt.spyre.compile import cache
from hfadapt.spyre.rules.profile import load_profile

# A fresh process: a tiny BERT with the registry's adapters, compiled on the device; prints the
# cache counts and the output's bytes (hex of its sha256) as JSON.
CHILD = """
import hashlib, json, torch
from hfadapt.adapters.examples import tiny_model
from hfadapt.adapters.registry import default_registry
from hfadapt.spyre.compile import cache
from hfadapt.spyre.compile.backend import lower
model, ids, mask = tiny_model("bert", 0)
model = model.half()
default_registry().apply(model)
lowered, report = lower(model, {"input_ids": ids, "attention_mask": mask})
out = lowered.audit_output.last_hidden_state.contiguous()
digest = hashlib.sha256(out.view(torch.uint8).numpy().tobytes()).hexdigest()
print(json.dumps({"stats": cache.stats(), "out": digest, "ok": report.ok,
                  "graphs": report.graph_count, "defects": len(report.defects)}))
"""


@pytest.fixture
def cache_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The compile cache on, in a folder of this test's own."""
    monkeypatch.setenv("HFADAPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HFADAPT_COMPILE_CACHE", "1")
    return tmp_path / "cache" / "compile"


def _child(env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_second_process_compiles_from_the_cache_with_identical_outputs(
    cache_on: Path,
) -> None:
    env = {**os.environ}
    first = _child(env)
    second = _child(env)
    assert first["stats"]["stored"] >= 1 and first["stats"]["hits"] == 0, first
    assert second["stats"]["hits"] == first["stats"]["stored"], (first, second)
    assert second["stats"]["misses"] == 0, second
    assert second["out"] == first["out"], (first["out"], second["out"])
    assert (second["ok"], second["graphs"], second["defects"]) == (
        first["ok"],
        first["graphs"],
        first["defects"],
    )
    off = _child({**env, "HFADAPT_COMPILE_CACHE": "0"})
    assert off["stats"] == {k: 0 for k in off["stats"]}, off
    assert off["out"] == first["out"]


# -- unit tests on one small graph ----------------------------------------------------------------


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) * 2


def _compile_small(dtype: torch.dtype = torch.float16) -> torch.Tensor:
    from hfadapt.spyre.compile.backend import SpyreBackend

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Small().to(dtype)
    x = torch.randn(64, 64).to(dtype)
    with torch.no_grad():
        return torch.compile(model, backend=SpyreBackend(), dynamic=False)(x)  # type: ignore[no-any-return]


def _entries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.json") if not p.name.startswith("."))


def test_a_corrupt_or_tampered_entry_is_ignored_and_written_again(cache_on: Path) -> None:
    expected = _compile_small()
    (entry,) = _entries(cache_on)
    good = entry.read_bytes()
    for bad in (
        b"{not json",
        good.replace(b'"aten::relu.default"', b'"builtins::eval.default"'),
        good.replace(b'"format":1', b'"format":99'),
        good[: len(good) // 2],
    ):
        assert bad != good
        entry.write_bytes(bad)
        before = cache.stats()
        got = _compile_small()
        after = cache.stats()
        assert torch.equal(got, expected), "a bad entry changed the output"
        assert after["rejected"] == before["rejected"] + 1, (bad[:60], before, after)
        assert after["stored"] == before["stored"] + 1, (before, after)
        rewritten = entry.read_bytes()
        assert rewritten != bad and json.loads(rewritten)["key"] == entry.stem, rewritten[:80]
    before = cache.stats()
    assert torch.equal(_compile_small(), expected)
    assert cache.stats()["hits"] == before["hits"] + 1


def test_concurrent_writers_leave_one_whole_entry(cache_on: Path) -> None:
    _compile_small()
    (entry,) = _entries(cache_on)
    key = entry.stem
    data = json.loads(entry.read_text())
    from hfadapt.spyre.compile.graph_codec import decode

    gm = decode(data["graph"], {})
    inputs = [
        torch.empty_strided(m["shape"], m["stride"], dtype=torch.float16) for m in data["inputs"]
    ]
    store = cache.CompileCache(cache_on, 2**30)
    entry.unlink()
    rejected_before = cache.stats()["rejected"]
    errors: list[BaseException] = []
    loaded: list[bool] = []

    def write() -> None:
        try:
            for _ in range(10):
                assert store.store(key, gm, inputs, data["static"])
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            for _ in range(30):
                loaded.append(store.load(key, inputs) is not None)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(4)]
    threads += [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert [p.name for p in cache_on.iterdir()] == [entry.name], list(cache_on.iterdir())
    assert store.load(key, inputs) is not None
    rejected = cache.stats()["rejected"] - rejected_before
    assert rejected == 0, f"a reader saw a partial entry ({rejected} rejected)"


def test_the_size_bound_evicts_the_least_recently_used(cache_on: Path) -> None:
    _compile_small()
    (entry,) = _entries(cache_on)
    data = json.loads(entry.read_text())
    from hfadapt.spyre.compile.graph_codec import decode

    gm = decode(data["graph"], {})
    inputs = [
        torch.empty_strided(m["shape"], m["stride"], dtype=torch.float16) for m in data["inputs"]
    ]
    size = entry.stat().st_size
    store = cache.CompileCache(cache_on, int(size * 2.5))  # room for two entries
    store.clear()
    keys = ["a" * 64, "b" * 64, "c" * 64]
    for i, key in enumerate(keys[:2]):
        assert store.store(key, gm, inputs, data["static"])
        os.utime(cache_on / f"{key}.json", (time.time() - 100 + i, time.time() - 100 + i))
    assert store.load(keys[0], inputs) is not None  # "a" is now the most recently used
    assert store.store(keys[2], gm, inputs, data["static"])
    left = sorted(p.stem[0] for p in _entries(cache_on))
    assert left == ["a", "c"], f"entries left: {left}"
    assert store.info()["bytes"] <= store.max_bytes, store.info()


def test_cache_info_and_clear_on_the_command_line(
    cache_on: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _compile_small()
    code, out, _ = run_cli(["cache", "info", "--json"], monkeypatch, capsys)
    info = json.loads(out)["compile"]
    assert code == 0 and info["entries"] == 1 and info["bytes"] > 0, out
    assert Path(info["path"]) == cache_on
    code, out, err = run_cli(["cache", "clear"], monkeypatch, capsys)
    assert code == 0, err
    assert "removed 1 entries from the compile cache" in out, out
    assert _entries(cache_on) == []
    code, out, _ = run_cli(["cache", "info"], monkeypatch, capsys)
    assert code == 0 and "compile cache" in out and "0 entries" in out, out


def test_the_key_changes_with_the_profile_version_and_the_dtype() -> None:
    captured: list[tuple[Any, list[Any]]] = []

    def capture(gm: Any, inputs: list[Any]) -> Any:
        captured.append((gm, inputs))
        return gm.forward

    for dtype in (torch.float16, torch.bfloat16):
        torch._dynamo.reset()
        model = Small().to(dtype)
        with torch.no_grad():
            torch.compile(model, backend=capture, dynamic=False)(torch.randn(64, 64).to(dtype))
    (gm16, in16), (gm_bf, in_bf) = captured
    store = cache.CompileCache(Path("unused"), 0)
    profile = load_profile()
    newer = dataclasses.replace(profile, version=profile.version + ".1")
    base = store.key(gm16, in16, profile)
    assert base is not None
    assert store.key(gm16, in16, profile) == base  # stable
    assert store.key(gm_bf, in_bf, profile) != base, "dtype"
    assert store.key(gm16, in16, newer) != base, "profile version"
    with torch.no_grad():
        assert store.key(gm16, in16, profile) != base, "grad mode"


class WithConstant(torch.nn.Module):
    """A tensor made in forward: aot_autograd keeps it as a real constant of the graph."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt(torch.tensor(64.0))


def test_a_graph_with_a_tensor_constant_is_stored_and_compiles_from_the_cache(
    cache_on: Path,
) -> None:
    """The compiler stores under aot_autograd's fake tensor mode; a real constant is read with
    that mode set aside (it raised "Please convert all Tensors to FakeTensors")."""
    from hfadapt.spyre.compile.backend import SpyreBackend

    x = torch.randn(64, 64).half()
    outs = []
    for _ in range(2):
        torch._dynamo.reset()
        with torch.no_grad():
            outs.append(torch.compile(WithConstant(), backend=SpyreBackend(), dynamic=False)(x))
    entries = _entries(cache_on)
    assert len(entries) == 1 and torch.equal(outs[0], outs[1]), (entries, outs)
    err = float((outs[1].float() - x.float() / 8).abs().max())
    bound = float(x.float().abs().max()) / 8 * 2**-8  # DL16 keeps 9 mantissa bits
    assert err <= bound, f"x / 8 on the device: max abs err {err} (bound {bound})"


def test_the_key_changes_with_autocast_the_default_dtype_and_deterministic_algorithms() -> None:
    """What aot_autograd traces under besides the graph (torch's AOTAutogradCache and FX graph
    cache key the same): autocast per device type and its dtype, the default dtype."""
    captured: list[tuple[Any, list[Any]]] = []

    def capture(gm: Any, inputs: list[Any]) -> Any:
        captured.append((gm, inputs))
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(Small().half(), backend=capture, dynamic=False)(torch.randn(64, 64).half())
    ((gm, inputs),) = captured
    store = cache.CompileCache(Path("unused"), 0)
    profile = load_profile()
    base = store.key(gm, inputs, profile)
    keys: dict[str, str | None] = {}
    for device, dtype in (("cpu", torch.bfloat16), ("cpu", torch.float16), ("spyre", None)):
        with torch.autocast(device, dtype=dtype):
            keys[f"autocast {device} {dtype}"] = store.key(gm, inputs, profile)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert store.key(gm, inputs, profile) == base, "autocast off is no autocast"
    torch.set_default_dtype(torch.float64)
    try:
        keys["float64 default"] = store.key(gm, inputs, profile)
    finally:
        torch.set_default_dtype(torch.float32)
    torch.use_deterministic_algorithms(True)
    try:
        keys["deterministic"] = store.key(gm, inputs, profile)
    finally:
        torch.use_deterministic_algorithms(False)
    print({k: (v or "")[:12] for k, v in keys.items()}, (base or "")[:12])
    assert base is not None and store.key(gm, inputs, profile) == base
    assert None not in keys.values() and len({base, *keys.values()}) == len(keys) + 1, keys


def test_a_graph_traced_under_autocast_never_serves_a_plain_compile(cache_on: Path) -> None:
    """It did: a plain compile read the graph stored under bf16 autocast and returned bf16."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under = _compile_small()
    before = cache.stats()
    plain = _compile_small()
    after = cache.stats()
    print(f"\nunder autocast: {under.dtype}; then plain: {plain.dtype}; {before} -> {after}")
    assert under.dtype == torch.bfloat16 and plain.dtype == torch.float16, (under, plain)
    assert after["hits"] == before["hits"] and after["stored"] == before["stored"] + 1, after
    assert len(_entries(cache_on)) == 2, _entries(cache_on)
    with cache.recording() as used:
        assert torch.equal(_compile_small(), plain)
    assert len(used.hits) == 1 and not used.misses and not used.stored, used
    with cache.skipped(), cache.recording() as skipped:
        assert torch.equal(_compile_small(), plain)
    assert skipped.to_dict() == "off", skipped


def _killed_writer(folder: Path, data: bytes) -> int:
    """A process killed between writing its temporary file and renaming it; its pid."""
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from hfadapt.disk_cache import BoundedFolder\n"
        "print(os.getpid(), flush=True)\n"
        "os.replace = lambda *a: os._exit(9)  # killed right before the rename\n"
        "BoundedFolder(Path(sys.argv[1]), 2**30, '.json').write('k' * 64, b'x' * int(sys.argv[2]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(folder), str(len(data))], capture_output=True, timeout=120
    )
    assert proc.returncode == 9, proc.stderr.decode()[-2000:]
    return int(proc.stdout)


def test_killed_writers_leftovers_are_counted_evicted_when_stale_and_cleared(
    cache_on: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.disk_cache import STALE_SECONDS

    pids = [_killed_writer(cache_on, b"x" * 3000) for _ in range(2)]
    left = sorted(cache_on.glob(".tmp-*"))
    assert [p.name.split("-")[1] for p in left] == sorted(str(p) for p in pids), left
    code, out, _ = run_cli(["cache", "info", "--json"], monkeypatch, capsys)
    info = json.loads(out)["compile"]
    assert code == 0 and (info["entries"], info["leftovers"]) == (0, 2), info
    assert info["leftover_bytes"] == 6000, info
    code, out, _ = run_cli(["cache", "info"], monkeypatch, capsys)
    assert code == 0 and "0 entries" in out and "2 unfinished writes (5.9 KiB" in out, out
    stale = time.time() - STALE_SECONDS - 60
    os.utime(left[0], (stale, stale))
    _compile_small()  # a write evicts: the stale leftover goes, the fresh one may be a writer's
    assert sorted(cache_on.glob(".tmp-*")) == left[1:], list(cache_on.iterdir())
    assert len(_entries(cache_on)) == 1
    code, out, _ = run_cli(["cache", "clear"], monkeypatch, capsys)
    assert code == 0 and "removed 1 entries from the compile cache" in out, out
    assert "and 1 unfinished writes" in out, out
    assert list(cache_on.iterdir()) == [], list(cache_on.iterdir())
