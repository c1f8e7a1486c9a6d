"""The sandboxed judge's worker: ``python -m hfadapt.judge.sandbox_worker JOB.json``, started
only by :mod:`hfadapt.judge.sandboxed` inside the OS sandbox. It judges one model with its own
code (``trust_remote_code=True``), offline, unrecorded, and writes the Diagnosis as one JSON
line on its standard output (the parent reads it with a byte cap and validates every field).
After its heavy imports it limits its own address space to what they mapped plus the job's
memory budget. It collects garbage as the ``hfadapt`` command does and, once its line is
written, ends without the interpreter's teardown or the exit handlers (hfadapt.own_process)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hfadapt import own_process
from hfadapt.hub.resolve import HubOptions


def _work(job: dict[str, Any]) -> dict[str, object]:
    from hfadapt.judge import diagnose as judging
    from hfadapt.judge.options import JudgeOptions

    hub = HubOptions(
        revision=job.get("revision"),
        token=False,
        cache_dir=job.get("cache_dir"),
        local_files_only=True,
    )
    options = JudgeOptions(**job["judge"])  # checked again: a bad option is a UsageError
    diag = judging.judge_here(job["model"], options, hub)
    return diag.to_dict()


def main(argv: Sequence[str] | None = None) -> int:
    """Read the job, judge with the model's own code, write the Diagnosis on standard output."""
    from hfadapt.isolation import result_stream

    results = result_stream()
    args = list(sys.argv[1:] if argv is None else argv)
    job = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    own_process.tune()
    import torch  # noqa: F401  heavy imports first: their address space is not the budget
    import transformers  # noqa: F401

    own_process.settle()

    from hfadapt.errors import InputError
    from hfadapt.isolation import limit_self

    limit_self(job)
    try:
        data = _work(job)
    except InputError as exc:  # no model to judge, a bad option: the parent raises it again
        data = {"input_error": {"class": type(exc).__name__, "message": exc.one_line()}}
    results.write(json.dumps(data, default=str) + "\n")
    results.close()
    return 0


if __name__ == "__main__":
    own_process.end(main())
