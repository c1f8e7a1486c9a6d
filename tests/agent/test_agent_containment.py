"""Containment, each attack a regression test. Drafted Python runs only inside the bubblewrap
sandbox and leaves it only as a graph of ATen ops, which the parent validates and proves: code
that slips past every in-process fence stays inside (sentinel files, a loopback listener, a
process scan, probes of the kernel interfaces), payloads hidden where the allowlist never looked
(annotations, an async generator's frame, a coding cookie in the endpoint's own answer, process-
wide rebinding) never run in the parent or a user's process, secrets never reach the sandbox or
the endpoint, and the registry never runs drafted Python, stale bytecode or a tampered graph."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli
from support.drafting import (
    GELU_BODY,
    GOOD,
    HEAD,
    TINY_GELU_BERT,
    draft,
    gelu_draft,
    rows,
    run,
    softsign_case,
    source,
)
from support.openai_server import (
    ScriptedOpenAI,
    openai_server_fixture,  # noqa: F401
    reply,
)

from hfadapt import isolation
from hfadapt.adapters.registry import AGENT_MARKER, Registry, user_adapters_dir
from hfadapt.agent.loop import ACCEPTED
from hfadapt.agent.sandbox import run_sandbox

KEY = "sk-live-CONTAINMENT-7777"
HF_TOKEN = "hf_ContainmentTokenAbcdefghijklmnopqrstuv"
# the sandboxed worker imports this test module by name, and it imports tests/support
HERE = Path(__file__).resolve()
TESTS = os.pathsep.join([str(HERE.parent), str(HERE.parents[1])])
SOLUTION = GOOD.split("```python\n")[1].split("```")[0]
# Sentinels live where a sandboxed process could only reach by escaping: /var/tmp on the host.
SENTINELS = Path("/var/tmp") / f"hfadapt-containment-{os.getpid()}"
ORPHAN = "hfadapt-containment-orphan"

needs_bwrap = pytest.mark.skipif(
    isolation.unavailable_reason() is not None,
    reason=f"no OS isolation here: {isolation.unavailable_reason()}",
)
pytestmark = pytest.mark.containment


def hostile_example(seed: int) -> Any:
    """Runs inside the sandbox as example code would, and tries every way out through calls
    that raise no audit event (libc via ctypes, a shell, torch.from_file), then probes the
    kernel interfaces the sandbox closes; what it saw goes to standard error as one JSON line."""
    import ctypes
    import errno

    import torch

    from hfadapt.agent.evalcases import softsign_example

    plan = json.loads(os.environ["HFADAPT_TEST_PLAN"])
    libc = ctypes.CDLL(None, use_errno=True)
    shell = "; ".join(
        [
            f"echo pwned > {plan['dir']}/written",
            f"mkdir {plan['dir']}/made",
            f"ln -s / {plan['dir']}/link",
            f"echo 'import os' > {plan['adapters']}/planted.py",
            f"(setsid sh -c 'sleep 120' {ORPHAN} &)",
            f"{plan['python']} -c \"import socket; socket.create_connection(('127.0.0.1', "
            f'{plan["port"]}), timeout=2)" 2> /tmp/net.txt',
        ]
    )
    libc.system(shell.encode())
    seen: dict[str, Any] = {}
    try:
        torch.from_file(f"{plan['dir']}/from_file", shared=True, size=16)
    except Exception as exc:
        seen["from_file"] = repr(exc)
    seen["net"] = Path("/tmp/net.txt").read_text()[-300:] if Path("/tmp/net.txt").exists() else ""
    seen["proc"] = []
    for pid in ("1", str(os.getppid()), str(plan["host_pid"]), "self"):
        for part in ("environ", "cmdline"):
            try:
                text = Path(f"/proc/{pid}/{part}").read_bytes().decode(errors="replace")
                # a secret anywhere in it is the finding; the rest is cut to keep the line short
                hits = [i for i, s in enumerate(plan["secrets"]) if s[::-1] in text]
                seen["proc"].append(f"{pid}/{part}: read, secrets {hits}")
            except OSError as exc:
                seen["proc"].append(f"{pid}/{part}: {exc}")
    seen["unshare_user"] = libc.unshare(0x10000000) == 0 or ctypes.get_errno()
    seen["ptrace"] = libc.ptrace(0, 0, 0, 0) == 0 or ctypes.get_errno()
    written = 0
    try:  # files of 32 MB (one file may not pass 64 MB), until the tmpfs is full
        for n in range(64):
            with open(f"/tmp/fill{n}", "wb") as fh:
                for _ in range(32):
                    fh.write(b"\0" * (1 << 20))
                    written += 1 << 20
    except OSError as exc:
        seen["fill_error"] = errno.errorcode.get(exc.errno or 0, str(exc))
    seen["fill_mb"] = written >> 20
    for n in range(64):
        Path(f"/tmp/fill{n}").unlink(missing_ok=True)
    seen["root"] = sorted(os.listdir("/"))
    seen["etc"] = sorted(os.listdir("/etc"))
    try:
        seen["token"] = Path(plan["token_file"]).read_text()
    except OSError as exc:
        seen["token"] = f"unreadable: {type(exc).__name__}"
    seen["env_secrets"] = [
        i for i, s in enumerate(plan["secrets"]) if s[::-1] in json.dumps(dict(os.environ))
    ]
    seen["hf_home"] = os.environ.get("HF_HOME", "")
    print("SEEN " + json.dumps(seen), file=sys.stderr, flush=True)
    return softsign_example(seed)


def _orphans() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if ORPHAN.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture
def hf_token(isolated_state: Path) -> Path:
    """A Hugging Face login in the test's HF home: the token file, and HF_TOKEN set."""
    token = isolated_state / "token"
    token.parent.mkdir(parents=True, exist_ok=True)
    token.write_text(HF_TOKEN)
    (isolated_state / "stored_tokens").write_text(f"[main]\nhf_token = {HF_TOKEN}\n")
    return token


