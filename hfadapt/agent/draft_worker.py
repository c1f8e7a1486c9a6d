"""The sandbox process: ``python -m hfadapt.agent.draft_worker JOB.json``. Imports the heavy
libraries, then limits itself (address space, CPU time, file size, no core dumps), installs an
audit hook that refuses processes, sockets and writes outside its scratch space, and only then
loads the draft and runs the job's steps. It reports on its standard output, one JSON line per
record (a step starting, a step's result, a result file as base64); anything else the draft or
a library prints goes to standard error. The parent trusts none of it: it validates every
record and proves the graph itself. It collects garbage as the ``hfadapt`` command does and,
once its records are written, ends without the interpreter's teardown or the exit handlers
(hfadapt.own_process): nothing the draft registered runs after its results."""

from __future__ import annotations

import json
import sys
import time
import traceback

from hfadapt import own_process, settings
from hfadapt.isolation import guard, limit_self, result_stream


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:800]


def main(argv: list[str]) -> int:
    results = result_stream()

    def emit(record: dict[str, object]) -> None:
        results.write(json.dumps(record, default=str) + "\n")
        results.flush()

    with open(argv[1], encoding="utf-8") as fh:
        job = json.load(fh)
    own_process.tune()
    import torch  # heavy imports first: their address space is not the draft's budget

    torch.set_num_threads(int(job.get("threads", 1)))
    if job.get("import_transformers", True):
        import transformers  # noqa: F401

    from hfadapt.agent import steps

    own_process.settle()

    limit_self(job)
    guard(settings.scratch_dir())
    ctx = steps.Context(job, emit)
    for name in job["steps"]:
        emit({"start": name})
        start = time.monotonic()
        try:
            status, summary, output = steps.STEPS[name](ctx)
        except MemoryError:
            status, summary, output = (
                "fail",
                f"exceeded the memory limit of {job.get('memory_mb')} MB (MemoryError)",
                {},
            )
        except Exception as exc:  # the draft's failure is the step's finding
            tb = traceback.format_exc().strip().splitlines()[-12:]
            status, summary, output = "fail", _one_line(exc), {"traceback": "\n".join(tb)}
        emit(
            {
                "step": name,
                "status": status,
                "summary": summary,
                "output": output,
                "seconds": round(time.monotonic() - start, 3),
            }
        )
        if status not in ("pass", "skip"):
            break
    results.close()
    return 0


if __name__ == "__main__":
    own_process.end(main(sys.argv))
