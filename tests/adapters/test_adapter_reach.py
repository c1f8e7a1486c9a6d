"""Every bundled adapter's rewritten code actually runs, eager and compiled, with transformers'
``kernels`` integration present and hidden (tests/support/adapter_reach.py, in a fresh process
each). transformers 5.25 with ``kernels`` wrapped ``apply_rotary_pos_emb`` in a hub-kernel
module: the RoPE adapters still dispatched (their own function ran) while the swap inside did
nothing, so a call counter on the adapter alone proves nothing: the names ``rebind`` swaps are
counted too. One process per ``kernels`` state (transformers decorates its helpers at import)
walks both executions, compiled first, then eager: the four conditions, two interpreter
launches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hfadapt.adapters.registry import default_registry

TESTS = Path(__file__).resolve().parents[1]

# What the RoPE rewrite must reach in every family that rotates in the model's dtype: the
# attention forward's apply_rotary_pos_emb, and inside it the matmul rotate_half.
ROPE_SWAPS = ("apply_rotary_pos_emb", "rotate_half")
FP32_ROTATION = {"rope-rotate-matmul-modernbert"}  # its own rotation, no rotate_half swap


EXECUTIONS = ("compile", "eager")  # compiled first: its walk as cold as in a process alone


def _walk(hide_kernels: bool) -> tuple[dict[str, Any], dict[str, dict[str, dict[str, Any]]]]:
    """The walk's head line and, per execution, its row of each adapter."""
    code = "from support.adapter_reach import main; main()"
    argv = [sys.executable, "-c", code, ",".join(EXECUTIONS)]
    argv += ["hide-kernels"] if hide_kernels else []
    env = {**os.environ, "PYTHONPATH": str(TESTS), "OMP_NUM_THREADS": "1"}
    if hide_kernels:  # transformers 5.25's from_pretrained refuses to load without kernels
        env["USE_HUB_KERNELS"] = "0"  # unless told not to use them (its documented switch)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900, check=False)
    assert done.returncode == 0, f"the walk failed: {done.stderr[-3000:]}"
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    head = lines[0]
    by_execution: dict[str, dict[str, dict[str, Any]]] = {e: {} for e in EXECUTIONS}
    for r in lines[1:]:
        by_execution[r["execution"]][r["adapter"]] = r
    return head, by_execution


def _problems(rows: dict[str, dict[str, Any]]) -> list[str]:
    problems = []
    for name, r in rows.items():
        if "error" in r or not r["applied"] or r["calls"] < 1:
            problems.append(f"{name}: {r}")
            continue
        by_function: dict[str, int] = {}
        for label, n in r["swaps"].items():
            where = label.split(": ", 1)[0]
            by_function[where] = by_function.get(where, 0) + n
        idle = [f for f, n in by_function.items() if n == 0]
        if idle:  # a copy of stock code none of whose swapped names was ever called
            problems.append(f"{name}: no swapped name called in {idle}: {r['swaps']}")
        if name.startswith("rope-rotate-matmul-") and name not in FP32_ROTATION:
            swapped = {label.split(": ", 1)[1] for label, n in r["swaps"].items() if n > 0}
            missing = [s for s in ROPE_SWAPS if s not in swapped]
            if missing:
                problems.append(f"{name}: {missing} never called: {r['swaps']}")
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("hide_kernels", [False, True], ids=["with-kernels", "without-kernels"])
def test_every_bundled_adapters_rewritten_code_runs_eager_and_compiled(hide_kernels: bool) -> None:
    head, by_execution = _walk(hide_kernels)
    assert head["kernels"] is (not hide_kernels), f"kernels integration state: {head}"
    bundled = {a.name for a in default_registry().adapters if a.source == "bundled"}
    problems = []
    for execution, rows in by_execution.items():
        if set(rows) != bundled:
            problems.append(f"{execution}: walked {sorted(rows)}; bundled {sorted(bundled)}")
        problems += [f"{execution}: {p}" for p in _problems(rows)]
    assert not problems, f"{head}:\n" + "\n".join(problems)
