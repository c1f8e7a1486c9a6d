"""The judging policy the device profile sets: eager casts per profile
version, compiled as the default judging path, and a dtype per model family with its source,
recorded on every run and overridable."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from support.device import cpu_fp16_runner

from hfadapt.errors import SpyreOpError
from hfadapt.judge.diagnose import diagnose
from hfadapt.judge.options import JudgeOptions
from hfadapt.spyre.rules.profile import available_profiles, load_profile
from hfadapt.sweep.options import SweepOptions
from hfadapt.sweep.worker import Task

# -- eager casts as the op table says -------------------------------------------------


def test_eager_casts_follow_the_profile_version(spyre) -> None:  # type: ignore[no-untyped-def]
    from hfadapt.spyre.eager.device import tracking
    from hfadapt.spyre.rules.tracking import SpyreFallbackWarning

    x = torch.randn(4, 64).half().to("spyre")
    with tracking("spyre-2026.07") as report:
        assert x.float().dtype == torch.float32  # mid-2026 op table: casts allowed
    assert not report.fallbacks
    # the newer op table: eager casts are not supported, and (torch-spyre#1691) a cast the
    # device cannot do runs on the host as a CPU fallback, warned and counted
    with tracking("spyre-2026.10") as report, pytest.warns(SpyreFallbackWarning, match="_to_copy"):
        back = x.float()
    assert back.dtype == torch.float32 and report.fallbacks["aten::_to_copy"] == 1
    assert torch.equal(back.cpu(), x.cpu().float())
    with tracking("spyre-2026.07"), pytest.raises(SpyreOpError, match="cast from int32 to float16"):
        torch.ones(4, dtype=torch.int32).to("spyre").half()  # never allowed, no fallback then
    with tracking("spyre-2026.10"):  # a host-side conversion on the way in is no device cast
        assert torch.randn(3).to("spyre", torch.float16).dtype == torch.float16
    newer = load_profile("spyre-2026.10")
    print(f"2026.10 casts: eager {newer.eager_casts}; source {newer.sources['ops_newer']!r}")
    assert not newer.eager_casts and load_profile("spyre-2026.07").eager_casts
    assert newer.cast_fallback and not load_profile("spyre-2026.07").cast_fallback


def test_compiled_casts_still_lower_in_the_newer_profile(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    class Island(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.float() * 2).half()

    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(Island(), backend="spyre", options={"profile": "spyre-2026.10"})
        out = compiled(torch.ones(4, 64).half())
    assert out.dtype == torch.float16 and float(out.float().max()) == 2.0
    assert spyre_backend.last_report().ok, spyre_backend.last_report().summary()


# -- compiled by default ---------------------------------------------------------------


def test_compiled_is_the_default_path_of_diagnose_and_sweep() -> None:
    defaults = {
        "diagnose": inspect.signature(diagnose).parameters["execution"].default,
        "JudgeOptions": JudgeOptions().execution,
        "SweepOptions": SweepOptions().judge.execution,
        "Task": Task("k", "m").judge.execution,
    }
    assert set(defaults.values()) == {"compile"}, defaults


# -- dtype per family -------------------------------------------------------------------


@pytest.mark.parametrize("name", available_profiles())
def test_family_dtypes_are_sourced(name: str) -> None:
    prof = load_profile(name)
    families = prof.family_dtypes["families"]
    got = {t: prof.family_dtype(t)[0] for t in ("gemma3_text", "gemma2", "t5", "bert", "qwen3")}
    print(name, got)
    assert got == {
        "gemma3_text": "bf16",
        "gemma2": "bf16",
        "t5": "bf16",
        "bert": "fp16",
        "qwen3": "fp16",
    }
    for family, entry in families.items():
        assert entry["source"] in prof.sources, (family, entry["source"])
    assert "ARCHITECTURE.md" in prof.family_dtype("gemma")[1]["source"]


def _config_dir(root: Path, config: dict[str, Any]) -> Path:
    folder = root / str(config["model_type"])
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _recording_runner(calls: list[dict[str, Any]]) -> Any:
    def run(model: Any, inputs: Any, **kwargs: Any) -> Any:
        calls.append({"execution": kwargs["execution"], "dtype": kwargs["dtype"]})
        return cpu_fp16_runner(model, inputs, **kwargs)

    return run


GEMMA = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3TextModel"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 512,
}
BERT = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "hidden_size": 128,
    "num_attention_heads": 2,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
}


@pytest.mark.parametrize(
    ("config", "asked", "expected", "overridden"),
    [
        (GEMMA, None, torch.bfloat16, False),
        (BERT, None, torch.float16, False),
        (GEMMA, "fp16", torch.float16, True),
    ],
)
def test_diagnose_applies_and_records_the_family_dtype(
    tmp_path: Path,
    config: dict[str, Any],
    asked: str | None,
    expected: torch.dtype,
    overridden: bool,
) -> None:
    calls: list[dict[str, Any]] = []
    diag = diagnose(
        _config_dir(tmp_path, config),
        mode="structural",
        dtype=asked,
        runner=_recording_runner(calls),
        record=False,
        localize_failures=False,
    )
    policy = diag.evidence.get("dtype_policy")
    print(config["model_type"], asked, "->", calls, diag.dtype, policy)
    assert calls == [{"execution": "compile", "dtype": expected}], (calls, diag.reason)
    short = {torch.float16: "fp16", torch.bfloat16: "bf16"}[expected]
    assert diag.dtype == short and diag.to_dict()["dtype"] == short, diag.dtype
    assert diag.to_dict()["execution"] == "compile"  # the report says which path judged it
    assert policy is not None and policy["overridden"] is overridden, policy
