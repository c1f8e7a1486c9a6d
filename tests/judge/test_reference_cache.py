"""The CPU reference cache (hfadapt.judge.reference_cache): a second diagnose of the same model
reads the reference an earlier one computed and checked, with the same numbers; anything the
reference depends on changes the key; a bad entry, a nondeterministic model, hooks, a sweep
and ``HFADAPT_REFERENCE_CACHE=0`` never give a cached reference; ``hfadapt cache`` shows and
clears it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from support.cli_runner import run_cli

from hfadapt import verdicts
from hfadapt.judge.diagnose import diagnose
from hfadapt.judge.reference_cache import ReferenceCache, reference_key
from hfadapt.loading.load import load
from hfadapt.loading.probes import build_probes, model_inputs

pytestmark = pytest.mark.usefixtures("one_thread")

CACHED = "from the reference cache"


@pytest.fixture
def reference_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The reference cache on, in a folder of this test's own; its path."""
    monkeypatch.setenv("HFADAPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HFADAPT_REFERENCE_CACHE", "1")
    return tmp_path / "cache" / "reference"


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors")) if folder.is_dir() else []


def _cached(diag: Any) -> bool:
    return str(diag.evidence.get("reference", "")).startswith(CACHED)


def test_a_second_diagnose_reads_the_reference_with_the_same_numbers(
    tiny_bert: Path, cpu_runner: Callable[..., Any], reference_on: Path
) -> None:
    first = diagnose(tiny_bert, runner=cpu_runner, record=False)
    assert first.verdict == verdicts.PASS and not _cached(first), (first.reason, first.evidence)
    assert len(_entries(reference_on)) == 1, _entries(reference_on)
    again = diagnose(tiny_bert, runner=cpu_runner, record=False)
    print(
        f"\nreference phase: computed {first.timings['reference']:.3f} s, "
        f"read {again.timings['reference']:.3f} s; evidence {again.evidence.get('reference')}"
    )
    assert again.verdict == verdicts.PASS and _cached(again), again.evidence
    assert first.metrics is not None and again.metrics is not None
    assert again.metrics.to_dict() == first.metrics.to_dict(), (first.metrics, again.metrics)
    off = diagnose(tiny_bert, runner=cpu_runner, record=False, reuse_reference=False)
    assert not _cached(off) and off.metrics is not None, off.evidence
    assert off.metrics.to_dict() == first.metrics.to_dict()


def test_the_key_follows_weights_inputs_threads_and_refuses_hooks(tiny_bert: Path) -> None:
    lm = load(tiny_bert)
    inputs = model_inputs(lm.model, build_probes(lm))
    base = reference_key(lm.model, inputs)
    assert base is not None and base == reference_key(lm.model, inputs)
    changed = {}
    with torch.no_grad():
        weight = lm.model.embeddings.word_embeddings.weight
        old = float(weight[3, 5])
        weight[3, 5] = torch.nextafter(weight[3, 5], torch.tensor(1.0))  # one ulp, one value
        changed["one weight by one ulp"] = reference_key(lm.model, inputs)
        weight[3, 5] = old
    ids = inputs["input_ids"].clone()
    ids[0, 1] = (ids[0, 1] + 1) % lm.config.vocab_size
    changed["one input token"] = reference_key(lm.model, {**inputs, "input_ids": ids})
    config = lm.model.config
    config.layer_norm_eps = config.layer_norm_eps * 2
    changed["the config"] = reference_key(lm.model, inputs)
    config.layer_norm_eps = config.layer_norm_eps / 2
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        changed["torch's thread count"] = reference_key(lm.model, inputs)
    finally:
        torch.set_num_threads(threads)
    print({k: (v or "")[:12] for k, v in changed.items()}, base[:12])
    assert all(v is not None and v != base for v in changed.values()), changed
    assert reference_key(lm.model, inputs) == base, "restoring every change gives the key back"
    handle = lm.model.encoder.register_forward_hook(lambda *a: None)
    try:
        assert reference_key(lm.model, inputs) is None, "a model with hooks was keyed"
    finally:
        handle.remove()


