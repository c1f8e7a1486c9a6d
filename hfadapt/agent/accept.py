"""Accepting a proven draft: write it to the user's adapters folder with a provenance header
(endpoint model, attempt id, date, evidence) and ``provenance=`` on its ``@adapter``, then
reload the registry so it is live. A file that does not load back is removed, never left."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hfadapt.adapters.registry import AGENT_MARKER
from hfadapt.agent.cases import FailureCase
from hfadapt.agent.validate import Validation
from hfadapt.errors import AdapterError


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
            for k in ("max_rel_err", "max_abs_err", "inputs", "rtol", "controls_rejected")
        }
    for name in ("device", "end_to_end"):
        if name in steps:
            evidence[name] = steps[name].summary
    return {
        "origin": "agent",
        "author": endpoint_model,
        "date": datetime.now(UTC).date().isoformat(),
        "endpoint_model": endpoint_model,
        "attempt_id": attempt_id,
        "evidence": evidence,
    }


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_").lower() or "adapter"


def with_provenance(code: str, prov: dict[str, Any]) -> str:
    """The draft with ``_PROVENANCE = {...}`` before its ``@adapter`` and ``provenance=`` in it."""
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for dec in node.decorator_list:
            func = getattr(dec, "func", None)
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            if not (isinstance(dec, ast.Call) and name == "adapter"):
                continue
            lines = code.splitlines(keepends=True)
            drafted = [kw for kw in dec.keywords if kw.arg == "provenance"]
            if drafted:  # the draft's own provenance= is replaced, never kept
                v = drafted[0].value
                row, end = v.lineno - 1, v.end_lineno - 1  # type: ignore[operator]
                head = lines[row][: v.col_offset] + "_PROVENANCE"
                lines[row : end + 1] = [head + lines[end][v.end_col_offset :]]  # type: ignore[index]
            else:
                row, col = dec.end_lineno - 1, dec.end_col_offset - 1  # type: ignore[operator]
                line = lines[row]
                before = line[:col].rstrip()
                joiner = (
                    " " if before.endswith(("(", ",")) or not (dec.args or dec.keywords) else ", "
                )
                lines[row] = line[:col] + f"{joiner}provenance=_PROVENANCE" + line[col:]
            first = min(d.lineno for d in node.decorator_list) - 1
            literal = "_PROVENANCE = " + json.dumps(prov, indent=4, sort_keys=True, default=str)
            literal = (
                literal.replace(": null", ": None")
                .replace(": true", ": True")
                .replace(": false", ": False")
            )
            lines.insert(first, literal + "\n\n\n")
            out = "".join(lines)
            ast.parse(out)  # the edit must leave valid Python
            return out
    raise AdapterError("the draft has no @adapter(...) to attach provenance to")


def header(case: FailureCase, prov: dict[str, Any], endpoint: str) -> str:
    ev = prov["evidence"]
    lines = [
        AGENT_MARKER,
        f"# Drafted by {prov['endpoint_model']} at {endpoint} on {prov['date']}; accepted by hfadapt",
        f"# after validation (attempt id {prov['attempt_id']}: `hfadapt attempts {prov['attempt_id']}`).",
        f"# Fixes fingerprint {case.fingerprint}: rule {case.rule_id}, {case.op} at {case.location or 'unknown'}.",
    ]
    if "equivalence" in ev:
        eq = ev["equivalence"]
        lines.append(
            f"# Equivalence (float64, {eq.get('inputs')} inputs): max rel err {eq.get('max_rel_err')}, "
            f"controls rejected: {eq.get('controls_rejected')}."
        )
    for name in ("device", "end_to_end"):
        if name in ev:
            lines.append(f"# {name.replace('_', ' ').capitalize()}: {ev[name]}")
    return "\n".join(lines) + "\n"


def _store_example(case: FailureCase, folder: Path, stem: str) -> str | None:
    """What ``adapters verify`` re-proves the adapter on: the case's builder reference, or its
    captured calls copied beside the adapter (a ``_`` folder the registry does not scan)."""
    if case.example:
        return case.example
    if case.example_file and Path(case.example_file).is_file():
        store = folder / "_examples"
        store.mkdir(exist_ok=True)
        shutil.copyfile(case.example_file, store / f"{stem}.pt")
        return f"file:_examples/{stem}.pt"
    return None


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
    """Write the accepted draft and make it live; returns its path."""
    from hfadapt.adapters import registry

    target_dir = folder or registry.user_adapters_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    name = str(validation.adapter.get("name") or case.name)
    path = target_dir / f"{_slug(name)}.py"
    n = 2
    while path.exists():
        path = target_dir / f"{_slug(name)}_{n}.py"
        n += 1
    prov = provenance(case, validation, endpoint_model=endpoint_model, attempt_id=attempt_id)
    prov["evidence"]["example"] = _store_example(case, target_dir, path.stem)
    text = header(case, prov, endpoint) + with_provenance(code, prov)
    tmp = path.with_suffix(".py.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # atomic: a registry scan never sees half a file
    try:
        loaded = registry.load_file(path, source="user")
    except Exception as exc:
        path.unlink(missing_ok=True)
        raise AdapterError(f"the accepted adapter does not load back from {path}: {exc}") from exc
    if loaded[0].provenance.origin != "agent":
        path.unlink(missing_ok=True)
        raise AdapterError(f"the accepted adapter at {path} lost its provenance")
    if reload:
        registry.default_registry(reload=True)
    return path
