"""Accepting a proven draft: hfadapt writes a graph adapter folder into the user's adapters
folder (``$HFADAPT_HOME/adapters/<name>/``): the manifest (what it replaces, the rule, where it
applies, system-written provenance with the proof's numbers, the case it was proven on, the
graph's digest), the graph exactly as it was proven, and the drafted source as text for people.
Every field is hfadapt's or bounded; nothing the endpoint wrote becomes code. The folder is
written whole and renamed into place, recorded as proven on this machine (a keyed signature of
its content in ``$HFADAPT_HOME``: :mod:`hfadapt.graphs.proven`), then loaded back through the
registry's own validation; a folder that does not load back is removed."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hfadapt.adapters.graph_adapter import (
    FORMAT,
    MANIFEST,
    SOURCE_FILE,
    VERSION,
    graph_digest,
    load_graph_adapter,
)
from hfadapt.agent.cases import FailureCase
from hfadapt.agent.validate import Validation
from hfadapt.errors import AdapterError
from hfadapt.graphs.proven import record_proven
from hfadapt.untrusted import bounded, clean_text

ENDPOINT_MODEL = re.compile(r"^[A-Za-z0-9._:/@+\-]{1,128}$")


def safe_model_name(value: object, fallback: str = "unknown") -> str:
    """An endpoint's model name as stored: letters, digits and ``._:/@+-``, at most 128; any
    other answer is replaced by ``fallback`` (never written through)."""
    return value if isinstance(value, str) and ENDPOINT_MODEL.match(value) else fallback


def provenance(
    case: FailureCase, validation: Validation, *, endpoint_model: str, attempt_id: int | None
) -> dict[str, Any]:
    """The provenance an accepted draft carries, with the numbers that proved it."""
    steps = {s.step: s for s in validation.steps}
    evidence: dict[str, Any] = {
        "fingerprint": case.fingerprint,
        "rule": case.rule_id,
        "op": case.op,
        "location": case.location,
    }
    if "equivalence" in steps:
        out = steps["equivalence"].output
        evidence["equivalence"] = {
            k: out.get(k)
            for k in (
                "max_rel_err",
                "max_abs_err",
                "inputs",
                "rtol",
                "controls_rejected",
                "fresh_bound",
            )
        }
    for name in ("graph", "device", "end_to_end"):
        if name in steps:
            evidence[name] = steps[name].summary
    if validation.proof is not None:
        evidence["host_share"] = validation.proof.host_share
    return {
        "origin": "agent",
        "author": endpoint_model,
        "date": datetime.now(UTC).date().isoformat(),
        "endpoint_model": endpoint_model,
        "attempt_id": attempt_id,
        "evidence": bounded(evidence, max_depth=5, max_string=1000),
    }


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-").lower()[:60] or "adapter"


def accept_draft(
    code: str,
    case: FailureCase,
    validation: Validation,
    *,
    endpoint_model: str,
    endpoint: str,
    attempt_id: int | None,
    folder: Path | None = None,
    reload: bool = True,
) -> Path:
    """Write the accepted draft as a graph adapter folder and make it live; returns its path."""
    from hfadapt.adapters import registry

    proof = validation.proof
    if proof is None or proof.program is None or "graph.json" not in validation.files:
        raise AdapterError("only a proven graph can be accepted")
    target_dir = folder or registry.user_adapters_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    name = _slug(str(validation.adapter.get("name") or case.name))
    path = target_dir / name
    n = 2
    while path.exists():
        path = target_dir / f"{name}-{n}"
        n += 1
    model_name = safe_model_name(endpoint_model)
    prov = provenance(case, validation, endpoint_model=model_name, attempt_id=attempt_id)
    staging = Path(tempfile.mkdtemp(prefix=".accepting-", dir=target_dir))
    try:
        (staging / "graph.json").write_bytes(validation.files["graph.json"])
        (staging / "constants.safetensors").write_bytes(
            validation.files.get("constants.safetensors", b"")
        )
        (staging / SOURCE_FILE).write_text(
            f"# Drafted by {model_name} (attempt {attempt_id}); kept for people to read. hfadapt never\n"
            "# imports this file: the adapter runs as the graph beside it. To promote it to Python\n"
            f"# code after review: hfadapt adapters export {path.name} --python DIR\n\n" + code,
            encoding="utf-8",
        )
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "name": path.name,
            "kind": "method",
            "target": case.target,
            "rule": case.rule_id,
            "description": clean_text(
                validation.adapter.get("description") or f"drafted for {case.fingerprint}", 500
            ),
            "conditions": {"reads": proof.reads},
            **({"call_site": case.call_site} if case.kind == "function" else {}),
            "provenance": prov,
            "endpoint": clean_text(endpoint, 200),
            "case": bounded(case.to_dict(), max_depth=6, max_string=4000),
            "graph_sha256": graph_digest(staging),
            "host_share": proof.host_share,
        }
        (staging / MANIFEST).write_text(
            json.dumps(manifest, indent=1, sort_keys=True, default=str) + "\n", encoding="utf-8"
        )
        os.replace(staging, path)  # atomic: a registry scan never sees half a folder
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        record_proven(path, path.name, "accepted")
        load_graph_adapter(path, source="user")
    except Exception as exc:
        shutil.rmtree(path, ignore_errors=True)
        raise AdapterError(f"the accepted adapter does not load back from {path}: {exc}") from exc
    if reload:
        registry.default_registry(reload=True)
    return path


__all__ = ["accept_draft", "provenance", "safe_model_name"]
