"""A sweep does not resume on another environment (package versions, the device's numeric path:
hfadapt.judge.environment) than the one its recorded runs rest on, unless told to: refused in
one line naming each key, before any worker starts or any row changes; resumed with
``allow_env_change`` / ``--allow-env-change``, the change named in the result."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from sqlalchemy import text
from support.cli_runner import run_cli

from hfadapt.errors import EnvironmentChangedError
from hfadapt.judge.environment import environment
from hfadapt.spyre.rules.profile import load_profile
from hfadapt.sweep.options import SweepOptions
from hfadapt.sweep.run import run_sweep


def _interrupt_with(engine: Any, sweep_id: int, versions: dict[str, str]) -> int:
    """The sweep as if an earlier session in ``versions`` was stopped before its xlm-roberta
    unit: every row records ``versions``; returns the rows left."""
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE run SET versions = :v WHERE sweep_id = :s"),
            {"v": json.dumps(versions), "s": sweep_id},
        )
        conn.execute(text("DELETE FROM run WHERE model_id LIKE 'org/xlmr-%'"))
        conn.execute(
            text("UPDATE sweep SET status = 'interrupted', finished_at = NULL WHERE id = :s"),
            {"s": sweep_id},
        )
        return int(conn.execute(text("SELECT count(*) FROM run")).scalar_one())


def _sweep_row(engine: Any, sweep_id: int) -> tuple[str, int]:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, resumes FROM sweep WHERE id = :s"), {"s": sweep_id}
        ).one()
    return str(row[0]), int(row[1])


def _other(current: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """An environment with transformers and the AMX path changed, and the expected changes."""
    amx = "fp32" if current["numeric.amx"] == "tiles" else "tiles"
    old = {**current, "transformers": "5.24.0", "numeric.amx": amx}
    expected = [
        f"transformers 5.24.0 -> {current['transformers']}",
        f"numeric.amx {amx} -> {current['numeric.amx']}",
    ]
    return old, expected


def test_resume_refuses_a_changed_environment_and_accepts_it_when_allowed(
    sweep_engine: Any, fake_worker: str
) -> None:
    first = run_sweep(sweep_engine, SweepOptions(workers=1, resume=False), worker=fake_worker)
    current = environment(load_profile(None))
    old, expected = _other(current)
    left = _interrupt_with(sweep_engine, first.sweep_id, old)
    assert left == 10, left
    with pytest.raises(EnvironmentChangedError) as caught:
        run_sweep(sweep_engine, SweepOptions(workers=1), worker=fake_worker)
    message = caught.value.one_line()
    print(f"\n{message}")
    assert message == (
        f"sweep {first.sweep_id} was run in another environment than this one: "
        f"{', '.join(expected)}; pass `allow_env_change` to resume it anyway (its new runs "
        "record this environment), or start a new sweep (resume=False)"
    ), message
    assert caught.value.exit_code == 2 and [str(c) for c in caught.value.changes] == expected
    # refused before anything was written: the sweep is as the earlier session left it
    assert _sweep_row(sweep_engine, first.sweep_id) == ("interrupted", 0)
    with sweep_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM run")).scalar_one() == left
    again = run_sweep(
        sweep_engine, SweepOptions(workers=1, allow_env_change=True), worker=fake_worker
    )
    print(f"resumed: {again.environment_changes}")
    assert (again.sweep_id, again.resumed, again.models) == (first.sweep_id, True, 13), again
    assert again.environment_changes == expected, again.environment_changes
    assert _sweep_row(sweep_engine, first.sweep_id) == ("done", 1)


def test_resume_in_the_same_environment_needs_no_leave(sweep_engine: Any, fake_worker: str) -> None:
    first = run_sweep(sweep_engine, SweepOptions(workers=1, resume=False), worker=fake_worker)
    # rows of an older hfadapt recorded fewer keys: what they did not record is no change
    older = {k: v for k, v in environment(load_profile(None)).items() if not k.startswith("num")}
    _interrupt_with(sweep_engine, first.sweep_id, older)
    again = run_sweep(sweep_engine, SweepOptions(workers=1), worker=fake_worker)
    assert (again.sweep_id, again.resumed, again.environment_changes) == (
        first.sweep_id,
        True,
        [],
    ), again


def test_cli_refuses_in_one_line_and_resumes_with_allow_env_change(
    sweep_engine: Any,
    fake_worker: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import hfadapt.sweep.run
    from hfadapt.db.engine import sqlite_path

    monkeypatch.setattr(
        hfadapt.sweep.run, "run_sweep", functools.partial(run_sweep, worker=fake_worker)
    )
    db = str(sqlite_path(sweep_engine.url))
    code, out, err = run_cli(["sweep", "--db", db, "--workers", "1"], monkeypatch, capsys)
    assert code == 0, err
    old, expected = _other(environment(load_profile(None)))
    _interrupt_with(sweep_engine, 1, old)
    code, out, err = run_cli(["sweep", "--db", db, "--workers", "1"], monkeypatch, capsys)
    print(f"\n{err}")
    assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
    assert err.startswith(
        f"error: sweep 1 was run in another environment than this one: {', '.join(expected)}; "
        "pass --allow-env-change to resume it anyway"
    ), err
    code, _, err = run_cli(
        ["sweep", "--db", db, "--workers", "1", "--allow-env-change"], monkeypatch, capsys
    )
    print(err)
    assert code == 0, (code, err)
    assert "sweep 1 (resumed; 10 models done before)" in err, err
    assert (
        "environment changed since its earlier runs (--allow-env-change): " + ", ".join(expected)
    ) in err, err
