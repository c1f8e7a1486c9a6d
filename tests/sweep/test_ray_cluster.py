"""``hfadapt sweep --executor ray --address`` against a real two-node Ray cluster (a head node
and a second node, ``ray start`` each, on 127.0.0.1): the units run on both nodes, the verdicts
equal the local executor's, and the cluster is gone afterwards, whatever happened.

The cluster lives in network and PID namespaces of its own (tests/support/ray_cluster.py says why):
skipped where namespaces cannot be made, except under CI=true, where that is a failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.sweeps import store_crawl, sweep_records

from hfadapt.db.engine import get_engine
from hfadapt.sweep.store import done_rows

pytest.importorskip("ray", reason="Ray is not installed: pip install '.[ray]'")

TESTS = Path(__file__).resolve().parents[1]
TOP = 8  # 8 models: 3 units of work (5 BERTs, bert-relu, minilm), one custom_code, no task


def namespaces() -> list[str]:
    """The ``unshare`` prefix that runs a command in new network and PID namespaces (as root,
    or mapped to root in a user namespace), or a skip (a failure under CI=true)."""
    prefix = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc"]
    if os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-root-user"]
    why = None
    if shutil.which("unshare") is None:
        why = "unshare (util-linux) is not installed"
    else:
        probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=30)
        if probe.returncode != 0:
            why = f"cannot make network and PID namespaces: {probe.stderr.strip()[:200]}"
    if why is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the two-node Ray cluster test cannot run in CI: {why}")
        pytest.skip(why)
    return prefix


def _sweep_db(path: Path) -> Path:
    engine = get_engine(str(path))
    store_crawl(engine, sweep_records("small"))
    engine.dispose()
    return path


def _hfadapt(*args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("hfadapt")), *args]


@pytest.mark.slow
def test_sweep_on_a_two_node_cluster_uses_both_nodes_and_matches_local(tmp_path: Path) -> None:
    prefix = namespaces()
    on_ray, local = _sweep_db(tmp_path / "ray.db"), _sweep_db(tmp_path / "local.db")
    nodes_file = tmp_path / "nodes.json"
    # Not the RAY_* variables an in-process ray.init of another test left in this process
    # (its address, its session): the cluster's nodes would join that session instead.
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p),
    }
    sweep = ["sweep", "--top", str(TOP), "--timeout", "300", "--json"]
    cluster = subprocess.run(
        [*prefix, sys.executable, str(TESTS / "support" / "ray_cluster.py"), str(nodes_file), "--",
         *_hfadapt(*sweep, "--db", str(on_ray), "--executor", "ray", "--address", "{address}")],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    log = nodes_file.with_suffix(".log")
    logs = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    assert cluster.returncode == 0, (cluster.stdout[-2000:], cluster.stderr[-3000:], logs)
    result = json.loads(cluster.stdout[cluster.stdout.index("{") :])
    cluster_nodes = json.loads(nodes_file.read_text())
    print(f"\nray: {result['seconds']} s {result['counts']}; nodes {cluster_nodes}")
    assert (result["executor"], result["models"], result["judged"]) == ("ray", TOP, 3), result
    assert result["workers"] == 2, result  # the cluster's CPUs (one per node), by default

    # The cluster is gone: no process of it outlived the command (its PID namespace ended).
    left = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(cluster_nodes["address"]) not in left, [
        line for line in left.splitlines() if cluster_nodes["address"] in line
    ]

    # Every unit was judged on a node of this cluster, and both nodes judged some.
    engine = get_engine(str(on_ray))
    rows = done_rows(engine, result["sweep_id"])
    engine.dispose()
    reps = {m: r["evidence"]["sweep"] for m, r in rows.items() if r.get("evidence", {}).get("sweep", {}).get("role") == "representative"}  # fmt: skip
    used = {ev.get("worker_node") for ev in reps.values()}
    known = {n["node_id"] for n in cluster_nodes["nodes"]}
    assert len(reps) == 3 and used <= known and len(used) == 2, (reps, known)
    assert all(n["address"] == "127.0.0.1" for n in cluster_nodes["nodes"]), cluster_nodes

    # The same verdicts as the local executor's, model by model.
    here = subprocess.run(
        _hfadapt(*sweep, "--db", str(local), "--executor", "local"),
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert here.returncode == 0, here.stderr[-3000:]
    local_result = json.loads(here.stdout[here.stdout.index("{") :])
    engine = get_engine(str(local))
    local_rows = done_rows(engine, local_result["sweep_id"])
    engine.dispose()

    def verdicts(found: dict[str, Any]) -> dict[str, str]:
        return {m: r["verdict"] for m, r in found.items()}

    assert verdicts(rows) == verdicts(local_rows), (verdicts(rows), verdicts(local_rows))
    assert len(rows) == TOP and "pass" in verdicts(rows).values(), verdicts(rows)
