"""Judging computes float32 exactly whatever its caller set (hfadapt.spyre.numerics.host_state.pinned):
a caller's ``torch.set_float32_matmul_precision("medium")`` (bf16 matmuls on a CPU with AMX)
or ``torch.autocast("cpu", dtype=torch.bfloat16)`` changes no verdict and no number, the
caller gets its settings back, and no cache entry written under them changes a later run."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hfadapt import verdicts
from hfadapt.judge.diagnose import diagnose
from hfadapt.loading.load import load
from hfadapt.loading.probes import build_probes, model_inputs
from hfadapt.spyre.numerics import host_state

pytestmark = pytest.mark.usefixtures("one_thread")


@contextlib.contextmanager
def medium_precision() -> Iterator[None]:
    """The caller's setting of the issue: fp32 matmuls in bf16 where oneDNN can (AMX)."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def bf16_autocast() -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16)


CALLERS: dict[str, Callable[[], Any]] = {
    "plain": contextlib.nullcontext,
    "medium": medium_precision,
    "autocast": bf16_autocast,
}


@pytest.fixture
def caches_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Both caches on, in a folder of this test's own; the folder."""
    monkeypatch.setenv("HFADAPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HFADAPT_REFERENCE_CACHE", "1")
    monkeypatch.setenv("HFADAPT_COMPILE_CACHE", "1")
    return tmp_path / "cache"


def _numbers(diag: Any) -> tuple[str, dict[str, Any]]:
    assert diag.metrics is not None, (diag.verdict, diag.reason)
    return diag.verdict, diag.metrics.to_dict()


def test_pinned_gives_the_callers_settings_back_even_on_an_error() -> None:
    torch.set_float32_matmul_precision("medium")
    torch.set_default_dtype(torch.float64)
    try:
        with bf16_autocast():
            before = host_state.state()
            assert not host_state.exact(before), before
            with pytest.raises(ValueError), host_state.pinned():
                inside = host_state.state()
                with host_state.pinned():  # nested: the outer pin stands
                    pass
                assert host_state.state() == inside
                raise ValueError("the block fails")
            after = host_state.state()
    finally:
        torch.set_default_dtype(torch.float32)
        torch.set_float32_matmul_precision("highest")
    print(f"\ncaller {before}\npinned {inside}")
    assert host_state.exact(inside), inside
    assert inside["matmul_precision"] == "highest" and inside["autocast"] == {}, inside
    assert set(inside["fp32_precision"].values()) == {"ieee"}, inside
    assert inside["default_dtype"] == "torch.float32", inside
    assert after == before, f"not given back: {before} -> {after}"
    assert before["fp32_precision"]["mkldnn.matmul"] == "bf16", before


def _unpinned_moves(folder: Path) -> dict[str, float]:
    """How far the CPU fp32 forward of the model moves under each caller's setting when
    nothing pins it: the max |diff| of the last hidden state against exact fp32."""
    lm = load(folder)
    inputs = model_inputs(lm.model, build_probes(lm))
    moved = {}
    with torch.inference_mode():
        exact = lm.model(**inputs).last_hidden_state
        for name in ("medium", "autocast"):
            with CALLERS[name]():
                out = lm.model(**inputs).last_hidden_state.float()
            moved[name] = float((out - exact).abs().max())
    return moved


def test_a_callers_precision_or_autocast_changes_no_verdict_and_no_number(
    tiny_bert: Path, cpu_runner: Callable[..., Any]
) -> None:
    moved = _unpinned_moves(tiny_bert)
    print(f"\nthe unpinned CPU fp32 forward moves by (max |diff|): {moved}")
    # the test can see a missing pin: autocast moves the forward on any CPU (medium only
    # where oneDNN has bf16 matmuls)
    assert moved["autocast"] > 1e-3, moved
    got = {}
    for name, caller in CALLERS.items():
        with caller():
            before = host_state.state()
            got[name] = diagnose(tiny_bert, runner=cpu_runner, record=False, caches=False)
            after = host_state.state()
        assert after == before, f"{name}: the caller's settings changed: {before} -> {after}"
        print(f"{name}: {got[name].verdict}: {got[name].reason}")
    plain = _numbers(got["plain"])
    assert plain[0] == verdicts.PASS, got["plain"].reason
    for name in ("medium", "autocast"):
        assert _numbers(got[name]) == plain, f"{name}: {got[name].reason} vs {plain[1]}"
        assert got[name].versions.get("numeric.matmul_precision", "highest") == "highest"
    assert torch.get_float32_matmul_precision() == "highest"


def test_no_cache_entry_written_under_a_callers_settings_changes_a_later_run(
    tiny_bert: Path, caches_on: Path
) -> None:
    """On the real simulated device, compiled: runs under "medium" and under autocast fill
    and read both caches, and a plain run after them agrees with a cold plain run."""
    cold = diagnose(tiny_bert, record=False, caches=False)
    assert cold.evidence["caches"] == {"reference": "off", "compile": "off", "skipped": True}
    assert not caches_on.joinpath("reference").exists(), "caches=False wrote an entry"
    runs = {}
    for name in ("medium", "autocast", "plain"):
        torch._dynamo.reset()  # compile afresh: the compile cache, not Dynamo's memory, answers
        with CALLERS[name]():
            runs[name] = diagnose(tiny_bert, record=False)
        print(f"\n{name}: {runs[name].verdict}: {runs[name].reason}")
        print(f"  caches {runs[name].evidence['caches']}")
    assert _numbers(cold)[0] == verdicts.PASS, cold.reason
    for name, diag in runs.items():
        assert _numbers(diag) == _numbers(cold), f"{name}: {diag.reason} vs cold {cold.reason}"
    first = runs["medium"].evidence["caches"]
    assert first["reference"].startswith("miss:") and first["compile"]["stored"], first
    for name in ("autocast", "plain"):
        used = runs[name].evidence["caches"]
        # the same entries serve every caller: pinned, their keys do not move
        assert used["reference"] == "hit:" + first["reference"][5:], (name, used, first)
        assert sorted(used["compile"]["hits"]) == sorted(first["compile"]["stored"]), used
        assert used["compile"]["misses"] == [], (name, used)


@pytest.mark.slow
def test_real_minilm_passes_under_a_callers_medium_precision(
    minilm_path: Path, tmp_path: Path
) -> None:
    """The issue's model: under "medium" it failed verification (norm error 0.0162 against a
    bf16-matmul reference); judged pinned it gets the plain run's verdict and numbers."""
    folder = Path(shutil.copytree(minilm_path, tmp_path / "all-MiniLM-L6-v2"))
    got = {}
    for name, caller in CALLERS.items():
        with caller():
            got[name] = diagnose(folder, record=False, caches=False)
        print(f"\n{name}: {got[name].verdict}: {got[name].reason}")
    assert got["plain"].verdict == verdicts.PASS, got["plain"].reason
    for name in ("medium", "autocast"):
        assert _numbers(got[name]) == _numbers(got["plain"]), (name, got[name].reason)
