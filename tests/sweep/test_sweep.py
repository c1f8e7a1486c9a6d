"""hfadapt.sweep.run with the stand-in worker (tests/support/sweep_fakes.py): signature dedupe, one row per
model pointing at its representative, custom_code and skipped rows, crashes and hangs recorded
while the sweep goes on, progress, and the options a sweep refuses."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import text
from support.sweep_fakes import fake_verdict
from support.sweeps import store_crawl, sweep_records

from hfadapt import verdicts
from hfadapt.errors import UsageError
from hfadapt.judge.options import JudgeOptions
from hfadapt.sweep.options import SweepOptions
from hfadapt.sweep.run import SweepProgress, run_sweep
from hfadapt.sweep.store import Sweep


def runs(engine: Any, sweep_id: int) -> list[dict[str, Any]]:
    from hfadapt.sweep.store import done_rows

    return list(done_rows(engine, sweep_id).values())


def test_models_sharing_a_signature_are_judged_once(sweep_engine: Any, fake_worker: str) -> None:
    result = run_sweep(sweep_engine, SweepOptions(workers=2, resume=False), worker=fake_worker)
    rows = {r["model_id"]: r for r in runs(sweep_engine, result.sweep_id)}
    print(
        f"\n{result.models} models, {result.units} units, dedupe {result.dedupe_factor}: {result.counts}"
    )
    # 13 models: 11 judged in 5 units (A x5, B, C, D x3, no-config alone), custom_code, skipped.
    assert (result.models, result.units, result.judged, len(rows)) == (13, 5, 5, 13), result
    assert result.dedupe_factor == pytest.approx(11 / 5), result.dedupe_factor
    roles = Counter(r["evidence"]["sweep"]["role"] for r in rows.values())
    assert roles == {"representative": 5, "member": 6, "direct": 2}, roles
    assert (
        rows["org/custom"]["verdict"] == verdicts.CUSTOM_CODE
        and "--trust-remote-code" in rows["org/custom"]["reason"]
    )
    assert (
        rows["org/model-onnx"]["verdict"] == verdicts.SKIPPED
        and rows["org/model-onnx"]["reason"] == "onnx_gguf_mlx_only"
    )
    # Members share the representative's verdict, metrics and fingerprints, and point at its row.
    rep = rows["org/bert-a0"]
    assert rep["evidence"]["sweep"] == {
        **rep["evidence"]["sweep"],
        "role": "representative",
        "models": 5,
    }
    for i in range(1, 5):
        member = rows[f"org/bert-a{i}"]
        assert member["evidence"]["sweep"]["representative"] == "org/bert-a0"
        assert member["evidence"]["sweep"]["representative_run"] == rep["id"], member["evidence"]
        same = ("verdict", "reason", "min_token_cosine", "fingerprints", "signature")
        assert {k: member[k] for k in same} == {k: rep[k] for k in same}
        assert member["sweep_id"] == result.sweep_id and member["model_type"] == "bert"
    signatures = {r["signature"] for r in rows.values() if r["signature"]}
    assert len(signatures) == 4, signatures  # A, B, C, D; the no-config model has none
    assert rows["org/xlmr-0"]["signature"] != rep["signature"] != rows["org/bert-relu"]["signature"]
    assert rows["org/xlmr-2"]["evidence"]["sweep"]["representative"] == "org/xlmr-0"
    # The verdict is the stand-in's function of the unit key: the same for every member.
    assert rep["verdict"] == fake_verdict(rep["signature"])
    assert sum(result.counts.values()) == 13 and result.counts[verdicts.CUSTOM_CODE] == 1
    with sweep_engine.connect() as conn:
        sweep = conn.execute(text("SELECT status, models, units, judged FROM sweep")).one()
    assert tuple(sweep) == ("done", 13, 5, 5), sweep


def test_full_mode_judges_every_model(sweep_engine: Any, fake_worker: str) -> None:
    result = run_sweep(
        sweep_engine,
        SweepOptions(judge=JudgeOptions(mode="full", localize=False), workers=1, resume=False),
        worker=fake_worker,
    )
    assert (result.models, result.units, result.judged) == (13, 11, 11), result
    assert result.dedupe_factor == 1.0


def test_crash_and_hang_are_recorded_and_the_sweep_goes_on(
    sweep_engine: Any, fake_worker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HFADAPT_FAKE_CRASH", "org/bert-relu")
    monkeypatch.setenv("HFADAPT_FAKE_HANG", "org/xlmr-0")
    # The hang never ends, and every other unit answers in milliseconds once its worker is
    # ready (the limit counts from the hand-over): 10 s leaves a loaded machine room.
    result = run_sweep(
        sweep_engine, SweepOptions(workers=2, timeout=10.0, resume=False), worker=fake_worker
    )
    rows = {r["model_id"]: r for r in runs(sweep_engine, result.sweep_id)}
    print(f"\nrestarts {result.worker_restarts}: {result.counts}")
    crashed = rows["org/bert-relu"]
    assert crashed["verdict"] == verdicts.WORKER_CRASHED and "SIGSEGV" in crashed["reason"], (
        crashed["reason"]
    )
    for i in range(3):  # the hang is recorded for all three models of its signature
        hung = rows[f"org/xlmr-{i}"]
        assert hung["verdict"] == verdicts.WORKER_TIMEOUT and "10 s" in hung["reason"], hung[
            "reason"
        ]
    assert rows["org/xlmr-0"]["evidence"]["timeout_s"] == 10.0
    others = [
        r for m, r in rows.items() if m.startswith(("org/bert-a", "org/minilm", "org/no-config"))
    ]
    assert len(others) == 7, sorted(rows)
    for row in others:  # the fake's verdict is a function of its unit key, named in the reason
        key = row["reason"].rpartition("fake verdict of ")[2]
        assert key and row["verdict"] == fake_verdict(key), (row["model_id"], row["reason"])
    assert len(rows) == 13 and result.worker_restarts == 2, result


def test_a_worker_that_raises_is_worker_crashed(sweep_engine: Any, fake_worker: str) -> None:
    result = run_sweep(
        sweep_engine,
        SweepOptions(workers=1, resume=False),
        worker="support.sweep_fakes:raising_judge",
    )
    rows = runs(sweep_engine, result.sweep_id)
    judged = [r for r in rows if r["evidence"]["sweep"]["role"] != "direct"]
    assert len(judged) == 11 and {r["verdict"] for r in judged} == {verdicts.WORKER_CRASHED}
    rep = next(r for r in judged if r["model_id"] == "org/bert-a0")
    assert (
        "RuntimeError: boom on org/bert-a0" in rep["reason"]
        and "Traceback" in rep["evidence"]["traceback"]
    )
    assert result.worker_restarts == 0  # an exception does not cost the process


def test_progress_is_reported_after_every_unit(sweep_engine: Any, fake_worker: str) -> None:
    seen: list[SweepProgress] = []

    def progress(p: SweepProgress) -> None:
        seen.append(SweepProgress(**{**vars(p), "counts": Counter(p.counts)}))

    result = run_sweep(
        sweep_engine, SweepOptions(workers=2, resume=False), worker=fake_worker, progress=progress
    )
    assert len(seen) == 1 + 5, [p.done for p in seen]  # the direct rows, then one per unit
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    assert (seen[0].done, seen[-1].done, seen[-1].total) == (2, 13, 13)
    assert [p.units_done for p in seen] == [0, 1, 2, 3, 4, 5]
    assert all(sum(p.counts.values()) == p.done for p in seen)
    last = seen[-1]
    assert (
        last.eta == 0.0
        and last.models_per_minute > 0
        and last.cost_done == pytest.approx(last.cost_total)
    )
    assert dict(last.counts) == result.counts


def test_a_second_run_resumes_nothing_left(sweep_engine: Any, fake_worker: str) -> None:
    first = run_sweep(sweep_engine, SweepOptions(workers=1, resume=False), worker=fake_worker)
    again = run_sweep(
        sweep_engine, SweepOptions(workers=1), worker=fake_worker
    )  # the first is done: a new one
    assert again.sweep_id == first.sweep_id + 1 and not again.resumed
    with sweep_engine.connect() as conn:
        per_sweep = dict(
            conn.execute(text("SELECT sweep_id, count(*) FROM run GROUP BY sweep_id")).all()
        )
    assert per_sweep == {first.sweep_id: 13, again.sweep_id: 13}


def test_adapters_left_out_reach_every_unit_and_tell_sweeps_apart(
    sweep_engine: Any, fake_worker: str
) -> None:
    judging = JudgeOptions(mode="structural", localize=False, without_adapters=["gelu-exact-host"])
    left_out = run_sweep(
        sweep_engine, SweepOptions(judging, workers=1, resume=False), worker=fake_worker
    )
    judged = [r for r in runs(sweep_engine, left_out.sweep_id) if r["evidence"].get("fake")]
    told = Counter(tuple(r["evidence"]["without_adapters"]) for r in judged)
    assert told == {("gelu-exact-host",): left_out.judged}, told
    with sweep_engine.connect() as conn:
        stored = conn.execute(
            text("SELECT options FROM sweep WHERE id = :i"), {"i": left_out.sweep_id}
        ).scalar_one()
    stored = json.loads(stored) if isinstance(stored, str) else stored
    assert stored["without_adapters"] == ["gelu-exact-host"], stored
    # the same sweep with every adapter is another sweep: it never resumes this one
    every = SweepOptions(judging.but(without_adapters=())).identity("p", 1)
    assert SweepOptions(judging).identity("p", 1) != every, every
    with pytest.raises(UsageError, match="no adapter named 'nope'"):
        run_sweep(
            sweep_engine,
            SweepOptions(judging.but(without_adapters=("nope",)), workers=1),
            worker=fake_worker,
        )


def test_top_and_model_type_select_models(sweep_engine: Any, fake_worker: str) -> None:
    top = run_sweep(sweep_engine, SweepOptions(top=6, resume=False), worker=fake_worker)
    assert (top.models, top.units) == (6, 2), top  # bert-a0..a4 and bert-relu
    xlmr = run_sweep(
        sweep_engine, SweepOptions(model_type="xlm-roberta", resume=False), worker=fake_worker
    )
    assert (xlmr.models, xlmr.units) == (3, 1), xlmr
    with pytest.raises(UsageError, match="no crawled models of model_type 'gpt9'"):
        run_sweep(sweep_engine, SweepOptions(model_type="gpt9"), worker=fake_worker)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "fast"}, r"^mode must be one of full, structural, not 'fast'$"),
        ({"workers": 0}, r"^workers must be at least 1 \(got 0\)$"),
        ({"timeout": -1}, r"^timeout must be a finite number of seconds above 0 \(got -1\)$"),
        ({"timeout": float("nan")}, r"^timeout must be a finite number of seconds above 0"),
        ({"executor": "slurm"}, r"^executor must be one of local, ray, not 'slurm'$"),
        ({"dtype": "fp8"}, r"^dtype must be one of fp16, bf16, fp32, not 'fp8'$"),
    ],
)
def test_bad_options_are_usage_errors(
    sweep_engine: Any, options: dict[str, Any], message: str
) -> None:
    # The library names its parameters; only the CLI names flags.
    judging = {k: options.pop(k) for k in ("mode", "dtype") if k in options}
    with pytest.raises(UsageError, match=message):
        run_sweep(sweep_engine, SweepOptions(judge=JudgeOptions(**judging), **options))
    with sweep_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sweep")).scalar() == 0


def test_an_empty_database_crawls_the_bundled_snapshot_first(
    tmp_path: Any, fake_worker: str
) -> None:
    from hfadapt.db.engine import get_engine
    from hfadapt.hub.catalog import latest_crawl

    engine = get_engine(str(tmp_path / "empty.db"))
    result = run_sweep(engine, SweepOptions(top=25, workers=2), worker=fake_worker)
    crawl = latest_crawl(engine)
    assert crawl is not None and crawl.source == "snapshot" and crawl.seen == 10_000, crawl
    assert result.models == 25 and sum(result.counts.values()) == 25, result
    assert result.units < 25 - result.counts.get(verdicts.CUSTOM_CODE, 0), result  # deduped
    with engine.connect() as conn:
        options = conn.execute(text("SELECT options FROM sweep")).scalar()
    assert '"top": 25' in options and '"mode": "structural"' in options, options
    engine.dispose()


def test_many_signatures_store_every_model_once(tmp_path: Any, fake_worker: str) -> None:
    from hfadapt.db.engine import get_engine

    engine = get_engine(str(tmp_path / "many.db"))
    store_crawl(engine, sweep_records("many"))
    result = run_sweep(engine, SweepOptions(workers=2), worker=fake_worker)
    assert (result.models, result.units, result.dedupe_factor) == (92, 30, 3.0), result
    with engine.connect() as conn:
        dupes = conn.execute(text("SELECT count(*) - count(DISTINCT model_id) FROM run")).scalar()
        sweep = conn.execute(text("SELECT counts FROM sweep")).scalar()
    counts = json.loads(sweep) if isinstance(sweep, str) else sweep
    assert dupes == 0 and sum(counts.values()) == 92, (dupes, counts)
    assert Sweep.__tablename__ == "sweep"
    engine.dispose()
