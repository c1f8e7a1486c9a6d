"""A device profile's numbers are checked when it loads: every numerics field and layout value
the simulator computes with, against what its C kernels and torch ops can compute (a 23-bit
``partial_mantissa_bits`` once made the C sums shift by -1 and return every product with its
sign flipped). A bad value is a ProfileError of one line naming the field, the value and what
is allowed, through the loader and through the command line."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.errors import ProfileError
from hfadapt.spyre.rules.profile import available_profiles, load_profile

BASE = "spyre-2026.07"

# (section: "numerics.<name>" or "layout.<name>", field, bad value, what the message allows)
BAD_VALUES: list[tuple[str, str, Any, str]] = [
    ("numerics.matmul_chunks", "partial_mantissa_bits", 23, "an integer from 0 to 22"),
    ("numerics.matmul_chunks", "partial_mantissa_bits", -1, "an integer from 0 to 22"),
    ("numerics.matmul_chunks", "partial_mantissa_bits", 9.5, "an integer from 0 to 22"),
    ("numerics.matmul_chunks", "partial_mantissa_bits", "9", "an integer from 0 to 22"),
    ("numerics.matmul_chunks", "chunk_elements", 100, "a positive multiple of the 64-element"),
    ("numerics.matmul_chunks", "chunk_elements", 0, "an integer of at least 64"),
    ("numerics.matmul_chunks", "enabled", "false", "true or false"),
    ("numerics.matmul_chunks", "chunk_elemnts", 256, "no such field; known: "),
    ("numerics.dl16", "mantissa_bits", 23, "an integer from 0 to 22"),
    ("numerics.dl16", "exponent_bits", 9, "an integer from 1 to 8"),
    ("numerics.dl16", "bias", 64, "an integer from 0 to 63"),
    ("numerics.dl16", "sign_bits", 2, "an integer from 1 to 1"),
    ("numerics.dl16", "max_finite", 1e40, "a finite number below 2^113"),
    ("numerics.dl16", "min_normal", 0.0, "a number from 2^-126"),
    ("numerics.dl16", "min_normal", 1e10, "up to below the largest finite value"),
    ("numerics.dl16", "host_inf_bits", "0x7FFF", "whose value is at most the largest finite"),
    ("numerics.dl16", "host_inf_bits", "0x8001", "the sign bit clear"),
    ("numerics.dl16", "host_inf_bits", 28671, "a hexadecimal code as a string"),
    ("numerics.dl16", "subnormals", True, "false (results below min_normal flush to zero)"),
    ("numerics.dl16", "rounding", "toward_zero", '"nearest_even"'),
    ("numerics.dl16", "overflow", "saturate", '"nan" or "inf"'),
    ("numerics.reduced_precision_mean", "mantissa_bits", 24, "an integer from 0 to 23"),
    ("numerics.reduced_precision_mean", "lanes", 0, "an integer of at least 1"),
    ("numerics.softmax_exp_floor", "exp_floor", 1.5, "a number in [0, 1]"),
    ("numerics.softmax_exp_floor", "exp_floor", -1e-5, "a number in [0, 1]"),
    ("numerics.softmax_exp_floor", "exp_floor", math.nan, "a number in [0, 1]"),
    ("numerics.layer_norm_stats", "enabled", 1, "true or false"),
    ("layout.stick_elements_fp16", "value", 32, "64 (the simulator's kernels are built"),
    ("layout.stick_bytes", "value", 256, "128 (64 fp16 elements)"),
    ("layout.fp32_stick_reduction", "value", 16, "32 (the fp32 elements of a 128-byte stick)"),
    ("layout.matmul_k_multiple", "value", 0, "an integer of at least 1"),
    ("layout.head_dim", "value_rope", 12.5, "an integer of at least 1"),
    ("layout.matmul_k_multiple", "padded_by_compiler", "yes", "true or false"),
]


def _child(tmp_path: Path, section: str, field: str, value: Any, name: str = "bad") -> str:
    """A profile file extending the bundled one with ``section.field`` set to ``value`` (the
    rest of the section as bundled: a child replaces a numerics or layout entry whole)."""
    kind, entry = section.split(".")
    base = load_profile(BASE)
    spec = copy.deepcopy(getattr(base, kind)[entry])
    spec[field] = value
    path = tmp_path / f"{name}.json"
    path.write_text(
        json.dumps({"name": name, "version": "2026.07.9", "extends": BASE, kind: {entry: spec}})
    )
    return str(path)


def _shown(value: Any) -> str:
    return json.dumps(value)


@pytest.mark.parametrize(
    ("section", "field", "value", "allowed"),
    BAD_VALUES,
    ids=[f"{s}.{f}={_shown(v)}" for s, f, v, _ in BAD_VALUES],
)
def test_a_bad_value_is_refused_naming_the_field_its_value_and_the_range(
    tmp_path: Path, section: str, field: str, value: Any, allowed: str
) -> None:
    path = _child(tmp_path, section, field, value)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    text = info.value.one_line()
    assert "\n" not in str(info.value), str(info.value)
    assert text.startswith(f"device profile {path}: {section}.{field} is {_shown(value)}; "), text
    assert allowed in text.split("; allowed: ", 1)[1], text


def test_a_missing_field_of_an_enabled_section_is_refused(tmp_path: Path) -> None:
    base = load_profile(BASE)
    spec = {k: v for k, v in base.numerics["matmul_chunks"].items() if k != "chunk_elements"}
    path = tmp_path / "thin.json"
    path.write_text(
        json.dumps(
            {"name": "thin", "version": "0", "extends": BASE, "numerics": {"matmul_chunks": spec}}
        )
    )
    with pytest.raises(ProfileError, match=r"numerics\.matmul_chunks lacks the field "):
        load_profile(str(path))


def test_an_unknown_numerics_section_is_refused(tmp_path: Path) -> None:
    """A misspelt section is read by no code: the one it meant keeps the parent's values."""
    path = tmp_path / "typo.json"
    path.write_text(
        json.dumps(
            {
                "name": "typo",
                "version": "0",
                "extends": BASE,
                "numerics": {"matmul_chunk": {"enabled": False}},
            }
        )
    )
    with pytest.raises(ProfileError, match=r"numerics\.matmul_chunk is .*no such section; known: "):
        load_profile(str(path))


