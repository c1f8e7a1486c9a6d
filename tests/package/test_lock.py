"""requirements/lock.txt against pyproject.toml: the lock pins every dependency
hfadapt and its test extra name, at a version inside the range pyproject claims, as plain
``name==version`` constraints pip accepts; and under CI, where the environment was installed
with the lock, the releases that move verdicts are the lock's."""

from __future__ import annotations

import os
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "lock.txt"
# The releases that move hfadapt's verdicts (a new transformers pulled in kernels and changed
# results): under CI the running environment must hold exactly the lock's.
VERDICT_MOVING = ("torch", "transformers", "kernels", "sentence-transformers", "huggingface_hub")


def lock_pins(text: str) -> dict[str, Version]:
    """The lock's ``name==version`` lines by canonical name; any other entry is an error."""
    pins: dict[str, Version] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            requirement: Requirement | None = Requirement(line)
        except InvalidRequirement:
            requirement = None
        specifiers = list(requirement.specifier) if requirement else []
        assert (
            requirement is not None
            and requirement.url is None
            and not requirement.extras
            and len(specifiers) == 1
            and specifiers[0].operator == "=="
        ), f"lock.txt:{number} is not name==version, which a constraints file needs: {raw!r}"
        pins[canonicalize_name(requirement.name)] = Version(specifiers[0].version)
    return pins


def claimed() -> list[Requirement]:
    """pyproject's runtime dependencies and its test extra, with the packages their extras
    bring (psycopg[binary] brings psycopg-binary), read from the installed metadata."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [
        Requirement(r)
        for r in [*project["dependencies"], *project["optional-dependencies"]["test"]]
    ]
    for requirement in list(found):
        for extra in sorted(requirement.extras):
            for raw in metadata.requires(requirement.name) or []:
                piece = Requirement(raw)
                if piece.marker is not None and piece.marker.evaluate({"extra": extra}):
                    found.append(piece)
    return found


def test_the_lock_pins_every_dependency_inside_its_range() -> None:
    pins = lock_pins(LOCK.read_text())
    assert "hfadapt" not in pins, "the lock pins hfadapt itself"
    requirements = claimed()
    missing = sorted({str(r) for r in requirements if canonicalize_name(r.name) not in pins})
    outside = sorted(
        f"{r} (lock: {pins[canonicalize_name(r.name)]})"
        for r in requirements
        if canonicalize_name(r.name) in pins
        and not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)
    )
    print(f"\n{len(requirements)} requirements against {len(pins)} pins in {LOCK.name}")
    assert not missing, f"named in pyproject.toml but not in requirements/lock.txt: {missing}"
    assert not outside, f"locked outside pyproject.toml's range: {outside}"
    assert {"ray", "psycopg", "psycopg-binary", "kernels"} <= pins.keys(), sorted(pins)


def test_the_verdict_moving_releases_are_the_locks() -> None:
    pins = lock_pins(LOCK.read_text())
    installed = {name: Version(metadata.version(name)) for name in VERDICT_MOVING}
    locked = {name: pins.get(canonicalize_name(name)) for name in VERDICT_MOVING}
    table = ", ".join(f"{n} {installed[n]} (lock {locked[n]})" for n in VERDICT_MOVING)
    print(f"\n{table}")
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip(f"not under CI, where the environment is installed with the lock: {table}")
    differ = {
        n: f"{installed[n]} installed, {locked[n]} locked"
        for n in VERDICT_MOVING
        if installed[n] != locked[n]
    }
    assert not differ, f"CI's environment is not the lock's: {differ}"


def test_a_url_or_editable_entry_is_refused() -> None:
    assert lock_pins("# made by scripts/lock\ntorch==2.13.0+cpu\n") == {
        "torch": Version("2.13.0+cpu")
    }
    for entry in ("-e .", "hfadapt @ file:///work/main", "torch>=2.13", "psycopg[binary]==3.3.9"):
        with pytest.raises(AssertionError, match="not name==version"):
            lock_pins(entry)
