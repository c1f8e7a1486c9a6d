"""``verify_adapter``'s result for a bundled adapter (three seeds, then the device), computed
once per test run: tests/adapters/test_adapters.py proves every bundled adapter, and
test_post_ln_handoff.py reads the device check of the same proof of post-ln-handoff-clone
instead of proving it again. Under pytest-xdist each worker has its own session: the first
worker to need a proof runs it under a file lock in the workers' common temp folder and pickles
the result there; a worker that needs it later reads it (the recipe of tests/service/conftest.py)."""

from __future__ import annotations

import os
import pickle

import pytest
from filelock import FileLock

from hfadapt.adapters.proofs import VerifyResult, verify_adapter
from hfadapt.adapters.registry import discover

SEEDS = 3
_MEMO: dict[str, VerifyResult] = {}


def _prove(name: str) -> VerifyResult:
    return verify_adapter(discover(paths=[], entry_points=False).get(name), seeds=SEEDS)


def bundled_proof(name: str, tmp_path_factory: pytest.TempPathFactory) -> VerifyResult:
    """The bundled adapter ``name`` verified with SEEDS seeds, once in this test run."""
    if name in _MEMO:
        return _MEMO[name]
    result: VerifyResult
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        result = _MEMO[name] = _prove(name)
        return result
    shared = tmp_path_factory.getbasetemp().parent / "bundled-proofs"  # the workers' common folder
    shared.mkdir(exist_ok=True)
    record = shared / f"{name}.pickle"
    with FileLock(f"{record}.lock"):
        if record.exists():
            result = pickle.loads(record.read_bytes())  # written by this test run
        else:
            result = _prove(name)
            record.write_bytes(pickle.dumps(result))
    _MEMO[name] = result
    return result
