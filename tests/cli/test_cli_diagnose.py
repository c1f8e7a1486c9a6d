"""``hfadapt diagnose``: the rendered report, --json, and exit codes (0 pass, 1 the model
fails, 2 bad input: one line, no traceback)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.judge import phases

# Small models on a shared machine: one torch thread (see conftest.one_thread).
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def device(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], None]:
    """Install a stand-in device runner for the CLI (which always uses the default one)."""

    def install(runner: Any) -> None:
        monkeypatch.setattr(phases, "default_runner", lambda: runner)

    return install


def test_pass_renders_verdict_metrics_and_exits_0(
    tiny_model_dirs: dict[str, Path],
    cpu_runner: Any,
    device: Callable[[Any], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    device(cpu_runner)
    code, out, err = run_cli(["diagnose", str(tiny_model_dirs["bert"])], monkeypatch, capsys)
    print(out)
    assert code == 0, err
    assert ": pass" in out and "min per-token cosine" in out and "(pass >= 0.99)" in out
    assert "next:" in out and "recorded as run 1" in out and "timings:" in out
    # what the run rests on, in one line: packages and the numeric path
    from hfadapt.judge.environment import numeric_path, package_versions

    kernels, dl16 = package_versions()["kernels"], numeric_path()["numeric.dl16"]
    line = next((x for x in out.splitlines() if "; profile " in x), "")
    assert f"kernels {kernels}," in line and f"dl16 {dl16}, amx " in line, (line, out)


def test_json_output(
    tiny_model_dirs: dict[str, Path],
    cpu_runner: Any,
    device: Callable[[Any], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    device(cpu_runner)
    code, out, _ = run_cli(
        [
            "diagnose",
            str(tiny_model_dirs["distilbert"]),
            "--json",
            "--no-adapters",
            "--dtype",
            "bf16",
        ],
        monkeypatch,
        capsys,
    )
    data = json.loads(out)
    assert (
        code == 0
        and data["verdict"] == "pass"
        and data["dtype"] == "bf16"
        and data["adapters"] == []
    )
    assert data["metrics"]["min_token_cosine"] >= 0.99, data["metrics"]
    _check_versions(data["versions"])


def _check_versions(versions: dict[str, str]) -> None:
    """The environment as hfadapt.judge.environment defines it, value by value."""
    from importlib import metadata

    from hfadapt.judge.environment import KEYS, PACKAGES, numeric_path

    print("\nversions: " + json.dumps(versions, indent=1))
    assert list(versions) == list(KEYS), list(versions)
    for key, dist in PACKAGES:
        try:
            installed = metadata.version(dist)
        except metadata.PackageNotFoundError:
            installed = "absent"
        assert versions[key] == installed, (key, versions[key], installed)
    assert versions["kernels"] and versions["sentence-transformers"], versions
    # the numeric path this process has (the stand-in device loaded no kernel: predicted)
    assert {k: versions[k] for k in numeric_path()} == numeric_path(), versions
    assert versions["numeric.dl16"] in ("native", "torch"), versions["numeric.dl16"]
    assert versions["numeric.amx"] in ("tiles", "fp32"), versions["numeric.amx"]
    assert versions["numeric.matmul_precision"] == "highest", versions  # the run pins it


def test_failing_model_shows_the_divergent_module_and_exits_1(
    tiny_model_dirs: dict[str, Path],
    fault_runner: Any,
    device: Callable[[Any], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    module = "encoder.layer.1.intermediate.intermediate_act_fn"
    device(fault_runner(module))
    code, out, err = run_cli(["diagnose", str(tiny_model_dirs["bert"])], monkeypatch, capsys)
    print(out)
    assert code == 1, err
    assert (
        "verification_failed" in out and f"first divergent module: {module} (GELUActivation)" in out
    )


def test_violations_are_listed_with_source_lines(
    tiny_model_dirs: dict[str, Path],
    device: Callable[[Any], None],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hfadapt.errors import SpyreLoweringError
    from hfadapt.spyre.rules.lowering_report import LoweringReport, SourceLocation, Violation

    report = LoweringReport("spyre-2026.07", "2026.07.1", "compile")
    report.add(
        Violation(
            "op.pow_non_square",
            "aten::pow.Tensor_Scalar",
            "Unsupported: pow exponent 3.0",
            location=SourceLocation(
                "/s/site-packages/transformers/activations.py",
                57,
                "forward",
                "return torch.pow(x, 3.0)",
            ),
        )
    )

    def runner(*a: Any, **k: Any) -> Any:
        raise SpyreLoweringError("1 violation(s)", report)

    device(runner)
    code, out, _ = run_cli(
        ["diagnose", str(tiny_model_dirs["bert"]), "--compile"], monkeypatch, capsys
    )
    print(out)
    assert code == 1 and "lowering_failed" in out
    assert "transformers/activations.py:57 in forward" in out and "return torch.pow(x, 3.0)" in out


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("missing", "error: no such folder: "),
        ("empty", "is an empty folder"),
        ("no model_type", "has no model_type"),
        ("corrupt", "is corrupt"),
        ("hub offline", "is not in the HF cache"),
        (
            "bad mode",
            "Invalid value for '--mode': Value error, 'fast' is not one of 'full', 'structural'",
        ),
        ("read-only db", "is read-only"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tiny_bert: Path,
    tmp_path: Path,
    setup: str,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["diagnose", str(tiny_bert)]
    if setup == "missing":
        args = ["diagnose", str(tmp_path / "missing")]
    elif setup == "empty":
        (tmp_path / "empty").mkdir()
        args = ["diagnose", str(tmp_path / "empty")]
    elif setup == "no model_type":
        cfg = json.loads((tiny_bert / "config.json").read_text())
        del cfg["model_type"]
        (tiny_bert / "config.json").write_text(json.dumps(cfg))
    elif setup == "corrupt":
        (tiny_bert / "model.safetensors").write_bytes(b"garbage")
    elif setup == "hub offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        args = ["diagnose", "acme/not-cached"]
    elif setup == "read-only db":
        db = tmp_path / "ro.db"
        db.write_bytes(b"")
        db.chmod(0o444)
        args += ["--db", str(db)]
    else:
        args += ["--mode", "fast"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    print(err)
    assert code == 2, (out, err)
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert out == ""


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("", "error: MODEL is empty"),
        ("   ", "error: MODEL is empty"),
        ("/etc", "error: /etc is not a model folder: no config.json and no weights in it"),
        ("☃☃/ü💥", "error: ☃☃/ü💥 is neither a folder nor a Hub model id"),
    ],
)
def test_not_a_model_is_exit_2_and_stores_nothing(
    model: str,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hfadapt.db.engine import get_engine, session
    from hfadapt.db.tables import Run

    db = tmp_path / "runs.db"
    get_engine(str(db)).dispose()
    code, out, err = run_cli(["diagnose", model, "--db", str(db)], monkeypatch, capsys)
    assert (code, out, err.count("\n")) == (2, "", 1), (code, out, err)
    assert err.startswith(expected), err
    with session(get_engine(str(db)), write=False) as sess:
        stored = sess.query(Run).count()
    assert stored == 0, f"{stored} run row(s) stored for {model!r}"


def test_the_caches_a_run_used_are_one_line_and_no_cache_skips_both(
    tiny_bert: Path,
    cpu_runner: Any,
    device: Callable[[Any], None],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    device(cpu_runner)  # a stand-in device: it compiles nothing, so the compile cache is unused
    monkeypatch.setenv("HFADAPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HFADAPT_REFERENCE_CACHE", "1")
    monkeypatch.setenv("HFADAPT_COMPILE_CACHE", "1")
    folder = tmp_path / "cache" / "reference"

    def entries() -> list[str]:
        return sorted(p.name for p in folder.glob("*.safetensors")) if folder.is_dir() else []

    code, out, err = run_cli(
        ["diagnose", str(tiny_bert), "--no-cache", "--json"], monkeypatch, capsys
    )
    skipped = json.loads(out)
    assert code == 0 and skipped["verdict"] == "pass", err
    assert skipped["evidence"]["caches"] == {"reference": "off", "compile": "off", "skipped": True}
    assert entries() == [], "--no-cache wrote a reference"
    lines = []
    for args in ([], [], ["--no-cache"]):
        code, out, err = run_cli(["diagnose", str(tiny_bert), *args], monkeypatch, capsys)
        assert code == 0, err
        lines += [line.strip() for line in out.splitlines() if line.strip().startswith("caches:")]
    (entry,) = entries()
    key = entry[:12]
    assert lines == [
        f"caches: reference computed, entry {key}; compile unused",
        f"caches: reference read from entry {key}; compile unused",
        "caches: skipped for this run (--no-cache)",
    ], lines
    code, out, _ = run_cli(["diagnose", str(tiny_bert), "--json"], monkeypatch, capsys)
    warm = json.loads(out)
    print("\n" + "\n".join(lines))
    assert warm["evidence"]["caches"]["reference"] == f"hit:{key}", warm["evidence"]["caches"]
    assert warm["metrics"] == skipped["metrics"], (warm["metrics"], skipped["metrics"])
