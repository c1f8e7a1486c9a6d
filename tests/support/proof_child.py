"""A stand-in for the proof child's target (hfadapt.agent.graph_proof.child_main), run by the
proofs' forkserver: it enters the child as child_main does, then says what it finds."""

from __future__ import annotations

import os
import sys
import time
from multiprocessing.connection import Connection

from hfadapt.agent import graph_proof

__all__ = ["probe"]


def probe(conn: Connection, env: dict[str, str], started: float) -> None:
    """Sends which heavy modules were already imported, the environment variable the test
    set, whether the child leads a session of its own, its parent, and the seconds from the
    parent's start() to here."""
    preloaded = [m for m in ("hfadapt.agent.graph_proof", "torch._dynamo") if m in sys.modules]
    graph_proof.enter_child(env)
    conn.send(
        {
            "preloaded": preloaded,
            "variable": os.environ.get("HFADAPT_TEST_PROOF_CHILD"),
            "own_session": os.getsid(0) == os.getpid(),
            "parent": os.getppid(),
            "seconds": time.time() - started,
        }
    )
    conn.close()