def test_every_bundled_profile_passes_and_good_edges_load(tmp_path: Path) -> None:
    """The bundled profiles, and values at the edges of the ranges, load."""
    for name in available_profiles():
        load_profile(name)
    for section, field, value in [
        ("numerics.matmul_chunks", "partial_mantissa_bits", 0),
        ("numerics.matmul_chunks", "partial_mantissa_bits", 22),
        ("numerics.matmul_chunks", "chunk_elements", 64),
        ("numerics.matmul_chunks", "chunk_elements", 1024),
        ("numerics.softmax_exp_floor", "exp_floor", 0),
        ("numerics.reduced_precision_mean", "mantissa_bits", 23),
        ("numerics.dl16", "overflow", "inf"),
    ]:
        path = _child(tmp_path, section, field, value, name=f"edge-{field}-{value}")
        profile = load_profile(path)
        kind, entry = section.split(".")
        assert getattr(profile, kind)[entry][field] == value


def test_a_bad_profile_file_on_the_command_line_names_the_field(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--profile FILE`` with a bad value: exit 2 (bad input), one line naming the field,
    before the database is opened."""
    path = _child(tmp_path, "numerics.matmul_chunks", "partial_mantissa_bits", 23)
    db = tmp_path / "runs.db"
    code, out, err = run_cli(
        ["diagnose", "org/some-model", "--profile", path, "--db", str(db)], monkeypatch, capsys
    )
    assert (code, out, err.count("\n")) == (2, "", 1), (code, out, err)
    assert err.startswith(
        f"error: device profile {path}: numerics.matmul_chunks.partial_mantissa_bits is 23; "
        "allowed: an integer from 0 to 22"
    ), err
    assert not db.exists(), "a refused profile opened the database"
