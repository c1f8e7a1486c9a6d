"""``verify_adapter``'s result for a bundled adapter (three seeds, then the device), computed
once per test run: tests/adapters/test_adapters.py proves every bundled adapter, and
test_post_ln_handoff.py reads the device check of the same proof of post-ln-handoff-clone
instead of proving it again, across pytest-xdist workers too (support.once)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from hfadapt.adapters.proofs import VerifyResult, verify_adapter
from hfadapt.adapters.registry import discover
from support.once import once_per_run

SEEDS = 3
_MEMO: dict[str, VerifyResult] = {}


def _prove(name: str) -> VerifyResult:
    return verify_adapter(discover(paths=[], entry_points=False).get(name), seeds=SEEDS)


def bundled_proof(name: str, tmp_path_factory: pytest.TempPathFactory) -> VerifyResult:
    """The bundled adapter ``name`` verified with SEEDS seeds, once in this test run."""
    if name not in _MEMO:
        _MEMO[name] = once_per_run(
            tmp_path_factory, f"bundled-proof-{name}", lambda _folder: _prove(name), _record, _read
        )
    return _MEMO[name]


def _record(folder: Path, result: VerifyResult) -> None:
    (folder / "proof.pickle").write_bytes(pickle.dumps(result))


def _read(folder: Path) -> VerifyResult:
    result: VerifyResult = pickle.loads((folder / "proof.pickle").read_bytes())  # this run's
    return result
