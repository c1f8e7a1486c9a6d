"""Judging a model whose own code must run (``trust_remote_code=True``) only inside the OS
sandbox of :mod:`hfadapt.isolation`: no network, no secrets, the root read-only, a private
tmpfs capped in size, a memory budget. The parent never imports the model's code. It writes a
job, starts ``python -m hfadapt.judge.sandbox_worker JOB.json`` through ``isolation.spawn``, and
the worker does the whole judging there (load with ``trust_remote_code=True``, CPU reference,
device run, metrics, localization) and writes the Diagnosis as JSON on its standard output,
which the parent reads with a byte cap. The parent parses it with bounds (size, nesting), keeps
only the fields it knows, each checked and cut, puts its own model id on it, and returns a
:class:`~hfadapt.judge.diagnosis.Diagnosis` that ``diagnose`` records.

Without bubblewrap the parent refuses (:class:`~hfadapt.errors.IsolationUnavailableError`,
exit 2) unless the caller passed ``unsafe_no_isolation=True``; such a run is recorded with
``evidence.sandbox.isolated == False``. See docs/remote-code.md."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hfadapt import isolation, settings, verdicts
from hfadapt.db.tables import utcnow
from hfadapt.errors import SandboxError, UsageError, option
from hfadapt.hub.resolve import HubOptions
from hfadapt.judge.diagnosis import Diagnosis, next_step, versions_of, write_run
from hfadapt.judge.environment import KEYS as ENVIRONMENT_KEYS
from hfadapt.judge.evidence_types import SandboxEvidence, read_evidence
from hfadapt.judge.localize import Divergence
from hfadapt.judge.metrics import Metrics
from hfadapt.judge.options import JudgeOptions
from hfadapt.judge.output_metrics import OutputMetrics
from hfadapt.spyre.rules.lowering_report import LoweringReport
from hfadapt.untrusted import bounded, clean_text, known_secrets, parse_json, redact

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

DEFAULT_TIMEOUT_S = 900.0
DEFAULT_MEMORY_MB = 8192  # what the worker may map after its imports (the model, activations)
TMPFS_MB = 1024  # its /tmp: the model's copied code, compile caches
MAX_RESULT_BYTES = 32 * 1024 * 1024
_STR_FIELDS = ("model_id", "reason", "execution", "dtype", "next_step")
_OPTIONAL_STR = ("revision", "signature", "model_type", "config_source", "evidence_level", "error")
# versions kept from the worker's result: room for every key of the environment and more
# (hfadapt.judge.environment.KEYS), never an unbounded dict
MAX_VERSIONS = 2 * len(ENVIRONMENT_KEYS)


def _package_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _env(isolated: bool, scratch: Path) -> dict[str, str]:
    """The worker's whole environment: the allowlist of :func:`isolation.sandbox_env`, offline
    Hub settings, and scratch places for the model's copied code and compile caches."""
    tmp = "/tmp" if isolated else str(scratch)
    # isolated: only the folders the sandbox may show (never the working or home folder)
    path = isolation.python_path() if isolated else [str(_package_root()), *settings.python_path()]
    extra = {
        "PYTHONPATH": os.pathsep.join(path),
        settings.HFADAPT_SANDBOX.name: "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": settings.threads() or "1",
        # transformers copies remote code here before importing it: never the user's cache
        "HF_MODULES_CACHE": f"{tmp}/hf_modules",
        "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
        # untrusted code never writes graphs other processes would compile from, nor
        # references they would judge against
        "HFADAPT_COMPILE_CACHE": "0",
        "HFADAPT_REFERENCE_CACHE": "0",
    }
    for variable in (
        settings.HFADAPT_HOME,
        settings.HFADAPT_ADAPTERS_PATH,
        settings.HFADAPT_CACHE_DIR,
    ):
        value = variable.value()
        if value:
            extra[variable.name] = value
    from huggingface_hub import constants

    # Only the hub cache (model files): HF_HOME, where the login token lives, is a scratch
    # folder inside the sandbox.
    extra["HF_HOME"] = f"{tmp}/hf_home"
    extra["HF_HUB_CACHE"] = str(constants.HF_HUB_CACHE)
    env = isolation.sandbox_env(extra)
    if not isolated:
        env.update(HOME=f"{tmp}/home", TMPDIR=tmp)
    return env


