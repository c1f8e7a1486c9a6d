"""What sandboxed code can reach when hfadapt runs as root: no uid 0 inside, no
writable kernel knob, nothing of the working folder, the home folder or a checkout's root, and
no writable place but the capped /tmp and /dev/shm. Each probe runs through the real sandbox:
the draft worker's mounts, the remote-code judge's mounts, and one `python -m hfadapt draft`
from a home folder whose drafted annotation probes at import time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from support.drafting import TINY_GELU_BERT, gelu_draft
from support.openai_server import (
    ScriptedOpenAI,
    openai_server_fixture,  # noqa: F401
    reply,
)

import hfadapt
from hfadapt import isolation

pytestmark = pytest.mark.containment
needs_bwrap = pytest.mark.skipif(
    isolation.unavailable_reason() is not None,
    reason=f"no OS isolation here: {isolation.unavailable_reason()}",
)
SYSCTL = Path("/proc/sys/kernel/printk_ratelimit_burst")
SECRET = "netrc-SECRET-machine-login-5150"
PACKAGE = Path(hfadapt.__file__).resolve().parent
CHECKOUT = PACKAGE.parent
# Writes go through libc (no audit event: the draft worker's in-process fence never sees them),
# so what stops them is the OS sandbox. Each place gets 20 files of 30 MB (600 MB in all).
PROBE = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
found = {"uid": os.getuid(), "gid": os.getgid()}
def _err():
    return errno.errorcode.get(ctypes.get_errno(), "E?")
def _write(path, mb):
    fd = libc.open(path.encode(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    if fd < 0:
        return 0, _err()
    done, why, block = 0, "none", bytes(1 << 20)
    for _ in range(mb):
        if libc.write(fd, block, len(block)) != len(block):
            why = _err()
            break
        done += 1
    libc.close(fd)
    return done, why
found["sysctl"] = _write(%(sysctl)r, 0)[1]
found["secrets"] = []
for path in %(secrets)r:
    try:
        found["secrets"].append(open(path, "rb").read().hex())
    except OSError as exc:
        found["secrets"].append(errno.errorcode.get(exc.errno or 0, "E?"))
found["checkout"] = sorted(os.listdir(%(checkout)r)) if os.path.isdir(%(checkout)r) else []
for place in ("/junk", "/dev/shm/junk", "/etc/junk"):
    total, why = 0, "none"
    for n in range(20):
        done, why = _write(f"{place}{n}", 30)
        total += done
        if why != "none":
            break
    found[place] = [total, why]
    for n in range(20):
        libc.unlink(f"{place}{n}".encode())
"""


def _probe(secrets: list[Path]) -> str:
    return PROBE % {
        "sysctl": str(SYSCTL),
        "secrets": [str(s) for s in secrets],
        "checkout": str(CHECKOUT),
    }