def test_a_bad_entry_is_computed_again_and_replaced(
    tiny_bert: Path, cpu_runner: Callable[..., Any], reference_on: Path
) -> None:
    diagnose(tiny_bert, runner=cpu_runner, record=False)
    (entry,) = _entries(reference_on)
    good = entry.read_bytes()
    for bad in (b"not safetensors", good[: len(good) // 2]):
        entry.write_bytes(bad)
        diag = diagnose(tiny_bert, runner=cpu_runner, record=False)
        assert diag.verdict == verdicts.PASS and not _cached(diag), diag.evidence
        assert entry.read_bytes() == good, "the bad entry was not replaced by the computed one"
    other = ReferenceCache(reference_on, 2**30)
    assert other.load("0" * 64) is None
    entry.rename(reference_on / f"{'0' * 64}.safetensors")  # an entry under another key
    assert other.load("0" * 64) is None, "an entry naming another key was read"


def test_a_nondeterministic_reference_is_never_stored(tiny_bert: Path, reference_on: Path) -> None:
    lm = load(tiny_bert)
    lm.model.train()  # dropout on: two CPU runs differ
    diag = diagnose(lm, runner=lambda *a, **k: None, record=False)
    assert diag.verdict == verdicts.REFERENCE_FAILED, diag.reason
    assert _entries(reference_on) == [], _entries(reference_on)


def test_turned_off_nothing_is_read_or_written(
    tiny_bert: Path,
    cpu_runner: Callable[..., Any],
    reference_on: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HFADAPT_REFERENCE_CACHE", "0")
    for _ in range(2):
        diag = diagnose(tiny_bert, runner=cpu_runner, record=False)
        assert diag.verdict == verdicts.PASS and not _cached(diag), diag.evidence
    assert _entries(reference_on) == []


def test_cache_info_and_clear_show_both_caches(
    tiny_bert: Path,
    cpu_runner: Callable[..., Any],
    reference_on: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    diagnose(tiny_bert, runner=cpu_runner, record=False)
    code, out, _ = run_cli(["cache", "info", "--json"], monkeypatch, capsys)
    info = json.loads(out)
    print(info)
    assert code == 0 and set(info) == {"compile", "reference", "native"}, out
    assert info["reference"]["entries"] == 1 and info["reference"]["enabled"], info
    assert Path(info["reference"]["path"]) == reference_on
    code, out, err = run_cli(["cache", "clear"], monkeypatch, capsys)
    assert code == 0 and "removed 1 entries from the reference cache" in out, (out, err)
    assert _entries(reference_on) == []
    code, out, _ = run_cli(["cache", "info"], monkeypatch, capsys)
    assert code == 0 and out.count("\n") == 3 and "reference cache" in out, out


def test_cold_and_warm_caches_give_one_verdict_and_the_warm_run_records_its_hits(
    tiny_bert: Path, reference_on: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real simulated device, compiled, with both caches: a cold run stores, a warm one
    (Dynamo's in-memory graphs dropped) reads both, with the same verdict and numbers, and
    runs.db holds what each run used."""
    from sqlmodel import select

    from hfadapt.db.engine import get_engine, session
    from hfadapt.db.tables import Run

    monkeypatch.setenv("HFADAPT_COMPILE_CACHE", "1")
    cold = diagnose(tiny_bert)
    torch._dynamo.reset()
    warm = diagnose(tiny_bert)
    used = [d.evidence["caches"] for d in (cold, warm)]
    print(f"\ncold: {cold.reason}\n  {used[0]}\nwarm: {warm.reason}\n  {used[1]}")
    assert cold.verdict == warm.verdict == verdicts.PASS, (cold.reason, warm.reason)
    assert cold.metrics is not None and warm.metrics is not None
    assert warm.metrics.to_dict() == cold.metrics.to_dict(), (cold.reason, warm.reason)
    key = used[0]["reference"].removeprefix("miss:")
    assert used[0]["reference"] == f"miss:{key}" and used[1]["reference"] == f"hit:{key}", used
    assert len(key) == 12 and _entries(reference_on)[0].name.startswith(key), key
    stored = used[0]["compile"]["stored"]
    assert stored and used[0]["compile"]["hits"] == [], used[0]
    assert sorted(used[1]["compile"]["hits"]) == sorted(stored), used
    assert used[1]["compile"]["misses"] == used[1]["compile"]["stored"] == [], used[1]
    engine = get_engine()
    with session(engine, write=False) as sess:
        rows = list(sess.exec(select(Run).order_by(Run.id)))  # type: ignore[arg-type]
    engine.dispose()
    assert [r.evidence["caches"] for r in rows] == used, [r.evidence.get("caches") for r in rows]


def test_a_reference_outside_exact_float32_is_not_keyed(tiny_bert: Path) -> None:
    """A caller's "medium" precision, autocast or float64 default reaching the reference: no
    key, so no entry is written or read; pinned, the key holds the settings it read."""
    from hfadapt.spyre.numerics import host_state

    lm = load(tiny_bert)
    inputs = model_inputs(lm.model, build_probes(lm))
    with host_state.pinned():
        pinned = reference_key(lm.model, inputs)
    assert pinned is not None
    torch.set_float32_matmul_precision("medium")
    try:
        medium = reference_key(lm.model, inputs)
        with host_state.pinned():
            assert reference_key(lm.model, inputs) == pinned, "pinned, the key moved"
    finally:
        torch.set_float32_matmul_precision("highest")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = reference_key(lm.model, inputs)
    torch.set_default_dtype(torch.float64)
    try:
        float64 = reference_key(lm.model, inputs)
    finally:
        torch.set_default_dtype(torch.float32)
    keys = {"medium": medium, "autocast": autocast, "float64 default": float64}
    assert keys == dict.fromkeys(keys), keys
