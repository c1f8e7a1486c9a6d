"""Graph adapters are proven before they run: a graph folder this machine did
not accept or re-prove (copied into another hfadapt home, edited by one byte) is refused at
load with a one-line reason, until ``hfadapt adapters verify NAME`` proves it; the record is a
keyed signature kept in $HFADAPT_HOME, not a checksum beside the data. Discovery does not parse
graphs (``adapters list`` stays fast with a 20,000-node graph), and ``adapters verify`` proves
against the baseline the adapter was accepted on (``--without-adapter``)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.cli_runner import run_cli
from support.drafting import softsign_case, source
from support.hostile_graphs import files_of, good_graph, slow_graph

from hfadapt.adapters.graph_adapter import graph_digest, not_proven_reason
from hfadapt.adapters.registry import discover, user_adapters_dir
from hfadapt.agent import evalcases as ec
from hfadapt.agent.accept import accept_draft
from hfadapt.agent.sandbox import SandboxRun, StepReport
from hfadapt.agent.validate import validate
from hfadapt.graphs.proven import KEY_FILE, RECORD_FILE, is_proven, record_proven

CODE = source("    return x * torch.reciprocal(1.0 + x.abs())")


def _accept(monkeypatch: pytest.MonkeyPatch, case_changes: dict[str, object] | None = None) -> Path:
    """A softsign graph proven and accepted into $HFADAPT_HOME/adapters (the sandbox's part
    replaced by the graph it would hand back)."""

    def sandbox(*a: object, **k: object) -> SandboxRun:
        steps = [
            StepReport("load", "pass", "ok"),
            StepReport("capture", "pass", "ok", {"reads": []}),
        ]
        return SandboxRun(steps, 0, files=files_of(good_graph()))

    monkeypatch.setattr("hfadapt.agent.validate.run_sandbox", sandbox)
    case = softsign_case()
    for k, v in (case_changes or {}).items():
        setattr(case, k, v)
    v = validate(CODE, case)
    assert v.accepted, [(s.step, s.status, s.summary) for s in v.steps]
    return accept_draft(
        CODE, case, v, endpoint_model="scripted-model", endpoint="http://127.0.0.1:1", attempt_id=1
    )


def _names() -> set[str]:
    return {a.name for a in discover(bundled=False, entry_points=False).adapters}


def _errors() -> list[str]:
    return [e.error for e in discover(bundled=False, entry_points=False).errors]


def _softsign_applies(name: str) -> bool:
    reg = discover(bundled=False, entry_points=False)
    module, _, _ = ec.softsign_example(0)
    with reg.apply(module, only=[name]) as handle:
        return name in handle.applied


@pytest.mark.usefixtures("proofs_in_process")
def test_an_accepted_graph_is_recorded_with_a_private_key_and_applies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = _accept(monkeypatch)
    home = user_adapters_dir().parent
    key = home / KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600, oct(key.stat().st_mode)
    record = json.loads((home / RECORD_FILE).read_text())
    assert len(record) == 1 and next(iter(record.values()))["name"] == path.name, record
    assert path.parent == user_adapters_dir() and is_proven(path)
    assert path.name in _names() and _softsign_applies(path.name)


def test_a_copied_folder_is_refused_until_adapters_verify_proves_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = _accept(monkeypatch)
    name = path.name
    elsewhere = tmp_path / "colleague-home"
    monkeypatch.setenv("HFADAPT_HOME", str(elsewhere))  # another machine's hfadapt home
    shutil.copytree(path, user_adapters_dir() / name)
    assert name not in _names()
    assert not_proven_reason(name) in _errors(), _errors()
    assert not_proven_reason(name) == (
        f"graph adapter {name} is not proven on this machine: run hfadapt adapters verify {name}"
    )
    code, out, err = run_cli(["adapters", "verify", name], monkeypatch, capsys)
    assert code == 0, out + err
    assert "1 adapter re-proven: 1 ok" in err, err
    assert name in _names() and _softsign_applies(name)
    assert not _errors(), _errors()


def test_a_hand_edited_folder_is_refused_even_with_its_old_record(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _accept(monkeypatch)
    name = path.name
    source_file = path / "draft-source.txt"
    data = bytearray(source_file.read_bytes())
    data[-2] ^= 0x01  # one byte, in the text people read (the graph's digest still matches)
    source_file.write_bytes(bytes(data))
    assert name not in _names() and not_proven_reason(name) in _errors(), _errors()
    # a manifest edit with a recomputed graph digest: still refused
    manifest = json.loads((path / "adapter.json").read_text())
    manifest["graph_sha256"] = graph_digest(path)
    manifest["description"] = "edited by hand"
    (path / "adapter.json").write_text(json.dumps(manifest))
    assert name not in _names() and not_proven_reason(name) in _errors(), _errors()
    code, out, err = run_cli(["adapters", "verify", name], monkeypatch, capsys)
    assert code == 0, out + err
    assert name in _names()


@pytest.mark.usefixtures("proofs_in_process")
def test_a_record_made_with_another_key_does_not_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = _accept(monkeypatch)
    home = user_adapters_dir().parent
    (home / KEY_FILE).unlink()  # a new key: the old signatures prove nothing
    assert path.name not in _names()
    record_proven(path, path.name, "test")
    assert path.name in _names()


def _big_graph_folder(monkeypatch: pytest.MonkeyPatch) -> Path:
    path = _accept(monkeypatch)
    big = files_of(slow_graph(19_990))
    assert len(json.loads(big["graph.json"])["nodes"]) == 19_994
    (path / "graph.json").write_bytes(big["graph.json"])
    manifest = json.loads((path / "adapter.json").read_text())
    manifest["graph_sha256"] = graph_digest(path)
    (path / "adapter.json").write_text(json.dumps(manifest))
    record_proven(path, path.name, "test")  # as if verified here
    return path


@pytest.mark.usefixtures("proofs_in_process")
def test_adapters_list_with_a_20000_node_graph_is_fast(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _big_graph_folder(monkeypatch)
    run_cli(["adapters", "list"], monkeypatch, capsys)  # imports warm
    start = time.perf_counter()
    code, out, err = run_cli(["adapters", "list", "--json"], monkeypatch, capsys)
    seconds = time.perf_counter() - start
    assert code == 0, err
    listed = json.loads(out)
    assert path.name in [a["name"] for a in listed["adapters"]], listed
    print(f"adapters list with a 19,994-node graph: {seconds * 1000:.0f} ms in process")
    assert seconds < 1.0, f"adapters list took {seconds:.2f} s"
    # the whole command, a fresh process (imports included)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "hfadapt", "adapters", "list", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=120,
        check=False,
    )
    whole = time.perf_counter() - start
    assert done.returncode == 0, done.stderr[-2000:]
    assert path.name in done.stdout
    print(f"hfadapt adapters list (a fresh process): {whole:.2f} s")
    assert whole < 30, f"{whole:.1f} s"


@pytest.mark.usefixtures("proofs_in_process")
def test_the_graph_is_parsed_on_first_apply_not_at_discovery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = _accept(monkeypatch)
    reg = discover(bundled=False, entry_points=False)
    a = reg.get(path.name)
    assert not a.fn.prepared  # type: ignore[attr-defined]
    module, _args, _ = ec.softsign_example(0)
    with reg.apply(module, only=[path.name], device="spyre") as handle:
        assert a.fn.prepared and handle.names == [path.name]  # type: ignore[attr-defined]


def test_verify_proves_against_the_baseline_the_adapter_was_accepted_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Accepted with the default registry, one bundled adapter left out (--without-adapter):
    verify leaves the same adapter out, and the adapter itself is no part of the baseline."""
    bundled = sorted(a.name for a in discover(paths=[], entry_points=False).adapters)
    assert bundled, "no bundled adapter to leave out"
    path = _accept(monkeypatch, {"registry": "default", "without_adapters": [bundled[0]]})
    manifest = json.loads((path / "adapter.json").read_text())
    assert manifest["case"]["without_adapters"] == [bundled[0]]
    accepted_device = manifest["provenance"]["evidence"]["device"]
    code, out, err = run_cli(["adapters", "verify", path.name, "--json"], monkeypatch, capsys)
    assert code == 0, out + err
    (result,) = json.loads(out)
    device = next(s for s in result["steps"] if s["step"] == "device")
    assert device["status"] == "pass", device
    assert device["summary"] == accepted_device, (device["summary"], accepted_device)
