"""Each raise site of ProfileError, SweepError, SandboxError and AdapterError, provoked for
real: the error class, its one-line message, and (through ``hfadapt.cli.main``) the exit
code and the single line a user sees."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.errors import AdapterError, ProfileError, SandboxError, SweepError

# ---- ProfileError: hfadapt.spyre.rules.profile ----------------------------------------------------


def _profile(tmp_path: Path, name: str, data: dict[str, Any] | str) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def _bundled_op() -> tuple[str, str]:
    from hfadapt.spyre.rules.profile import load_profile

    rule = next(r for r in load_profile("spyre-2026.07").rules.values() if r.ops)
    return rule.id, rule.ops[0]


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("unknown name", r"^no device profile 'no-such-profile'; bundled: spyre-2026\.07"),
        ("not json", r"^device profile .*broken\.json does not load: "),
        ("missing field", r"^device profile .*thin\.json lacks the field 'version'$"),
        ("unknown outcome", r"^rule r\.odd: unknown outcome 'sometimes'$"),
        ("circular extends", r"^profile a: circular 'extends' \(a -> b -> a\)$"),
        ("move to unknown rule", r"^profile mover: move_ops names unknown rule no\.such\.rule$"),
        ("op claimed twice", r"^profile twice: aten::\S+ is claimed by both "),
    ],
)
def test_profile_error_sites(case: str, match: str, tmp_path: Path) -> None:
    from hfadapt.spyre.rules.profile import OUTCOMES, load_profile

    base = "spyre-2026.07"
    if case == "unknown name":
        ref = "no-such-profile"
    elif case == "not json":
        ref = _profile(tmp_path, "broken", "{ not json")
    elif case == "missing field":
        ref = _profile(tmp_path, "thin", {"name": "thin", "rules": []})
    elif case == "unknown outcome":
        rule = {"id": "r.odd", "outcome": "sometimes", "ops": ["aten::odd_op"]}
        ref = _profile(tmp_path, "odd", {"name": "odd", "extends": base, "add_rules": [rule]})
    elif case == "circular extends":
        a, b = tmp_path / "a.json", tmp_path / "b.json"
        a.write_text(json.dumps({"name": "a", "extends": str(b)}))
        b.write_text(json.dumps({"name": "b", "extends": str(a)}))
        ref = str(a)
    elif case == "move to unknown rule":
        _, op = _bundled_op()
        move = {"op": op, "to_rule": "no.such.rule"}
        ref = _profile(tmp_path, "mover", {"name": "mover", "extends": base, "move_ops": [move]})
    else:
        rule_id, op = _bundled_op()
        rule = {"id": "r.copy", "outcome": OUTCOMES[0], "ops": [op]}
        ref = _profile(tmp_path, "twice", {"name": "twice", "extends": base, "add_rules": [rule]})
        match = rf"^profile twice: {op} is claimed by both {rule_id} and r\.copy$"
    with pytest.raises(ProfileError, match=match) as info:
        load_profile(ref)
    assert "\n" not in info.value.one_line()


def test_a_bad_profile_on_the_command_line_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = tmp_path / "runs.db"
    code, out, err = run_cli(
        ["diagnose", "org/some-model", "--profile", "nope", "--db", str(db)], monkeypatch, capsys
    )
    assert (code, out, err.count("\n")) == (2, "", 1), (code, out, err)
    assert err.startswith("error: no device profile 'nope'; bundled: "), err
    assert not db.exists(), "a refused profile opened the database"


# ---- SweepError: hfadapt.sweep.ray_pool and local_pool ---------------------------------------


def test_ray_missing_is_a_sweep_error_whose_install_hint_survives_the_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from hfadapt.sweep.ray_pool import RayExecutor

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(SweepError, match=r"^the ray executor needs Ray: pip install '\.\[ray\]'$"):
        RayExecutor(1)
    db = tmp_path / "runs.db"
    code, out, err = run_cli(
        ["sweep", "--executor", "ray", "--top", "1", "--db", str(db), "--json"],
        monkeypatch,
        capsys,
    )
    # Rich markup must not eat "[ray]"; refused before anything (exit 3: the machine lacks Ray)
    assert (code, err) == (
        3,
        "error: --executor ray needs Ray, which is not installed: pip install '.[ray]'\n",
    ), (code, out, err)
    assert not db.exists(), "the database was created before Ray was found missing"


def test_ray_that_cannot_start_is_a_sweep_error(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install '.[ray]'")
    from hfadapt.sweep.ray_pool import RayExecutor

    def refuse(**kwargs: Any) -> None:
        raise ConnectionError(f"no GCS at {kwargs.get('address')}")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(
        SweepError, match=r"^cannot start or reach 10\.9\.9\.9:6379: no GCS at 10\.9\.9\.9:6379$"
    ):
        RayExecutor(1, address="10.9.9.9:6379").start()


def test_local_workers_that_cannot_start_are_a_sweep_error() -> None:
    from hfadapt.sweep.local_pool import MAX_START_FAILURES, LocalExecutor
    from hfadapt.sweep.worker import Task

    pool = LocalExecutor(1, timeout=60, worker="no_such_module_for_hfadapt:judge")
    pool.start()
    try:
        with pytest.raises(
            SweepError,
            match=r"^sweep workers cannot start: the last one exited with code 1 before taking any work$",
        ):
            list(pool.run([Task("a", "org/a")]))
    finally:
        pool.close()
    assert MAX_START_FAILURES >= 2  # one bad start is retried before giving up


# ---- SandboxError: hfadapt.agent.sandbox ------------------------------------------------------


def test_a_sandbox_that_cannot_start_is_a_sandbox_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from hfadapt.agent.sandbox import run_sandbox

    missing = "/nonexistent/hfadapt-python"

    def cannot_exec(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError(2, "No such file or directory", missing)

    # the launcher (bubblewrap, or the plain process after an opt-out) cannot exec
    monkeypatch.setattr("hfadapt.isolation.spawn", cannot_exec)
    with pytest.raises(
        SandboxError, match=r"^cannot start the sandbox process: .*hfadapt-python"
    ) as info:
        run_sandbox("x = 1\n", {"steps": []})
    assert isinstance(info.value.__cause__, FileNotFoundError), repr(info.value.__cause__)


# ---- AdapterError: hfadapt.adapters.api and registry ------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "bad name!"}, r"^adapter name 'bad name!' must be letters, digits, '-' or '_'$"),
        (
            {"kind": "decorator"},
            r"^adapter ok-name: kind must be one of method, pre_hook, attention, not 'decorator'$",
        ),
        ({"proof": "vibes"}, r"^adapter ok-name: proof must be one of call, model, not 'vibes'$"),
    ],
)
def test_adapter_decorator_refuses_bad_metadata(kwargs: dict[str, Any], match: str) -> None:
    from hfadapt.adapters.api import adapter

    args: dict[str, Any] = {"name": "ok-name", "target": "torch.nn:Linear", "rule": "op.x"}
    with pytest.raises(AdapterError, match=match):
        adapter(**{**args, **kwargs})


@pytest.mark.parametrize(
    ("target", "match"),
    [
        ("torch.nn.Linear", r"target 'torch\.nn\.Linear' is not 'module:Class\[\.method\]'$"),
        ("no_such_module_xyz:Thing", r"cannot import no_such_module_xyz: "),
        ("torch.nn:NoSuchClass", r"torch\.nn has no class NoSuchClass$"),
    ],
)
def test_adapter_target_that_does_not_resolve(target: str, match: str) -> None:
    from hfadapt.adapters.api import Adapter

    a = Adapter(name="t", kind="method", target=target, fn=lambda *args: None, rule="op.x")
    with pytest.raises(AdapterError, match=rf"^adapter t: {match}"):
        a.target_class()


def test_adapter_file_without_an_adapter_and_an_unknown_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.adapters.registry import load_file

    empty = tmp_path / "nothing_here.py"
    empty.write_text("X = 1\n")
    with pytest.raises(AdapterError, match=r"^nothing_here\.py: defines no @adapter$"):
        load_file(empty)
    code, out, err = run_cli(["adapters", "show", "no-such-adapter"], monkeypatch, capsys)
    assert (code, out) == (2, ""), (code, out, err)  # "not found" is bad input everywhere
    assert err == "error: no adapter named 'no-such-adapter'; see hfadapt adapters list\n", err