@pytest.fixture
def exposed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A working folder and a home folder holding secrets (a .netrc, AWS credentials), both on
    this process's PYTHONPATH too, as `python -m hfadapt` from a home folder would have them;
    returns the secret files."""
    work, home = tmp_path / "work", tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    work.mkdir()
    secrets = [work / ".env", home / ".netrc", home / ".aws" / "credentials"]
    for path in secrets:
        path.write_text(SECRET)
        path.chmod(0o644)  # readable by anyone who can reach it: only the mounts keep it out
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(work), str(home), str(CHECKOUT)]))
    return secrets


def _expect_contained(found: dict[str, Any], secrets: list[Path], tmpfs: int, shm: int) -> None:
    if os.geteuid() == 0:
        assert (found["uid"], found["gid"]) == (isolation.SANDBOX_UID, isolation.SANDBOX_GID)
    assert found["uid"] != 0, found
    assert found["sysctl"] in ("EROFS", "EACCES", "EPERM", "ENOENT"), found  # not "none"
    assert found["secrets"] == ["ENOENT"] * len(secrets), found
    assert SECRET.encode().hex() not in json.dumps(found)
    # an editable install: the package (and the bundled adapters/prompts), never the checkout
    assert ".git" not in found["checkout"] and "tests" not in found["checkout"], found
    assert found["/junk"] == [0, "EROFS"] and found["/etc/junk"] == [0, "EROFS"], found
    mb, why = found["/dev/shm/junk"]
    assert mb <= shm and why in ("ENOSPC", "EFBIG"), found


@needs_bwrap
@pytest.mark.parametrize("worker", ["draft", "judge"])
def test_sandboxed_code_runs_unprivileged_and_sees_no_secret_and_writes_only_capped_places(
    worker: str, exposed: list[Path], tmp_path: Path
) -> None:
    """The draft worker's and the judge's sandbox, started as hfadapt starts them (as root on
    this machine and in CI): the probe runs as nobody, cannot write a sysctl (the host value
    stays), reads no secret of the working or home folder, sees no checkout root, cannot write
    /, /etc or past /dev/shm's cap, and still imports hfadapt from the editable install."""
    from hfadapt.agent import sandbox
    from hfadapt.judge import sandboxed

    if worker == "draft":
        env = sandbox.clean_env()
        readable = sandbox.readable_paths({})
        limits = isolation.Limits(tmpfs_mb=512)
    else:
        env = sandboxed._env(True, tmp_path / "scratch")
        readable = sandboxed._readable(env, "some/model", None)
        limits = isolation.Limits(tmpfs_mb=sandboxed.TMPFS_MB)
    assert str(CHECKOUT) not in map(str, readable)
    model = tmp_path / "model"  # root's own 0600 file (save_pretrained writes weights so)
    model.mkdir()
    (model / "weights.bin").write_text("weights")
    (model / "weights.bin").chmod(0o600)
    inputs = Path(tempfile.mkdtemp(dir=tmp_path)) / "in"
    inputs.mkdir()
    script = _probe(exposed) + (
        "import hfadapt, json, sys\n"
        "found['hfadapt'] = hfadapt.__file__\n"
        "found['path'] = [p for p in sys.path if p]\n"
        f"found['weights'] = open({str(model / 'weights.bin')!r}).read()\n"
        "print(json.dumps(found))\n"
    )
    (inputs / "probe.py").write_text(script)
    before = SYSCTL.read_text()
    proc = isolation.spawn(
        [sys.executable, f"{isolation.INPUT_DIR}/probe.py"],
        inputs=inputs,
        env=env,
        limits=limits,
        readable=[*readable, model],
    )
    done = isolation.collect(proc, 120)
    assert done.code == 0, done.stderr_tail
    found = json.loads(done.stdout)
    assert SYSCTL.read_text() == before, "a host sysctl changed"
    _expect_contained(found, exposed, limits.tmpfs_mb, limits.shm_mb)
    assert found["hfadapt"] == str(PACKAGE / "__init__.py"), found
    assert found["weights"] == "weights", found  # a named folder stays readable, read-only
    # the working and home folders were on PYTHONPATH: left out, not shown
    assert not {str(p.parent) for p in exposed} & set(found["path"]), found["path"]


def test_mounts_hold_the_interpreter_and_package_never_the_working_or_home_folder(
    exposed: list[Path],
) -> None:
    """What the sandbox shows: the standard library, this environment's site-packages and
    hfadapt's package folder; never the working folder, the home folder or the checkout root,
    even when they are on PYTHONPATH (as `python -m hfadapt` from a home folder puts the cwd on
    sys.path)."""
    import sysconfig

    shown = [str(p) for p in isolation.mounts()]
    assert str(PACKAGE) in shown, shown
    for needed in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]):
        assert [s for s in shown if needed == s or needed.startswith(s + "/")], (needed, shown)
    for private in [*(str(p.parent) for p in exposed), str(CHECKOUT), os.path.expanduser("~")]:
        assert not [s for s in shown if s == private or private.startswith(s + "/")], (
            private,
            shown,
        )
    assert isolation.python_path() == [str(CHECKOUT)], isolation.python_path()
    with pytest.raises(ValueError, match="home folder"):
        isolation.mounts([Path(os.environ["HOME"])])


# -- through `python -m hfadapt draft`, from a home folder --------------------------------------


