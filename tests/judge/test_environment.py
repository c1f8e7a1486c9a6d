"""The environment a run records (hfadapt.judge.environment): every package that can move a
verdict, the device's numeric path (asked without building the C kernels, and what the loaders
then decide), and how two recorded environments are compared."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata

from hfadapt.judge.environment import (
    ABSENT,
    KEYS,
    PACKAGES,
    EnvChange,
    changes,
    describe_changes,
    distinct,
    environment,
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


# Run in a fresh process (this one may have loaded the kernels already): the numeric path as
# predicted under each switch, that asking loaded nothing, then what the loaders decide.
_PROBE = """
import json, os
from hfadapt.judge.environment import numeric_path
from hfadapt.spyre.numerics import dl16_native

out = {}
for name, env in [("default", {}), ("no_dl16", {"HFADAPT_NATIVE_DL16": "0"}),
                  ("no_amx", {"HFADAPT_NATIVE_AMX": "0"}), ("no_cc", {"CC": "/nonexistent/cc"})]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    out[name] = numeric_path()
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
out["loaded_by_asking"] = dl16_native.load.cache_info().currsize
dl16_native.available()  # builds (or loads) the kernels: now the loaders decide
out["decided"] = numeric_path()
print(json.dumps(out))
"""


def test_numeric_path_is_predicted_without_building_then_read_from_the_loaders() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("HFADAPT_NATIVE_DL16", "CC")}
    env.pop("HFADAPT_NATIVE_AMX", None)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    print("\n" + json.dumps(out, indent=1))
    assert out["loaded_by_asking"] == 0, out  # asking built and loaded nothing
    assert (out["no_dl16"]["numeric.dl16"], out["no_dl16"]["numeric.amx"]) == ("torch", "fp32")
    assert out["no_amx"]["numeric.amx"] == "fp32", out["no_amx"]
    assert out["no_amx"]["numeric.dl16"] == out["default"]["numeric.dl16"], out
    assert (out["no_cc"]["numeric.dl16"], out["no_cc"]["numeric.amx"]) == ("torch", "fp32")
    # the prediction is what the loaders then decide (this machine has a compiler)
    assert out["decided"] == out["default"], (out["decided"], out["default"])


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
