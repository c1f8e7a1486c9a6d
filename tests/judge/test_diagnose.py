"""``hfadapt.judge.diagnose.diagnose`` end to end: every verdict, the evidence in its Run row, and the
real all-MiniLM-L6-v2 on the simulated device (once the device runner is there)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from hfadapt import verdicts
from hfadapt.db.tables import Run
from hfadapt.errors import (
    HubUnreachableError,
    ModelNotFoundError,
    SpyreLoweringError,
    SpyreUnsupportedModelError,
    UsageError,
)
from hfadapt.judge.diagnose import diagnose
from hfadapt.judge.environment import KEYS as ENVIRONMENT_KEYS
from hfadapt.spyre.rules.lowering_report import LoweringReport, SourceLocation, Violation

# Small models on a shared machine: one torch thread (see conftest.one_thread).
pytestmark = pytest.mark.usefixtures("one_thread")

PHASES = {"load", "probes", "reference", "adapters", "device", "metrics", "total"}


def rows() -> list[Run]:
    from hfadapt.db.engine import get_engine, session

    engine = get_engine()  # $HFADAPT_DB, isolated per test by conftest
    with session(engine, write=False) as sess:
        found = list(sess.exec(select(Run).order_by(Run.id)))  # type: ignore[arg-type]
    engine.dispose()
    return found


@pytest.mark.parametrize("arch", ["bert", "xlm-roberta", "roberta", "mpnet", "distilbert"])
def test_tiny_models_pass_and_are_recorded(
    tiny_model_dirs: dict[str, Path], cpu_runner: Callable[..., Any], arch: str
) -> None:
    diag = diagnose(tiny_model_dirs[arch], runner=cpu_runner)
    m = diag.metrics
    assert m is not None, diag.reason
    print(f"\n{arch}: {diag.verdict}: {m.summary()}; timings {diag.timings}")
    assert diag.verdict == verdicts.PASS, diag.reason
    assert m.min_token_cosine is not None and m.min_token_cosine >= 0.999, m.min_token_cosine
    assert (diag.exit_code, diag.mode, diag.structural) == (0, "full", False)
    assert set(diag.timings) >= PHASES, diag.timings
    (row,) = rows()
    assert row.id == diag.run_id and row.verdict == "pass" and row.model_type == arch
    assert row.min_token_cosine == pytest.approx(
        m.min_token_cosine
    ) and row.mean_token_cosine == pytest.approx(m.mean_token_cosine)
    assert (
        row.pooled_cosine is not None
        and row.max_abs_diff is not None
        and row.has_nan is False
        and row.has_inf is False
    )
    assert list(row.versions or {}) == list(ENVIRONMENT_KEYS), row.versions
    assert row.signature == diag.signature and row.signature and row.profile_version
    assert row.adapters == diag.adapters and isinstance(row.adapters, list)
    assert row.violations == [] and row.fallbacks == {} and row.divergence is None
    assert row.evidence and row.evidence["probes"].startswith("12 probes x 256 tokens"), (
        row.evidence
    )


def test_injected_fault_fails_verification_and_is_localized(
    tiny_model_dirs: dict[str, Path], fault_runner: Callable[..., Any]
) -> None:
    module = "encoder.layer.1.intermediate.intermediate_act_fn"
    diag = diagnose(tiny_model_dirs["bert"], runner=fault_runner(module))
    print(
        f"\n{diag.verdict}: {diag.reason}\n  divergence: {diag.divergence.summary() if diag.divergence else None}"
    )
    assert diag.verdict == verdicts.VERIFICATION_FAILED and diag.exit_code == 1
    assert (
        diag.metrics is not None
        and diag.metrics.min_token_cosine is not None
        and diag.metrics.min_token_cosine < 0.99
    )
    assert diag.divergence is not None and diag.divergence.module == module, diag.divergence
    assert module in diag.next_step
    (row,) = rows()
    assert row.verdict == "verification_failed" and row.divergence is not None
    assert row.divergence["module"] == module and row.divergence["layer"] == 1, row.divergence
    assert row.min_token_cosine is not None and row.min_token_cosine < 0.99, row.min_token_cosine
    assert "localize" in (row.timings or {})


def test_fp16_overflow_suggests_bf16(
    tiny_model_dirs: dict[str, Path], fault_runner: Callable[..., Any]
) -> None:
    diag = diagnose(
        tiny_model_dirs["bert"], runner=fault_runner("encoder.layer.0.output.dense", "overflow")
    )
    assert diag.verdict == verdicts.VERIFICATION_FAILED
    assert diag.metrics is not None and (diag.metrics.has_inf or diag.metrics.has_nan), diag.metrics
    assert "--dtype bf16" in diag.next_step and "encoder.layer.0.output.dense" in diag.next_step, (
        diag.next_step
    )


def test_dropout_left_on_gives_reference_failed(
    tiny_bert: Path, cpu_runner: Callable[..., Any]
) -> None:
    from hfadapt.loading.load import load

    lm = load(tiny_bert)
    lm.model.train()  # dropout 0.1 on: two CPU runs differ
    ran: list[bool] = []
    diag = diagnose(lm, runner=lambda *a, **k: ran.append(True))
    print(f"\n{diag.reason}")
    assert diag.verdict == verdicts.REFERENCE_FAILED and diag.exit_code == 1, diag.reason
    assert "not deterministic" in diag.reason and "max |diff|" in diag.reason, diag.reason
    assert not ran, "the device ran although the reference was not trustworthy"
    (row,) = rows()
    assert row.verdict == "reference_failed" and row.min_token_cosine is None


def _report(*violations: Violation) -> LoweringReport:
    report = LoweringReport("spyre-2026.07", "2026.07.1", "compile")
    for v in violations:
        report.add(v)
    return report


POW = Violation(
    "op.pow_non_square",
    "aten::pow.Tensor_Scalar",
    "InductorError: Unsupported: Spyre backend does not support: pow with exponent 3.0",
    dtypes=("float16",),
    location=SourceLocation(
        "/x/site-packages/transformers/activations.py", 57, "forward", "torch.pow(input, 3.0)"
    ),
)


def test_lowering_error_gives_lowering_failed_with_violations(
    tiny_model_dirs: dict[str, Path],
) -> None:
    def runner(*args: Any, **kwargs: Any) -> Any:
        raise SpyreLoweringError("1 violation(s): op.pow_non_square", _report(POW))

    diag = diagnose(tiny_model_dirs["bert"], runner=runner, execution="compile")
    assert diag.verdict == verdicts.LOWERING_FAILED and diag.exit_code == 1
    assert "aten::pow.Tensor_Scalar" in diag.next_step and POW.fingerprint() in diag.next_step, (
        diag.next_step
    )
    (row,) = rows()
    assert row.execution == "compile" and row.fingerprints == [POW.fingerprint()]
    assert row.violations and row.violations[0]["location"]["code"] == "torch.pow(input, 3.0)"


def test_eager_op_error_gives_lowering_failed_with_its_violations(
    tiny_model_dirs: dict[str, Path],
) -> None:
    from hfadapt.errors import SpyreOpNotImplementedError

    def runner(*args: Any, **kwargs: Any) -> Any:
        raise SpyreOpNotImplementedError(
            "Could not run 'aten::pow.Tensor_Scalar' with arguments from the 'PrivateUse1' backend.",
            [POW],
        )

    diag = diagnose(tiny_model_dirs["bert"], runner=runner)
    assert diag.verdict == verdicts.LOWERING_FAILED and "PrivateUse1" in diag.reason, diag.reason
    (row,) = rows()
    assert (
        row.fingerprints == [POW.fingerprint()]
        and row.violations
        and row.violations[0]["op"] == POW.op
    )


def test_device_warnings_are_evidence_not_noise(
    tiny_model_dirs: dict[str, Path], cpu_runner: Callable[..., Any]
) -> None:
    import warnings

    from hfadapt.spyre.rules.tracking import SpyreFallbackWarning

    def runner(*args: Any, **kwargs: Any) -> Any:
        for _ in range(3):
            warnings.warn(
                "aten::embedding is falling back to cpu", SpyreFallbackWarning, stacklevel=1
            )
            warnings.warn("lower(): 2 graph break(s)", UserWarning, stacklevel=1)
        return cpu_runner(*args, **kwargs)

    with warnings.catch_warnings(record=True) as leaked:
        warnings.simplefilter("always")
        diag = diagnose(tiny_model_dirs["bert"], runner=runner)
    assert diag.evidence["device_warnings"] == ["lower(): 2 graph break(s)"], diag.evidence
    assert not [
        w for w in leaked if "graph break" in str(w.message) or "falling back" in str(w.message)
    ]


def test_collected_violations_give_lowering_failed(
    tiny_model_dirs: dict[str, Path], cpu_runner: Callable[..., Any]
) -> None:
    def runner(model: Any, inputs: Any, **kwargs: Any) -> Any:
        run = cpu_runner(model, inputs, **kwargs)
        run.report = _report(POW)
        return run

    diag = diagnose(tiny_model_dirs["bert"], runner=runner)
    assert diag.verdict == verdicts.LOWERING_FAILED, diag.reason
    assert "1 violation(s)" in diag.reason


def test_unsupported_model(tiny_model_dirs: dict[str, Path]) -> None:
    def runner(*args: Any, **kwargs: Any) -> Any:
        raise SpyreUnsupportedModelError(
            "hidden_size 100 is not a multiple of 64", rule_id="layout.hidden_alignment"
        )

    diag = diagnose(tiny_model_dirs["bert"], runner=runner)
    assert diag.verdict == verdicts.UNSUPPORTED_MODEL and "multiple of 64" in diag.reason
    assert rows()[0].evidence["rule_id"] == "layout.hidden_alignment"  # type: ignore[index]


# ---- bad input and refused models -------------------------------------------------------------


def _edit_config(folder: Path, **changes: Any) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    ("case", "error", "needle"),
    [
        ("config without model_type", "ConfigError", "has no model_type"),
        ("unknown model_type", "ConfigError", "does not know"),
        ("corrupt safetensors", "WeightsError", "is corrupt"),
        ("missing tokenizer", "TokenizerError", "no tokenizer"),
    ],
)
def test_broken_models_are_recorded_as_load_failed(
    tiny_bert: Path, case: str, error: str, needle: str
) -> None:
    if case == "config without model_type":
        _edit_config(tiny_bert, model_type=None)
    elif case == "unknown model_type":
        _edit_config(tiny_bert, model_type="nonesuch")
    elif case == "corrupt safetensors":
        (tiny_bert / "model.safetensors").write_bytes(b"\x00" * 64)
    else:
        (tiny_bert / "tokenizer.json").unlink()
        (tiny_bert / "tokenizer_config.json").unlink()
    diag = diagnose(tiny_bert, runner=lambda *a, **k: None)
    print(f"\n{case}: {diag.reason}")
    assert (diag.verdict, diag.error, diag.exit_code) == (verdicts.LOAD_FAILED, error, 2), (
        diag.reason
    )
    assert needle in diag.reason and "\n" not in diag.reason
    (row,) = rows()
    assert row.verdict == "load_failed" and row.evidence and row.evidence["error"] == error


def test_no_model_at_all_raises_and_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for ref in (tmp_path / "missing", tmp_path / "empty", "acme/not-cached"):
        with pytest.raises(ModelNotFoundError):
            diagnose(ref, runner=lambda *a, **k: None)
    assert rows() == []


def test_an_unreachable_hub_raises_and_is_not_the_models_verdict(
    tiny_bert: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hfadapt.judge.phases as phases

    def unreachable(*_a: Any, **_k: Any) -> None:
        raise HubUnreachableError("cannot reach http://127.0.0.1:9 for model.safetensors of x/y")

    monkeypatch.setattr(phases, "load_model", unreachable)
    with pytest.raises(HubUnreachableError):
        diagnose(tiny_bert, runner=lambda *a, **k: None)
    assert [r.verdict for r in rows()] == [], "a network failure was recorded as a verdict"


def test_custom_code_verdict(tiny_bert: Path) -> None:
    _edit_config(tiny_bert, auto_map={"AutoModel": "modeling_x.XModel"})
    diag = diagnose(tiny_bert, runner=lambda *a, **k: None)
    assert (diag.verdict, diag.exit_code) == (verdicts.CUSTOM_CODE, 1), diag.reason
    assert "--trust-remote-code" in diag.next_step
    assert rows()[0].verdict == "custom_code"


@pytest.mark.parametrize(
    ("option", "value"), [("mode", "fast"), ("dtype", "fp8"), ("execution", "jit")]
)
def test_bad_options_are_usage_errors(
    tiny_model_dirs: dict[str, Path], option: str, value: str
) -> None:
    with pytest.raises(UsageError, match=value):
        diagnose(tiny_model_dirs["bert"], **{option: value})  # type: ignore[arg-type]


# ---- modes and adapters ----------------------------------------------------------------------


def test_structural_mode_offline_says_so_everywhere(
    cpu_runner: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    diag = diagnose("sentence-transformers/all-MiniLM-L6-v2", mode="structural", runner=cpu_runner)
    assert diag.verdict == verdicts.PASS, diag.reason
    assert diag.structural and diag.mode == "structural" and diag.reason.startswith("[structural] ")
    assert "--mode full" in diag.next_step
    (row,) = rows()
    assert row.mode == "structural" and row.reason and row.reason.startswith("[structural]")
    assert (
        row.evidence
        and "structural: config from hfadapt's bundled real config" in row.evidence["notes"][0]
    ), row.evidence
    assert row.evidence["probes"].endswith("ids from random)"), row.evidence["probes"]


def test_no_adapters(tiny_model_dirs: dict[str, Path], cpu_runner: Callable[..., Any]) -> None:
    diag = diagnose(tiny_model_dirs["bert"], runner=cpu_runner, adapters=False)
    assert diag.adapters == [] and rows()[0].adapters == []


def test_the_registry_given_is_the_one_applied(
    tiny_model_dirs: dict[str, Path], cpu_runner: Callable[..., Any]
) -> None:
    from hfadapt.adapters.registry import Registry, default_registry

    every = diagnose(tiny_model_dirs["bert"], runner=cpu_runner, record=False).adapters
    one = Registry()
    one.add(default_registry().get("gelu-exact-host"))
    one.add(default_registry().get("gelu-exact-host"))  # a duplicate: a load error, not a stop
    diag = diagnose(tiny_model_dirs["bert"], runner=cpu_runner, registry=one)
    print(f"\nevery adapter: {every}; given registry: {diag.adapters}")
    assert len(every) > 1 and "gelu-exact-host" in every, every
    assert diag.adapters == ["gelu-exact-host"] and rows()[0].adapters == ["gelu-exact-host"]
    errors = diag.evidence["adapter_errors"]
    assert len(errors) == 1 and "duplicate" in errors[0], errors
    with pytest.raises(UsageError, match="no adapter named 'attention-mask-host'"):
        diagnose(tiny_model_dirs["bert"], registry=one, without_adapters=["attention-mask-host"])


def test_a_config_in_memory_is_judged_structurally_under_its_own_id(
    tiny_model_dirs: dict[str, Path], cpu_runner: Callable[..., Any]
) -> None:
    raw = json.loads((tiny_model_dirs["bert"] / "config.json").read_text())
    options: dict[str, Any] = {"mode": "structural", "runner": cpu_runner, "record": False}
    crawled = diagnose("org/nowhere", config=raw, config_source="structural:crawl", **options)
    print(f"\n{crawled.verdict}: {crawled.config_source} {crawled.evidence_level}")
    assert (crawled.model_id, crawled.verdict) == ("org/nowhere", verdicts.PASS), crawled.reason
    assert (crawled.config_source, crawled.evidence_level) == ("structural:crawl", "config")
    assert "path" not in crawled.evidence and crawled.to_run_row().model_id == "org/nowhere"
    assert crawled.evidence["probes"].endswith("ids from random)"), crawled.evidence["probes"]
    given = diagnose("org/nowhere", config=raw, **options)
    assert (given.config_source, given.evidence_level) == ("structural:given", "config")
    assert given.metrics is not None and crawled.metrics is not None
    assert given.metrics.min_token_cosine == crawled.metrics.min_token_cosine
    with pytest.raises(UsageError, match="needs mode='structural'"):
        diagnose("org/nowhere", config=raw, runner=cpu_runner, record=False)


def test_record_false_writes_nothing(
    tiny_model_dirs: dict[str, Path], cpu_runner: Callable[..., Any]
) -> None:
    diag = diagnose(tiny_model_dirs["bert"], runner=cpu_runner, record=False)
    assert diag.run_id is None and rows() == []


def test_diagnosis_json_round_trips(
    tiny_model_dirs: dict[str, Path], fault_runner: Callable[..., Any]
) -> None:
    diag = diagnose(
        tiny_model_dirs["bert"], runner=fault_runner("encoder.layer.0.output.LayerNorm", "nan")
    )
    data = json.loads(json.dumps(diag.to_dict()))
    assert data["verdict"] == "verification_failed" and data["metrics"]["has_nan"] is True
    assert data["divergence"]["module"] == "encoder.layer.0.output.LayerNorm", data["divergence"]


# ---- the real simulated device (hfadapt.spyre.runner) ------------------------------------------


def _real_runner() -> Any:
    from hfadapt.spyre import runner

    return runner.run_on_device


@pytest.mark.slow
def test_real_minilm_end_to_end_on_the_simulated_device(minilm_path: Path, tmp_path: Path) -> None:
    _real_runner()
    folder = Path(shutil.copytree(minilm_path, tmp_path / "all-MiniLM-L6-v2"))
    diag = diagnose(folder)
    m = diag.metrics
    print(f"\nall-MiniLM-L6-v2: {diag.verdict}: {diag.reason}")
    print(f"  adapters {diag.adapters}; timings {diag.timings}")
    if diag.report is not None:
        print(f"  report: {diag.report.summary()}")
    # hf-adapters runs it on the card with its adapters: the simulator must agree
    assert diag.verdict == verdicts.PASS, diag.reason
    assert m is not None and m.min_token_cosine is not None and m.min_token_cosine >= 0.99, m
    assert not m.has_nan and not m.has_inf and m.tokens == 560, m
    (row,) = rows()
    assert row.verdict == "pass" and row.model_type == "bert" and row.dtype == "fp16"
    assert row.min_token_cosine == pytest.approx(m.min_token_cosine), row.min_token_cosine
    assert row.mean_token_cosine == pytest.approx(m.mean_token_cosine), row.mean_token_cosine
    assert row.profile_version and row.timings and row.timings["device"] > 0, row.timings
    assert row.adapters and "attention-head-dim-pad" in row.adapters, row.adapters  # head_dim 32
    assert row.violations == [] and row.fallbacks is not None


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["xlm-roberta", "roberta", "mpnet", "distilbert"])
def test_real_device_tiny_architectures(tiny_model_dirs: dict[str, Path], arch: str) -> None:
    """Each architecture gets a verdict whose evidence holds up: a pass has the numbers, a
    refusal has its violations and fingerprints (which one it gets follows the adapters)."""
    _real_runner()
    diag = diagnose(tiny_model_dirs[arch])
    print(f"\ntiny {arch}: {diag.verdict}: {diag.reason}")
    (row,) = rows()
    assert diag.verdict in (verdicts.PASS, verdicts.LOWERING_FAILED), diag.reason
    if diag.verdict == verdicts.PASS:
        assert row.min_token_cosine is not None and row.min_token_cosine >= 0.99, (
            row.min_token_cosine
        )
    else:
        assert row.violations and row.fingerprints and diag.report is not None
        assert all(v.location is not None for v in diag.report.violations)


@pytest.mark.slow
@pytest.mark.parametrize("execution", ["eager", "compile"])
def test_real_device_tiny_bert(tiny_model_dirs: dict[str, Path], execution: str) -> None:
    _real_runner()
    diag = diagnose(tiny_model_dirs["bert"], execution=execution)
    print(f"\ntiny bert, {execution}: {diag.verdict}: {diag.reason}; timings {diag.timings}")
    assert diag.verdict == verdicts.PASS, diag.reason
    assert diag.report is not None and diag.report.mode == execution


@pytest.mark.slow
def test_real_device_stock_mpnet_does_not_lower(tiny_model_dirs: dict[str, Path]) -> None:
    """Without adapters, stock MPNet meets device rules; every violation names its call site."""
    _real_runner()
    diag = diagnose(tiny_model_dirs["mpnet"], adapters=False)
    report = diag.report
    print(f"\nstock mpnet: {diag.verdict}: {diag.reason}")
    assert diag.verdict == verdicts.LOWERING_FAILED, diag.reason
    assert report is not None and report.violations, diag.reason
    assert all(v.location is not None for v in report.violations), [
        str(v) for v in report.violations
    ]
    (row,) = rows()
    assert row.fingerprints == report.fingerprints() and row.adapters == []


@pytest.mark.slow
def test_real_device_fault_is_localized(tiny_model_dirs: dict[str, Path]) -> None:
    """A fault inside one module on the real eager device: hooks read device tensors back."""
    import torch

    run_on_device = _real_runner()
    module = "encoder.layer.1.intermediate.intermediate_act_fn"

    def faulty(model: Any, inputs: Any, **kwargs: Any) -> Any:
        target = model.get_submodule(module)
        stock = target.forward

        def forward(*args: Any, **kw: Any) -> Any:
            out = stock(*args, **kw)
            keep = torch.ones(out.shape[-1], dtype=out.dtype)
            keep[::2] = 0  # built on the host: slicing on the device's stick dim is refused
            return out * keep.to(out.device)

        target.forward = forward
        return run_on_device(model, inputs, **kwargs)

    diag = diagnose(tiny_model_dirs["bert"], runner=faulty, execution="eager")
    d = diag.divergence
    print(f"\n{diag.verdict}: {diag.reason}\n  {d.summary() if d else diag.evidence}")
    assert diag.verdict == verdicts.VERIFICATION_FAILED, diag.reason
    assert d is not None and d.module == module and not d.inputs_drifted, d


def test_hfadapts_own_not_implemented_is_raised_not_the_models_verdict(
    tiny_model_dirs: dict[str, Path],
) -> None:
    """A NotImplementedError raised by hfadapt's own code is hfadapt's limit, not the model's
    `lowering_failed`: it propagates and no run is recorded; one raised by torch or the model
    (outside the hfadapt package) stays the model's verdict."""
    import hfadapt.spyre.compile.graph_exec as own_module

    own = compile(
        "def runner(*a, **k):\n    raise NotImplementedError('call_module node in an ATen graph')\n",
        own_module.__file__ or "",
        "exec",
    )
    scope: dict[str, Any] = {}
    exec(own, scope)

    def foreign(*a: Any, **k: Any) -> None:
        raise NotImplementedError("Could not run 'aten::foo' with arguments from 'spyre'")

    with pytest.raises(NotImplementedError, match="call_module node"):
        diagnose(tiny_model_dirs["bert"], runner=scope["runner"])
    assert rows() == [], [r.verdict for r in rows()]
    diag = diagnose(tiny_model_dirs["bert"], runner=foreign)
    print(diag.verdict, diag.reason)
    assert diag.verdict == verdicts.LOWERING_FAILED and "aten::foo" in diag.reason, diag.reason