def worker_readable_paths(env: dict[str, str]) -> list[Path]:
    """What the sandboxed judge reads besides the interpreter, hfadapt's package, the shown
    ``$PYTHONPATH`` folders and the system (:func:`hfadapt.isolation.mounts`): the hub cache,
    hfadapt's adapter folders and the compiled DL16 kernels."""
    from hfadapt.adapters.registry import user_adapters_dir
    from hfadapt.spyre.numerics.dl16_native import cache_dir

    paths = [Path(env["HF_HUB_CACHE"])] if env.get("HF_HUB_CACHE") else []
    paths += [Path(p) for p in env.get("HFADAPT_ADAPTERS_PATH", "").split(os.pathsep) if p]
    paths += [user_adapters_dir(), cache_dir()]
    return paths


def _readable(env: dict[str, str], model: str, cache_dir: str | None) -> list[Path]:
    """The worker's common reads, plus the model's cache folder and local folder."""
    paths = worker_readable_paths(env)
    if cache_dir:
        paths.append(Path(cache_dir))
    if os.path.isabs(model):
        paths.append(Path(model))
    return [p.resolve() for p in paths]


def judge_and_record(
    model_ref: str | os.PathLike[str],
    engine: Engine | None,
    options: JudgeOptions,
    *,
    runner: object,
    hub: HubOptions,
) -> Diagnosis:
    """What ``diagnose(..., trust_remote_code=True)`` does: judge in the sandbox (:func:`judge`),
    then record the validated Diagnosis as one Run row (``engine`` None: not recorded)."""
    if runner is not None:
        raise UsageError(
            "runner: a custom device runner cannot run inside the sandbox that "
            "trust_remote_code=True judges in; pass runner=None"
        )
    diag = judge(os.fspath(model_ref), options, hub=hub)
    if not diag.next_step:
        diag.next_step = next_step(diag)
    diag.finished()  # total: the parent's wall time, sandbox start-up included
    if engine is not None:
        diag.run_id = write_run(diag, engine)
    return diag