@needs_bwrap
@pytest.mark.parametrize("entry", ["python -m hfadapt", "console script"])
def test_a_drafted_annotation_probing_from_a_home_folder_finds_nothing_to_send(
    openai_server: ScriptedOpenAI, exposed: list[Path], tmp_path: Path, entry: str
) -> None:
    """`python -m hfadapt draft` (and the `hfadapt` console script) run from a home folder holding secrets (the cwd on sys.path,
    the editable install's checkout on PYTHONPATH), against a hostile endpoint whose first
    draft probes in an argument annotation at import and raises what it found into the
    feedback: the probe runs as nobody, writes no sysctl, reads no secret, cannot write / or
    /etc or past /dev/shm's cap; the endpoint never receives the secret, in clear or hex."""
    folder = tmp_path / "tiny-gelu-bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_GELU_BERT))
    probe = _probe(exposed) + "raise RuntimeError('FOUND ' + __import__('json').dumps(found))\n"
    hostile = gelu_draft(args=f"self, input: exec({probe!r}) = None")
    # one case (the registry's other adapters apply, gelu_new's is left out): the hostile draft
    # first, then the honest gelu rewrite, accepted
    openai_server.script = [hostile, {"body": reply(gelu_draft())}]
    home = Path(os.environ["HOME"])
    before = SYSCTL.read_text()
    args = ["draft", str(folder), "--mode", "structural", "--eager"]
    args += ["--without-adapter", "gelu-new-cube"]
    args += ["--base-url", openai_server.url, "--model", "scripted-model"]
    args += ["--api-key", "sk-test-reach", "--max-attempts", "2", "--json"]
    args += ["--db", str(tmp_path / "runs.db")]
    command = [sys.executable, "-m", "hfadapt"]
    if entry == "console script":  # what pip installed beside the interpreter
        command = [str(Path(sys.executable).parent / "hfadapt")]
    done = subprocess.run(
        [*command, *args],
        cwd=home,
        env={**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"]},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    outcomes = json.loads(done.stdout)
    # the one failure fixed at the second attempt: exit 0
    assert [(o["outcome"], o["attempts"]) for o in outcomes] == [("accepted", 2)], (
        json.dumps(outcomes)[:4000],
        done.stderr[-3000:],
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert SYSCTL.read_text() == before, "a host sysctl changed"
    sent = json.dumps([r["json"] for r in openai_server.requests])
    assert SECRET not in sent and SECRET.encode().hex() not in sent
    assert SECRET not in done.stdout + done.stderr
    texts = [
        str(m.get("content"))
        for r in openai_server.requests
        for m in r["json"].get("messages", [])
        if "FOUND {" in str(m.get("content"))
    ]
    assert texts, sent[-3000:]
    found, _ = json.JSONDecoder().raw_decode(texts[0].split("FOUND ", 1)[1])
    _expect_contained(found, exposed, 512, isolation.Limits().shm_mb)


@needs_bwrap
def test_a_venv_inside_the_home_and_working_folder_still_starts_and_shows_only_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """HOME and the working folder set to the folder holding the venv (here the editable
    checkout, as with a venv in a home folder): the worker still starts and imports hfadapt,
    and of that folder the sandbox shows only the venv's pieces and hfadapt's files."""
    from hfadapt.agent import sandbox

    holder = Path(sys.prefix).parent
    if holder == Path("/"):
        pytest.skip("the interpreter is not in a venv below a folder")
    monkeypatch.setenv("HOME", str(holder))
    monkeypatch.chdir(holder)
    inputs = Path(tempfile.mkdtemp(dir=tmp_path)) / "in"
    inputs.mkdir()
    script = (
        "import json, os, hfadapt\n"
        f"print(json.dumps([hfadapt.__file__, sorted(os.listdir({str(holder)!r}))]))\n"
    )
    (inputs / "probe.py").write_text(script)
    proc = isolation.spawn(
        [sys.executable, f"{isolation.INPUT_DIR}/probe.py"],
        inputs=inputs,
        env=sandbox.clean_env(),
        limits=isolation.Limits(),
        readable=sandbox.readable_paths({}),
    )
    done = isolation.collect(proc, 120)
    assert done.code == 0, done.stderr_tail
    package, shown = json.loads(done.stdout)
    assert package == str(PACKAGE / "__init__.py")
    allowed = {Path(sys.prefix).name, *(p.name for p in isolation.package_paths())}
    assert set(shown) <= allowed, (shown, allowed)