@needs_bwrap
def test_code_past_every_in_process_fence_stays_inside_the_sandbox(
    monkeypatch: pytest.MonkeyPatch, hf_token: Path
) -> None:
    monkeypatch.setenv("PYTHONPATH", TESTS)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    SENTINELS.mkdir(exist_ok=True)
    adapters = user_adapters_dir()
    adapters.mkdir(parents=True, exist_ok=True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    plan = {
        "dir": str(SENTINELS),
        "adapters": str(adapters),
        "port": listener.getsockname()[1],
        "host_pid": os.getpid(),
        "python": os.path.realpath(sys.executable),
        "token_file": str(hf_token),
        "secrets": [
            KEY[::-1],
            HF_TOKEN[::-1],
        ],  # reversed: the plan itself is in the sandbox's environment
    }
    monkeypatch.setattr(isolation, "ENV_ALLOWLIST", (*isolation.ENV_ALLOWLIST, "HFADAPT_TEST_PLAN"))
    monkeypatch.setenv("HFADAPT_TEST_PLAN", json.dumps(plan))
    case = softsign_case()
    case.example = "test_agent_containment:hostile_example"
    try:
        sandbox = run_sandbox(
            SOLUTION, {"case": case.to_dict(), "steps": ["load", "capture"]}, secrets=[KEY]
        )
        assert sandbox.isolated
        assert [(s.step, s.status) for s in sandbox.steps] == [
            ("load", "pass"),
            ("capture", "pass"),
        ], sandbox.stderr_tail
        line = next(ln for ln in sandbox.stderr_tail.splitlines() if ln.startswith("SEEN "))
        seen = json.loads(line[5:])
        escaped = sorted(p.name for p in SENTINELS.iterdir())
        assert escaped == [], f"written outside the sandbox: {escaped}"
        assert not (adapters / "planted.py").exists(), "a file was planted in the adapters folder"
        with pytest.raises(BlockingIOError):
            conn, _ = listener.accept()
            conn.close()
        assert "Network is unreachable" in seen["net"] or "Errno" in seen["net"], seen["net"]
        assert (
            "Read-only file system" in seen["from_file"] or "No such file" in seen["from_file"]
        ), seen["from_file"]
        everything = json.dumps(seen)
        for secret in (KEY, HF_TOKEN):
            assert secret not in everything, (
                f"a secret was readable in the sandbox: {secret[:6]}..."
            )
        assert seen["token"].startswith("unreadable"), seen["token"]
        assert f"{plan['host_pid']}/environ: [Errno 2]" in seen["proc"][4], seen["proc"]
        assert all("secrets []" in p or "Errno" in p for p in seen["proc"]), seen["proc"]
        assert seen["unshare_user"] == 1 and seen["ptrace"] == 1, (
            f"nested user namespace {seen['unshare_user']}, ptrace {seen['ptrace']} (1 = EPERM)"
        )
        assert seen["fill_error"] == "ENOSPC" and seen["fill_mb"] <= 512, (
            f"/tmp took {seen['fill_mb']} MB ({seen.get('fill_error')}); the cap is 512 MB"
        )
        assert not {"home", "var", "srv", "mnt", "boot"} & set(seen["root"]), seen["root"]
        assert "shadow" not in seen["etc"] and "ssh" not in seen["etc"], seen["etc"]
        assert seen["hf_home"].startswith("/tmp/") and seen["env_secrets"] == [], seen
        survivors = _orphans()
        for _ in range(50):  # the PID namespace dies with the sandbox; the kill is asynchronous
            if not survivors:
                break
            time.sleep(0.2)
            survivors = _orphans()
        assert survivors == [], f"processes outlived the sandbox: {survivors}"
    finally:
        listener.close()
        for pid in _orphans():
            os.kill(pid, 9)
        for p in sorted(SENTINELS.glob("*"), reverse=True):
            p.unlink() if p.is_symlink() or p.is_file() else p.rmdir()
        SENTINELS.rmdir()


# -- hostile drafts through `hfadapt draft`: payloads the allowlist never saw ---------------------


def _sentinel_payload(path: Path) -> str:
    """Python that creates ``path`` when it runs anywhere but the sandbox."""
    return f"(__import__('os').environ.get('HFADAPT_SANDBOX') or open({str(path)!r}, 'w').close())"


@pytest.mark.slow
@needs_bwrap
def test_payloads_the_allowlist_never_saw_run_only_inside_the_sandbox(
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    hf_token: Path,
) -> None:
    """One `hfadapt draft` session against a hostile endpoint: process-wide rebinding through a
    pre-hook, the HF token read and raised into the feedback, then a right rewrite carrying
    payloads in its annotations and an async generator's frame, answered under a model name
    that is a PEP 263 coding cookie. Before the graph design each of these reached the parent
    (the accepted file was imported by `draft`, `adapters list` and `hfadapt.load`)."""
    import torch

    folder = tmp_path / "tiny-gelu-bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_GELU_BERT))
    home = tmp_path / "home"
    monkeypatch.setenv("HFADAPT_HOME", str(home))
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    annotated, framed, at_load = (
        tmp_path / "annotation-ran",
        tmp_path / "frame-ran",
        tmp_path / "load-ran",
    )
    rebind = gelu_draft(
        body="    torch.pow = lambda x, y: x\n    return None",
        kind="pre_hook",
        args="module, args, kwargs",
        name="gelu-rebind",
    )
    leak = gelu_draft(
        args=(
            "self, input: (_ for _ in ()).throw(RuntimeError("
            f"__import__('pathlib').Path({str(hf_token)!r}).read_text() + "
            "__import__('os').environ.get('HF_TOKEN', 'no HF_TOKEN')))"
        ),
        name="gelu-leak",
    )
    rebind_method = gelu_draft(
        body="    torch.pow = lambda x, y: x\n" + GELU_BODY, name="gelu-rebind2"
    )
    frame_payload = (
        "    async def _g():\n        yield\n\n"
        f"    _g().ag_frame.f_builtins['exec'](\"{_sentinel_payload(framed)}\")\n"
    )
    hostile = gelu_draft(
        body=frame_payload + GELU_BODY,
        args=f"self, input: {_sentinel_payload(annotated)} = None",
        name="gelu-agent",
    )
    openai_server.script = [
        rebind,
        rebind_method,
        leak,
        {"body": reply(hostile, model="x -*- coding: utf-7 -*-")},
    ]
    pow_before = torch.pow
    db = str(tmp_path / "runs.db")
    args = [
        "draft",
        str(folder),
        "--mode",
        "structural",
        "--without-adapter",
        "gelu-new-cube",
        "--base-url",
        openai_server.url,
    ]
    args += [
        "--model",
        "scripted-model",
        "--api-key",
        KEY,
        "--max-attempts",
        "4",
        "--db",
        db,
        "--json",
    ]
    code, out, err = run_cli(args, monkeypatch, capsys)
    outcomes = json.loads(out)
    # the registry's other adapters apply (judged compiled, a failing mask would hide gelu's):
    # gelu's is the one failure, fixed at the fourth attempt, so draft exits 0
    (outcome,) = outcomes
    assert code == 0, (code, out[-2000:], err[-2000:])
    steps = outcome["steps"]
    assert outcome["outcome"] == ACCEPTED, outcome
    # the pre-hook: refused as it loads, in the sandbox; rebinding torch.pow: refused with the
    # reason; the token read: an error in the sandbox (no token there); then the hostile one
    assert [list(s.items())[-1] for s in steps[:3]] == [
        ("load", "fail"),
        ("capture", "fail"),
        ("load", "fail"),
    ], steps
    assert all(v == "pass" for v in steps[3].values()), steps
    assert "rebinds torch.pow" in json.dumps(openai_server.requests[2]["json"]), (
        "no reason fed back"
    )
    assert torch.pow is pow_before, "the draft rebound torch.pow in the parent"
    for sentinel in (annotated, framed, at_load):
        assert not sentinel.exists(), f"{sentinel.name}: drafted code ran outside the sandbox"
    # the secrets went nowhere: not to the endpoint in the repair prompt, not into runs.db
    sent = json.dumps([r["json"] for r in openai_server.requests])  # the key is in the headers only
    for secret in (HF_TOKEN, KEY):
        at = sent.find(secret)
        assert at < 0, f"a secret went back to the endpoint: ...{sent[max(0, at - 300) : at + 40]}"
    assert "FileNotFoundError" in sent or "No such file" in sent, sent[-2000:]
    assert (
        HF_TOKEN.encode() not in Path(db).read_bytes() and KEY.encode() not in Path(db).read_bytes()
    )
    # accepted as a graph; the endpoint's name for itself was not written through
    path = Path(outcome["adapter_path"])
    assert path.parent == home / "adapters" and not list(path.rglob("*.py")), list(path.iterdir())
    manifest = json.loads((path / "adapter.json").read_text())
    assert manifest["provenance"]["endpoint_model"] == "scripted-model", manifest["provenance"]
    assert "coding" not in (path / "adapter.json").read_text()
    # a user's process lists and applies it without running any of the drafted Python
    probe = (
        "import torch, hfadapt, json, sys\n"
        "from hfadapt.adapters.registry import default_registry\n"
        "reg = default_registry()\n"
        "a = reg.get('gelu-agent')\n"
        "from transformers.activations import NewGELUActivation\n"
        "m = NewGELUActivation()\n"
        "x = torch.randn(2, 5, 64)\n"
        "ref = m(x)\n"
        "from hfadapt.adapters.registry import Registry\n"
        "Registry(adapters=[a]).apply(m)\n"
        "print(json.dumps({'form': a.form, 'err': float((m(x) - ref).abs().max()), "
        "'pow': torch.pow(torch.tensor(2.0), 3).item()}))\n"
    )
    env = {**os.environ, "HFADAPT_HOME": str(home)}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["form"] == "graph" and seen["err"] < 1e-5 and seen["pow"] == 8.0, seen
    code, out, err = run_cli(["adapters", "list", "--json"], monkeypatch, capsys)
    assert code == 0 and "gelu-agent" in out, (out, err)
    for sentinel in (annotated, framed, at_load):
        assert not sentinel.exists(), f"{sentinel.name}: drafted code ran in a user's process"


# -- proofs that prove: cheats fail, or are frozen out of what users run ---------------------------


@pytest.mark.slow
@needs_bwrap
@pytest.mark.usefixtures("proofs_in_process")
def test_cheats_fail_with_numbers_or_are_frozen_out_of_the_graph(
    openai_server: ScriptedOpenAI, tmp_path: Path, spyre: object
) -> None:
    softsign = "x * torch.reciprocal(1.0 + x.abs())"
    openai_server.script = [
        draft(f"    return 100.0 * {softsign}", name="scaled"),
        draft(
            f"    if x.shape[-2] > 300:\n        return torch.zeros_like(x)\n    return {softsign}",
            name="sized",
        ),
        draft(
            f"    if x.dtype == torch.float16:\n        return x * 0.5\n    return {softsign}",
            name="typed",
        ),
        draft(
            "    return (x.cpu() * torch.reciprocal(1.0 + x.cpu().abs())).to(x.device)",
            name="hosted",
        ),
        draft(
            f"    if torch.get_num_threads() > 1:\n        return x\n    return {softsign}",
            name="threads",
        ),
        # the device a tensor is on is Python state too: the graph keeps the branch it was made on
        draft(
            f"    if x.device.type == 'spyre':\n        return x\n    return {softsign}",
            name="switched",
        ),
    ]
    outcome, _ = run(openai_server.url, tmp_path, attempts=6)
    feedback = [a.feedback for a in outcome.attempts]
    assert outcome.outcome == ACCEPTED, (outcome.reason, feedback)
    failed = [a.failed_step for a in outcome.attempts]
    assert failed == ["equivalence", "equivalence", "capture", "device", "capture", None], feedback
    assert "max abs err" in feedback[0] and "NOT equivalent" in feedback[0], feedback[0]
    assert "size-dependent graph" in feedback[1] and "length at most 300" in feedback[1], feedback[
        1
    ]
    assert "branches on the dtype" in feedback[2], feedback[2]
    assert "runs on the host" in feedback[3], feedback[3]
    assert "reads state a graph cannot hold" in feedback[4], feedback[4]
    # The accepted "switched" draft: what users run is the graph, which has no branch at all.
    import torch

    from hfadapt.adapters.graph_adapter import load_graph_adapter
    from hfadapt.adapters.registry import Registry
    from hfadapt.agent.evalcases import Softsign

    assert outcome.adapter_path is not None
    a = load_graph_adapter(outcome.adapter_path)
    module = Softsign()
    Registry(adapters=[a]).apply(module)  # enabled: the graph runs on the CPU too
    x = torch.randn(4, 9, 64)
    for _ in range(5):
        got = module(x)
    err = float((got - Softsign()(x)).abs().max())
    assert err < 1e-6 and a.fn.runs == 5, f"graph vs stock {err}, graph runs {a.fn.runs}"  # type: ignore[attr-defined]
    on_device = module.to("spyre")
    dev = on_device(x.half().to("spyre")).cpu().float()
    cos = torch.nn.functional.cosine_similarity(dev, Softsign()(x), dim=-1).min()
    assert float(cos) > 0.99, f"on the device the frozen graph gives min cosine {float(cos)}"


# -- the registry: drafted Python, bytecode caches, tampered graphs, hostile artifacts -------------


def test_drafted_python_is_never_imported_even_if_it_passes_every_old_rule(tmp_path: Path) -> None:
    folder = user_adapters_dir()
    folder.mkdir(parents=True, exist_ok=True)
    sentinel = tmp_path / "imported"
    body = source("    return x", head=HEAD)
    (folder / "old_accepted.py").write_text(f"{AGENT_MARKER}\n{body}open({str(sentinel)!r}, 'w')\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "marked.py").write_text(f"{body}\n{AGENT_MARKER}\nopen({str(sentinel)!r}, 'w')\n")
    reg = Registry()
    reg.load_folder(folder, "user")
    reg.load_folder(elsewhere, "user")
    assert not reg.adapters and not sentinel.exists(), "drafted Python was imported"
    assert all("drafted Python is never imported" in e.error for e in reg.errors), reg.errors


def test_adapter_files_run_from_their_checked_text_never_a_bytecode_cache_or_a_cookie(
    tmp_path: Path,
) -> None:
    import importlib.util
    import py_compile

    good = "from hfadapt.adapters.api import adapter\n\n@adapter(name='cached', target='hfadapt.agent.evalcases:Softsign.forward', rule='r')\ndef forward(self, x):\n    return x\n"
    evil = good.replace("return x", "return x * 0")
    path = tmp_path / "cached.py"
    path.write_text(evil)
    pyc = Path(importlib.util.cache_from_source(str(path)))
    py_compile.compile(str(path), cfile=str(pyc))
    os.utime(pyc, (time.time() + 3600, time.time() + 3600))
    path.write_text(good)
    os.utime(
        path, (time.time() - 3600, time.time() - 3600)
    )  # the cache looks newer than the source
    cookie = tmp_path / "cookie.py"
    cookie.write_bytes(
        b"# x -*- coding: utf-7 -*-\n"
        + good.replace("'cached'", "'cookie'").encode()
        + b"# +AAo-FORWARD_CHANGED = 1\n"
    )
    reg = Registry()
    reg.load_folder(tmp_path, "user")
    assert sorted(a.name for a in reg.adapters) == ["cached", "cookie"], reg.errors
    import torch

    x = torch.ones(2, 3)
    assert torch.equal(reg.get("cached").fn(None, x), x), (
        "the stale bytecode ran, not the checked source"
    )
    loaded = sys.modules[next(k for k in sys.modules if k.startswith("hfadapt_adapters.cookie_"))]
    assert not hasattr(loaded, "FORWARD_CHANGED"), "the coding cookie turned a comment into code"


def _accepted_graph(tmp_path: Path) -> Path:
    """An accepted graph adapter folder, made by the real acceptance path from a right draft."""
    from hfadapt.agent.accept import accept_draft
    from hfadapt.agent.validate import validate

    case = softsign_case()
    validation = validate(SOLUTION, case)
    assert validation.accepted, validation.feedback()
    return accept_draft(
        SOLUTION,
        case,
        validation,
        endpoint_model="m",
        endpoint="e",
        attempt_id=1,
        folder=tmp_path / "adapters",
        reload=False,
    )


@needs_bwrap
def test_a_tampered_or_hostile_graph_is_refused_and_nothing_in_it_runs(tmp_path: Path) -> None:
    from hfadapt.adapters.graph_adapter import load_graph_adapter
    from hfadapt.errors import AdapterError, GraphError

    folder = _accepted_graph(tmp_path)
    load_graph_adapter(folder)  # as accepted: fine
    graph = json.loads((folder / "graph.json").read_text())
    original = (folder / "graph.json").read_text()

    def refused(new_graph: dict[str, Any] | str, match: str) -> None:
        text = new_graph if isinstance(new_graph, str) else json.dumps(new_graph)
        (folder / "graph.json").write_text(text)
        manifest = json.loads((folder / "adapter.json").read_text())
        from hfadapt.adapters.graph_adapter import graph_digest

        manifest["graph_sha256"] = graph_digest(folder)  # as if hfadapt had written it
        (folder / "adapter.json").write_text(json.dumps(manifest))
        with pytest.raises((AdapterError, GraphError), match=match):
            load_graph_adapter(folder)

    (folder / "graph.json").write_text(original.replace("reciprocal", "neg"))
    with pytest.raises(AdapterError, match="changed since hfadapt wrote them"):
        load_graph_adapter(folder)
    for op, match in [
        ("builtins.eval", "not an ATen op name"),
        ("aten::_local_scalar_dense.default", "not in hfadapt's allowlist"),
        ("aten::add_.Tensor", "not in hfadapt's allowlist"),
        ("aten::bernoulli.p", "not in hfadapt's allowlist"),
        ("hfadapt::host.default", "not an ATen op name"),
    ]:
        bad = json.loads(original)
        bad["nodes"][0]["op"] = op
        refused(bad, match)
    dropout = json.loads(original)
    x = {"ref": 0}
    dropout["nodes"][0] = {
        "op": "aten::scaled_dot_product_attention.default",
        "args": [x, x, x, None, {"f": 0.5}],
        "kwargs": {},
    }
    refused(dropout, "dropout 0.5: a graph must be deterministic")
    forward = json.loads(original)
    forward["nodes"][0]["args"] = [{"ref": len(graph["inputs"]) + 3}]
    refused(forward, "does not point at an earlier value")
    refused("[" * 100_000 + "]" * 100_000, "nested deeper")
    code = json.loads(original)
    code["nodes"][0]["args"].append({"s": "__import__('os').system('id')"})
    refused(code, "not a plain word")
    # constants: a pickle (what torch.export.save writes and torch.export.load would unpickle)
    sentinel = tmp_path / "unpickled"

    class Boom:
        def __reduce__(self) -> Any:
            return (open, (str(sentinel), "w"))

    (folder / "graph.json").write_text(original)
    (folder / "constants.safetensors").write_bytes(pickle.dumps(Boom()))
    manifest = json.loads((folder / "adapter.json").read_text())
    from hfadapt.adapters.graph_adapter import graph_digest

    manifest["graph_sha256"] = graph_digest(folder)
    (folder / "adapter.json").write_text(json.dumps(manifest))
    with pytest.raises(GraphError, match="does not read as safetensors"):
        load_graph_adapter(folder)
    assert not sentinel.exists(), "a pickle in the artifact was unpickled"


def test_the_json_nesting_bound_counts_brackets_outside_strings_only() -> None:
    """parse_json's depth bound (what keeps a sandbox's answer from exhausting json.loads'
    recursion) skips brackets in strings, escaped quotes included, and an unterminated string."""
    from hfadapt.errors import UntrustedDataError
    from hfadapt.untrusted import parse_json

    deep = "[" * 5 + "]" * 5
    quoted = json.dumps({"s": '[[[[[[[[ {{{{ \\" ]]]] "[[[['})  # brackets inside one string
    assert parse_json(quoted, max_depth=1) == json.loads(quoted)
    assert parse_json(deep, max_depth=5) == [[[[[]]]]]
    for text, depth in [(deep, 4), ('["\\\\", ' + deep + "]", 5), ('{"a": "\\"", "b": [[]]}', 2)]:
        with pytest.raises(UntrustedDataError, match="nested deeper") as caught:
            parse_json(text, max_depth=depth)
        print(f"{text!r} at max_depth {depth}: {caught.value}")
    with pytest.raises(UntrustedDataError, match="not valid JSON"):  # unterminated: not "deeper"
        parse_json('["' + "[" * 50, max_depth=2)


# -- the refusals and survivals that stay -----------------------------------------------------------


# KeyboardInterrupt is not survived: Ctrl-C stops discovery (tests/adapters/test_registry_interrupt.py)
@pytest.mark.parametrize("raised", ["SystemExit(3)", "RecursionError()"])
def test_adapter_loading_survives_base_exceptions(raised: str, tmp_path: Path) -> None:
    (tmp_path / "dies.py").write_text(f"raise {raised}\n")
    (tmp_path / "fine.py").write_text(
        "from hfadapt.adapters.api import adapter\n\n"
        '@adapter(name="fine", target="hfadapt.agent.evalcases:Softsign.forward", rule="r")\n'
        "def forward(self, x):\n    return x\n"
    )
    reg = Registry()
    reg.load_folder(tmp_path, "user")
    assert [a.name for a in reg.adapters] == ["fine"]
    assert len(reg.errors) == 1 and raised.split("(")[0] in reg.errors[0].error, reg.errors


def test_no_isolation_refuses_in_one_line_unless_unsafe(
    monkeypatch: pytest.MonkeyPatch, openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    from hfadapt.errors import IsolationUnavailableError

    monkeypatch.setattr(isolation, "unavailable_reason", lambda: "bwrap missing (test)")
    with pytest.raises(IsolationUnavailableError) as err:
        run(openai_server.url, tmp_path, attempts=1)
    assert "bwrap missing (test)" in err.value.one_line() and "`unsafe_no_isolation`" in str(
        err.value
    )
    assert openai_server.requests == [], "the endpoint was asked before the refusal"
    openai_server.script = [GOOD]
    outcome, engine = run(openai_server.url, tmp_path, attempts=1, unsafe_no_isolation=True)
    assert outcome.outcome == ACCEPTED, outcome.reason
    _, attempts = rows(engine)
    assert [a.unsafe_no_isolation for a in attempts] == [True]


def test_cli_refusals_are_one_line_with_their_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = str(tmp_path / "runs.db")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    args = ["draft", "some/model", "--model", "m", "--db", db]
    code, out, err = run_cli(args, monkeypatch, capsys)
    text = (out + err).strip()
    assert code == 2 and "no endpoint: pass --base-url" in text, (code, text)
    assert len(text.splitlines()) == 1, text
    monkeypatch.setattr(isolation, "unavailable_reason", lambda: "bwrap missing (test)")
    code, out, err = run_cli([*args, "--base-url", "http://127.0.0.1:9/v1"], monkeypatch, capsys)
    text = (out + err).strip()
    # no sandbox here is something the machine lacks: exit 3
    assert code == 3 and "bwrap missing (test)" in text and "--unsafe-no-isolation" in text, text
    assert len(text.splitlines()) == 1, text