def judge(
    model_ref: str,
    options: JudgeOptions,
    *,
    hub: HubOptions,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
) -> Diagnosis:
    """Judge ``model_ref`` with its own code, in a sandboxed worker, as ``options`` say; the
    Diagnosis it returns is rebuilt from validated data (not yet recorded). Raises
    IsolationUnavailableError when bubblewrap cannot isolate it and
    ``options.unsafe_no_isolation`` is False."""
    isolated = isolation.require_isolation(
        unsafe=options.unsafe_no_isolation,
        what=f"the model's own code ({option('trust_remote_code')})",
    )
    local = Path(model_ref).expanduser()
    model = str(local.resolve()) if local.exists() else model_ref
    base = Path(tempfile.mkdtemp(prefix="hfadapt-remote-"))
    inputs, scratch = base / "in", base / "scratch"
    inputs.mkdir()
    scratch.mkdir()
    seen_in = Path(isolation.INPUT_DIR) if isolated else inputs
    job = {
        "model": model,
        "judge": options.to_dict(),
        "revision": hub.revision,
        "cache_dir": hub.cache_dir,
        "memory_mb": memory_mb,
        "cpu_seconds": int(timeout_s) + 5,
    }  # no token: the sandbox has no network and gets no secret
    try:
        (inputs / "job.json").write_text(json.dumps(job), encoding="utf-8")
        env = _env(isolated, scratch)
        command = [sys.executable, "-m", "hfadapt.judge.sandbox_worker", str(seen_in / "job.json")]
        start, started_at = time.monotonic(), utcnow()
        try:
            proc = isolation.spawn(
                command,
                inputs=inputs,
                env=env,
                limits=isolation.Limits(cpu_seconds=int(timeout_s) + 5, tmpfs_mb=TMPFS_MB),
                isolate=isolated,
                readable=_readable(env, model, hub.cache_dir),
                cwd=scratch,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start the sandboxed judge: {exc}") from exc
        diag = _result(model_ref, options, proc, start, timeout_s, isolated)
        diag.started_at = started_at
        return diag
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _result(
    model_ref: str,
    options: JudgeOptions,
    proc: Any,
    start: float,
    timeout_s: float,
    isolated: bool,
) -> Diagnosis:
    """The worker's Diagnosis, validated; a worker_crashed/timeout one when it left none."""
    done = isolation.collect(proc, timeout_s, max_stdout=MAX_RESULT_BYTES)
    seconds = round(time.monotonic() - start, 3)
    tail = _scrub(clean_text("\n".join(done.stderr_tail.strip().splitlines()[-15:]), 4000))
    sandbox: SandboxEvidence = {"isolated": isolated, "exit_code": done.code, "seconds": seconds}
    raw = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else None
    if raw is None or done.timed_out or done.overflow:
        why = done.overflow or tail
        return _no_result(model_ref, options, done.timed_out, timeout_s, sandbox, why)
    try:
        data = parse_json(_scrub(raw.decode("utf-8", errors="replace")), max_bytes=MAX_RESULT_BYTES)
        _raise_input_error(data)
        diag = from_data(data)
    except (ValueError, TypeError, KeyError) as exc:
        why = f"the sandboxed judge left an invalid result: {' '.join(str(exc).split())[:200]}"
        return _no_result(model_ref, options, False, timeout_s, sandbox, why)
    diag.model_id = model_ref  # the parent's id for the model it asked about, never the worker's
    diag.evidence["sandbox"] = sandbox
    if "total" in diag.timings:  # the worker's own total; "total" becomes the parent's
        diag.timings["in_sandbox"] = diag.timings.pop("total")
    return diag


def _raise_input_error(data: object) -> None:
    """The worker found bad input (no such model, a bad option): raised here as the same
    kind of error an unsandboxed diagnose raises, with the worker's (scrubbed) message."""
    from hfadapt import errors

    if not isinstance(data, dict) or not isinstance(data.get("input_error"), dict):
        return
    name, message = data["input_error"].get("class"), data["input_error"].get("message")
    kind = getattr(errors, name, None) if isinstance(name, str) else None
    if not (isinstance(kind, type) and issubclass(kind, errors.InputError)):
        kind = errors.InputError
    text = str(message)[:500] if message else "bad input"
    raise kind(text.split(": ", 1)[1] if text.startswith(f"{name}: ") else text)


def _scrub(text: str) -> str:
    """A second fence: any value of a credential-named variable of this process is cut out
    of what the worker returned (the worker never had them; this makes sure)."""
    for key, value in settings.environment().items():
        if isolation.SECRET_NAME.search(key) and len(value) >= 6:
            text = text.replace(value, "[redacted]")
    return redact(text, known_secrets())


def _no_result(
    model: str,
    options: JudgeOptions,
    timed_out: bool,
    timeout_s: float,
    sandbox: SandboxEvidence,
    why: str,
) -> Diagnosis:
    verdict = verdicts.WORKER_TIMEOUT if timed_out else verdicts.WORKER_CRASHED
    reason = (
        f"the sandboxed judge exceeded {timeout_s:g} s and was killed"
        if timed_out
        else f"the sandboxed judge ended without a result (exit {sandbox['exit_code']})"
    )
    last = why.strip().splitlines()[-1] if why.strip() else ""
    from hfadapt.spyre.rules.profile import load_profile

    diag = Diagnosis(
        model_id=model,
        verdict=verdict,
        reason=f"{reason}: {last[:300]}" if last else reason,
        mode=options.mode.value,
        execution=options.execution.value,
        dtype=options.dtype_name,
        structural=options.structural,
        versions=versions_of(load_profile(options.profile)),  # where it was attempted
    )
    diag.evidence["sandbox"] = {**sandbox, "stderr_tail": why[-4000:]}
    return diag


def _str(data: dict[str, object], key: str, *, optional: bool = False) -> str | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{key} is {type(value).__name__}, not a string")
    return clean_text(value, 4000)


def _known(cls: Any, data: Any) -> Any:
    """A dataclass rebuilt from a dict: only its own fields, each a JSON scalar or list."""
    if data is None:
        return None
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__} is {type(data).__name__}, not an object")
    names = {f.name for f in fields(cls)}
    kept = {k: v for k, v in data.items() if k in names}
    for key, value in kept.items():
        if isinstance(value, dict):
            raise TypeError(f"{cls.__name__}.{key} is an object")
    if isinstance(kept.get("worst_token"), list):
        kept["worst_token"] = tuple(kept["worst_token"])
    return cls(**kept)


