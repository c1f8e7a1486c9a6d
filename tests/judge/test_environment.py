"""The environment a run records (hfadapt.judge.environment): every package that can move a
verdict, the device's numeric path (asked without building the C kernels, and what the loaders
then decide), and how two recorded environments are compared."""

from __future__ import annotations

import json
import platform
from importlib import metadata

import pytest
from support.native_loaders import loaders_not_run, loaders_run

from hfadapt.judge.environment import (
    ABSENT,
    KEYS,
    PACKAGES,
    EnvChange,
    changes,
    describe_changes,
    distinct,
    environment,
    numeric_path,
    summary,
    unrecorded_keys,
)
from hfadapt.spyre.rules.profile import load_profile


def _installed(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return ABSENT


def test_environment_names_every_package_and_the_numeric_path() -> None:
    prof = load_profile(None)
    env = environment(prof)
    print("\n" + json.dumps(env, indent=1))
    assert list(env) == list(KEYS), list(env)
    assert all(isinstance(v, str) and v for v in env.values()), env
    assert env["profile"] == f"{prof.name}@{prof.version}", env["profile"]
    assert env["python"] == platform.python_version(), env["python"]
    for key, dist in PACKAGES:
        assert env[key] == _installed(dist), (key, env[key], _installed(dist))
    assert {"kernels", "sentence-transformers", "huggingface_hub"} <= set(env), env
    assert env["numeric.dl16"] in ("native", "torch"), env["numeric.dl16"]
    assert env["numeric.amx"] in ("tiles", "fp32"), env["numeric.amx"]
    if env["numeric.dl16"] == "torch":
        assert env["numeric.amx"] == "fp32", env  # the tiles are a kernel of the C library
    assert env["numeric.cpu"] and env["numeric.matmul_precision"] in ("highest", "high", "medium")


def test_numeric_path_is_predicted_without_building_then_read_from_the_loaders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under each switch, the numeric path as predicted before any kernel loader ran (asking
    runs none), then what the loaders decide once they have."""
    from hfadapt.spyre.numerics import dl16_native

    for name in ("HFADAPT_NATIVE_DL16", "HFADAPT_NATIVE_AMX", "CC"):
        monkeypatch.delenv(name, raising=False)
    switches = {
        "default": {},
        "no_dl16": {"HFADAPT_NATIVE_DL16": "0"},
        "no_amx": {"HFADAPT_NATIVE_AMX": "0"},
        "no_cc": {"CC": "/nonexistent/cc"},
    }
    paths: dict[str, dict[str, str]] = {}
    with loaders_not_run():
        for name, env in switches.items():
            with monkeypatch.context() as m:
                for key, value in env.items():
                    m.setenv(key, value)
                paths[name] = numeric_path()
        run_by_asking = loaders_run()
        dl16_native.available()  # builds (or loads) the kernels: now the loaders decide
        paths["decided"] = numeric_path()
    print(f"\nloaders run by asking: {run_by_asking}\n" + json.dumps(paths, indent=1))
    assert run_by_asking == 0, f"asking ran {run_by_asking} kernel loaders"
    assert (paths["no_dl16"]["numeric.dl16"], paths["no_dl16"]["numeric.amx"]) == ("torch", "fp32")
    assert paths["no_amx"]["numeric.amx"] == "fp32", paths["no_amx"]
    assert paths["no_amx"]["numeric.dl16"] == paths["default"]["numeric.dl16"], paths
    assert (paths["no_cc"]["numeric.dl16"], paths["no_cc"]["numeric.amx"]) == ("torch", "fp32")
    # the prediction is what the loaders then decide (this machine has a compiler)
    assert paths["decided"] == paths["default"], (paths["decided"], paths["default"])


BEFORE = {"hfadapt": "0.1.0", "transformers": "5.24.0", "kernels": ABSENT, "numeric.amx": "tiles"}
AFTER = {"hfadapt": "0.1.0", "transformers": "5.25.0", "kernels": "0.19.1", "numeric.amx": "fp32"}


def test_changes_name_each_differing_key_in_key_order() -> None:
    found = changes([BEFORE], [AFTER])
    text = describe_changes(found)
    print(f"\n{text}")
    assert found == [
        EnvChange("transformers", ("5.24.0",), ("5.25.0",)),
        EnvChange("kernels", (ABSENT,), ("0.19.1",)),
        EnvChange("numeric.amx", ("tiles",), ("fp32",)),
    ], found
    assert (
        text == "transformers 5.24.0 -> 5.25.0, kernels absent -> 0.19.1, numeric.amx tiles -> fp32"
    )
    assert changes([BEFORE], [dict(BEFORE)]) == []
    # rows that recorded nothing, or keys one side never recorded, are no change
    old = {"hfadapt": "0.1.0", "transformers": "5.24.0"}
    assert changes([old, None, {}], [AFTER]) == [found[0]], changes([old], [AFTER])
    assert unrecorded_keys([old], [AFTER]) == ["kernels", "numeric.amx"]
    assert unrecorded_keys([], [AFTER]) == [] and changes([], [AFTER]) == []
    # a sweep that ran in two environments: each value it holds
    mixed = changes([BEFORE, AFTER], [AFTER])
    assert str(mixed[0]) == "transformers 5.24.0/5.25.0 -> 5.25.0", mixed
    assert distinct([BEFORE, dict(BEFORE), AFTER, None]) == [BEFORE, AFTER]


def test_summary_is_one_line_with_the_numeric_path() -> None:
    line = summary({**AFTER, "profile": "p@1", "numeric.dl16": "native", "torch": "2.13.0"})
    assert line == (
        "profile p@1, torch 2.13.0, transformers 5.25.0, kernels 0.19.1, dl16 native, amx fp32"
    ), line
    assert summary({}) == "not recorded"


def test_the_sandboxed_worker_keeps_every_environment_key() -> None:
    from hfadapt.judge.sandboxed import MAX_VERSIONS, from_data

    env = environment(load_profile(None))
    data = {
        "model_id": "m", "verdict": "load_failed", "reason": "r", "exit_code": 1,
        "mode": "full", "structural": False, "execution": "eager", "dtype": "fp16",
        "next_step": "", "versions": env,
    }  # fmt: skip
    assert from_data(data).versions == env
    many = {f"k{i}": "v" for i in range(3 * MAX_VERSIONS)}
    kept = from_data({**data, "versions": many}).versions
    assert len(kept) == MAX_VERSIONS >= 2 * len(KEYS), (len(kept), MAX_VERSIONS)
