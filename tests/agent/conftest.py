"""The drafting agent: endpoint client, prompts, policy, sandbox, the loop, containment. The shared
fixtures this part's tests use, from tests/support, and the reference self-check run once."""

from __future__ import annotations

import pytest
from support.device import spyre
from support.drafting import (
    ReferenceEval,
    read_reference_eval,
    record_reference_eval,
    run_reference_eval,
)
from support.once import once_per_run
from support.timing import sleeps

__all__ = ["proofs_in_process", "reference_eval", "sleeps", "spyre"]


@pytest.fixture
def proofs_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph's proofs (equivalence, device, end to end) run in the test's process instead
    of a fresh child (``ProofLimits(in_child=False)``): the same steps on the same graph, for a
    test whose subject is not the child (the loop, feedback, records, a step's numbers). That
    the child proves the same and holds its limits is tests/agent/test_agent_proof_bounds.py;
    the reference run, containment, the sandbox's reach and the compiled `hfadapt draft` runs
    keep the child."""
    from dataclasses import replace

    from hfadapt.agent import graph_proof

    limits = replace(graph_proof.DEFAULT_LIMITS, in_child=False)
    monkeypatch.setattr(graph_proof, "DEFAULT_LIMITS", limits)


@pytest.fixture(scope="session")
def reference_eval(tmp_path_factory: pytest.TempPathFactory) -> ReferenceEval:
    """``hfadapt agent-eval --reference --json`` in a fresh process, once per test session:
    every test that asserts on a reference answer's acceptance or numbers reads this one run
    (~2.5 minutes of a core). Under pytest-xdist each worker has its own session: the first
    worker to need it runs it in the workers' common temp folder under a lock and records what
    it printed; a worker that needs it later waits for the lock and reads the record."""
    return once_per_run(
        tmp_path_factory,
        "reference-eval",
        run_reference_eval,
        record_reference_eval,
        read_reference_eval,
    )
