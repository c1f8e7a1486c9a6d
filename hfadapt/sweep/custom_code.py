"""``hfadapt sweep --trust-remote-code``: the models the plan would record ``custom_code`` (their
own code is needed and no native translation applies) are judged one at a time in the OS
sandbox of :mod:`hfadapt.judge.sandboxed`, from this (the driving) process; their code never
runs here or in a sweep worker. A model whose code is not in the local HF cache cannot be
fetched from inside the sandbox (no network) and is recorded ``load_failed``, saying so."""

from __future__ import annotations

from typing import Any

from hfadapt import verdicts
from hfadapt.errors import InputError
from hfadapt.hub.resolve import HubOptions
from hfadapt.judge import sandboxed
from hfadapt.judge.diagnosis import Diagnosis
from hfadapt.judge.evidence_types import read_evidence
from hfadapt.judge.options import JudgeOptions


def row_of(diag: Diagnosis, model_id: str) -> dict[str, object]:
    """The Run columns of a sandboxed diagnosis, as a sweep's direct row."""
    row = diag.to_run_row().model_dump(exclude={"id", "sweep_id"})
    row["model_id"] = model_id
    return _judged_in_sandbox(row)


def _judged_in_sandbox(row: dict[str, object]) -> dict[str, object]:
    """``row`` (changed in place) with its evidence saying it was judged in the sandbox."""
    evidence = read_evidence(row.get("evidence"))
    evidence["sweep"] = {"role": "direct", "judged_in": "sandbox"}
    row["evidence"] = evidence
    return row


def _not_in_cache(row: dict[str, object], exc: InputError, structural: bool) -> dict[str, object]:
    """The row of a model whose code is not in the HF cache: no network in the sandbox, so it
    does not load."""
    judged = f"{'[structural] ' if structural else ''}judged with its own code in the sandbox"
    failed = {"verdict": verdicts.LOAD_FAILED, "error": type(exc).__name__}
    return _judged_in_sandbox({**row, **failed, "reason": f"{judged}: {exc.one_line()}"})


def judge_custom_code(
    direct: list[dict[str, Any]],
    skip: set[str] | dict[str, Any],
    judge: JudgeOptions,
) -> list[dict[str, Any]]:
    """``direct`` with every ``custom_code`` row not in ``skip`` replaced by the sandbox's
    verdict (ValueError-free: a sandbox that fails gives a worker_crashed/timeout row)."""
    out: list[dict[str, Any]] = []
    for row in direct:
        model_id = row["model_id"]
        if row["verdict"] != verdicts.CUSTOM_CODE or model_id in skip:
            out.append(row)
            continue
        try:
            diag = sandboxed.judge(
                model_id,
                judge.but(localize=False, trust_remote_code=True),
                hub=HubOptions(local_files_only=True),
            )
        except InputError as exc:  # not in the HF cache (no network in the sandbox): no model
            out.append(_not_in_cache(row, exc, judge.structural))
            continue
        diag.finished()
        out.append(row_of(diag, model_id))
    return out