def from_data(data: object) -> Diagnosis:
    """The Diagnosis the sandboxed worker wrote, checked field by field (ValueError/TypeError on
    anything out of shape: an unknown verdict, a wrong type, a missing field)."""
    if not isinstance(data, dict):
        raise TypeError("the result is not a JSON object")
    verdict = _str(data, "verdict")
    if verdict not in verdicts.ALL:
        raise ValueError(f"unknown verdict {verdict!r}")
    mode = _str(data, "mode")
    if mode not in ("full", "structural"):
        raise ValueError(f"unknown mode {mode!r}")
    exit_code = data.get("exit_code")
    if exit_code not in (0, 1, 2) or isinstance(exit_code, bool):
        raise ValueError(f"exit_code {exit_code!r} is not 0, 1 or 2")
    if not isinstance(data.get("structural"), bool):
        raise TypeError("structural is not a boolean")
    diag = Diagnosis(
        verdict=verdict,
        mode=mode,
        structural=data["structural"],
        exit_code=exit_code,
        **{k: _str(data, k) for k in _STR_FIELDS},  # type: ignore[arg-type]
    )
    for key in _OPTIONAL_STR:
        setattr(diag, key, _str(data, key, optional=True))
    diag.adapters = _strings(data.get("adapters", []), "adapters")
    diag.versions = {
        clean_text(k, 60): clean_text(v, 120)
        for k, v in list(_obj(data.get("versions"), "versions").items())[:MAX_VERSIONS]
    }
    diag.timings = {
        k: float(v)
        for k, v in _obj(data.get("timings"), "timings").items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    diag.signature_fields = data.get("signature_fields")
    if diag.signature_fields is not None:
        diag.signature_fields = bounded(
            _obj(diag.signature_fields, "signature_fields"), max_depth=4
        )
    diag.evidence = read_evidence(
        bounded(_obj(data.get("evidence"), "evidence"), max_depth=8, max_items=500)
    )
    metrics = data.get("metrics")
    if isinstance(metrics, dict):
        metrics = {k: v for k, v in metrics.items() if k != "passed"}
    diag.metrics = _known(Metrics, metrics)
    if diag.metrics is not None:  # the pipeline's outputs, each judged in its metric
        outputs: object = diag.metrics.outputs
        if not isinstance(outputs, list):
            raise TypeError(f"Metrics.outputs is {type(outputs).__name__}, not a list")
        diag.metrics.outputs = [OutputMetrics.from_dict(o) for o in outputs]
    diag.divergence = _known(Divergence, data.get("divergence"))
    report = data.get("report")
    diag.report = LoweringReport.from_dict(_obj(report, "report")) if report else None
    if verdict == verdicts.PASS and diag.metrics is None:
        raise ValueError("verdict pass without metrics")
    if diag.metrics is not None and diag.metrics.passed != (verdict == verdicts.PASS):
        # a structural run fails on a fired device defect whatever its metrics say
        fired = diag.structural and bool(diag.evidence.get("defects"))
        if not (fired and verdict == verdicts.VERIFICATION_FAILED):
            raise ValueError(f"verdict {verdict} disagrees with its metrics")
    return diag


def _obj(value: object, name: str) -> dict[str, object]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{name} is {type(value).__name__}, not an object")
    return value


def _strings(value: object, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name} is not a list of strings")
    return [clean_text(v, 200) for v in value[:200]]
