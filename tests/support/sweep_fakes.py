"""Stand-in sweep workers for tests (importable by name in spawned worker processes and Ray
tasks): fast, deterministic verdicts; a crash or a hang on chosen models (named in
$HFADAPT_FAKE_CRASH / $HFADAPT_FAKE_HANG, comma-separated); an optional delay per unit
($HFADAPT_FAKE_SLEEP seconds); and a CPU stand-in device runner for the real worker."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from typing import Any

from hfadapt.judge.evidence import level_of_source
from hfadapt.sweep.worker import Outcome, Task

FINGERPRINTS = ("aaaaaaaaaaaa", "bbbbbbbbbbbb")


def fake_verdict(key: str) -> str:
    """pass for two keys in three, lowering_failed otherwise: a pure function of the key."""
    return "pass" if int(hashlib.sha1(key.encode()).hexdigest(), 16) % 3 else "lowering_failed"


def _listed(var: str, model_id: str) -> bool:
    return model_id in [m for m in os.environ.get(var, "").split(",") if m]


def fake_judge(task: Task) -> Outcome:
    """Judge without a device: the verdict is a function of the unit key."""
    if _listed("HFADAPT_FAKE_CRASH", task.model_id):
        os.kill(os.getpid(), signal.SIGSEGV)
    if _listed("HFADAPT_FAKE_HANG", task.model_id):
        time.sleep(3600)
    delay = float(os.environ.get("HFADAPT_FAKE_SLEEP", "0") or 0)
    if delay:
        time.sleep(delay)
    verdict = fake_verdict(task.key)
    failed = verdict != "pass"
    fp = FINGERPRINTS[int(hashlib.sha1(task.key.encode()).hexdigest(), 16) % 2]
    row: dict[str, Any] = {
        "verdict": verdict,
        "reason": f"fake verdict of {task.key}",
        "mode": task.judge.mode.value,
        "execution": task.judge.execution.value,
        "dtype": task.judge.dtype_name,
        "min_token_cosine": 0.5 if failed else 0.999,
        "fingerprints": [fp] if failed else [],
        "violations": [
            {"fingerprint": fp, "rule_id": "R1", "op": "aten::pow.Tensor_Scalar", "message": "m"}
        ]
        if failed
        else [],
        "adapters": [],
        # as the real worker: the level of the config the representative was judged on
        "evidence_level": level.value if (level := level_of_source(task.config_source)) else None,
        # what the worker was told to leave out, so a test sees the option reach it
        "evidence": {
            "fake": True,
            "pid": os.getpid(),
            "without_adapters": list(task.judge.without_adapters),
        },
    }
    return Outcome(task.key, task.model_id, verdict, row["reason"], row)


def raising_judge(task: Task) -> Outcome:
    raise RuntimeError(f"boom on {task.model_id}")


def cpu_runner(model: Any, inputs: dict[str, Any], **kwargs: Any) -> Any:
    """The conftest CPU fp16 stand-in for the device runner, importable by name."""
    from support.device import cpu_fp16_runner

    return cpu_fp16_runner(model, inputs, **kwargs)


def hog_judge(task: Task) -> Outcome:
    """Allocates 4 GB for models named in $HFADAPT_FAKE_HOG (a worker under a lower limit)."""
    if _listed("HFADAPT_FAKE_HOG", task.model_id):
        block = bytearray(4 * 2**30)
        block[-1] = 1
    return fake_judge(task)


def narrow_fails_runner(model: Any, inputs: dict[str, Any], **kwargs: Any) -> Any:
    """The CPU stand-in, with a numeric fault in models narrower than 200 (a narrowed instance):
    its last hidden state is zeroed in every other channel."""
    run = cpu_runner(model, inputs, **kwargs)
    if model.config.hidden_size < 200:
        hidden = run.outputs.last_hidden_state.clone()
        hidden[..., ::2] = 0
        run.outputs.last_hidden_state = hidden
    return run


class _Cycle:
    """An object that refers to itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


# weak references to the cycles earlier units of this worker process left behind
_LEFT: list[Any] = []


def gc_probe_judge(task: Task) -> Outcome:
    """``fake_judge``, and what the process's garbage collector looks like to the unit: its
    thresholds, how many objects are frozen, and how many of the reference cycles that earlier
    units left behind are still alive (each unit leaves one)."""
    import gc
    import weakref

    alive = sum(ref() is not None for ref in _LEFT)
    _LEFT.append(weakref.ref(_Cycle()))
    out = fake_judge(task)
    out.row["evidence"]["gc"] = {
        "threshold": list(gc.get_threshold()),
        "frozen": gc.get_freeze_count(),
        "earlier_cycles_alive": alive,
        "units_before": len(_LEFT) - 1,
    }
    return out
