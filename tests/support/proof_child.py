"""Stand-ins for the proof child's target (hfadapt.agent.graph_proof.child_main), started the
way proofs start it (graph_proof.start_child): it enters the child as child_main does, then says
what it finds. Nothing heavy is imported here at module level, so what the probe finds already
imported was imported before it (by the forkserver's preload)."""

from __future__ import annotations

import os
import sys
import time
from multiprocessing.connection import Connection

__all__ = ["from_a_fork", "probe", "start_probe"]

HEAVY = ("hfadapt.agent.graph_proof", "torch._dynamo")


def probe(conn: Connection, env: dict[str, str], started: float) -> None:
    """Sends which heavy modules were already imported, the environment variable the test
    set, whether the child leads a session of its own, its parent, and the seconds from the
    parent's start to here."""
    preloaded = [m for m in HEAVY if m in sys.modules]
    from hfadapt.agent import graph_proof

    graph_proof.enter_child(env)
    conn.send(
        {
            "preloaded": preloaded,
            "variable": os.environ.get("HFADAPT_TEST_PROOF_CHILD"),
            "own_session": os.getsid(0) == os.getpid(),
            "parent": os.getppid(),
            "me": os.getpid(),
            "seconds": time.time() - started,
        }
    )
    conn.close()


def start_probe(variable: str) -> dict[str, object]:
    """One probe started as a proof child is, with HFADAPT_TEST_PROOF_CHILD set to
    ``variable`` for it; what it sent."""
    import multiprocessing

    from hfadapt.agent import graph_proof

    os.environ["HFADAPT_TEST_PROOF_CHILD"] = variable
    try:
        ours, theirs = multiprocessing.Pipe()
        child = graph_proof.start_child(probe, (theirs, dict(os.environ), time.time()))
        theirs.close()
        if not ours.poll(120):
            raise AssertionError("the probe sent nothing in 120 s")
        seen: dict[str, object] = ours.recv()
        child.join(30)
        if child.exitcode != 0:
            raise AssertionError(f"the probe exited {child.exitcode}")
        return {**seen, "by": os.getpid()}
    finally:
        del os.environ["HFADAPT_TEST_PROOF_CHILD"]


def from_a_fork(conn: Connection) -> None:
    """In a process forked from the test's: a probe started as a proof child, or the error."""
    try:
        conn.send(start_probe("from a fork"))
    except BaseException as exc:  # said to the test, which prints it
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
    conn.close()
