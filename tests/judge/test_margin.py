"""How close a run came to its bounds (hfadapt.judge.margin): the share of each bound used,
with cosine as (1 - cos) / (1 - bound) and an error as value / bound, the largest as the run's
margin; NaN/inf give none; stored margins read back with their shares recomputed, and a
judged run records its margin in its evidence."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hfadapt.judge.margin import BoundUse, Margin, margin_of, read_margin, widest
from hfadapt.judge.metrics import NORM_ERROR_MAX, TOKEN_COSINE_MIN, Metrics
from hfadapt.judge.output_metrics import dense_metrics, sparse_metrics

pytestmark = pytest.mark.usefixtures("one_thread")


def _metrics(cosine: float | None, norm: float | None, **kw: Any) -> Metrics:
    fields: dict[str, Any] = dict(
        min_token_cosine=cosine, mean_token_cosine=cosine, pooled_cosine=cosine,
        max_abs_diff=0.01, has_nan=False, has_inf=False, tokens=10, nonfinite_tokens=0,
        worst_token=(0, 1), max_norm_error=norm,
    )  # fmt: skip
    fields.update(kw)
    return Metrics(**fields)


def test_the_share_is_the_largest_over_cosine_and_norm_error() -> None:
    margin = margin_of(_metrics(0.99994, 0.0128))
    shares = {u.metric: u.share for u in margin.uses}
    print(f"\n{margin.text()}\nshares {shares}")
    # cosine: (1 - 0.99994) / (1 - 0.99) = 0.006; norm error: 0.0128 / 0.05 = 0.256
    assert shares["min token cosine"] == pytest.approx(0.006, abs=1e-9), shares
    assert shares["max token norm error"] == pytest.approx(0.0128 / 0.05, abs=1e-12), shares
    assert margin.share == pytest.approx(0.256, abs=1e-6), margin.share
    assert margin.worst is not None and margin.worst.metric == "max token norm error"
    text = margin.text()
    assert text.startswith("26% of the bound used at worst (max token norm error)"), text
    assert "max token norm error 1.28% of 5.00% (26% of the bound used)" in text, text
    assert "min token cosine 0.999940, 0.0099 above its bound 0.99 (0.6% of" in text, text


def test_a_failing_run_uses_more_than_its_bound_and_says_below() -> None:
    margin = margin_of(_metrics(0.98, 0.003))
    assert margin.share == pytest.approx(2.0, abs=1e-9), margin.share  # (1-0.98)/(1-0.99)
    assert "0.98" in margin.text() and "0.01 below its bound" in margin.text(), margin.text()
    cos = next(u for u in margin.uses if u.metric == "min token cosine")
    assert cos.headroom == pytest.approx(-0.01, abs=1e-12), cos.headroom


def test_nan_or_inf_gives_no_share_and_missing_values_are_named() -> None:
    margin = margin_of(_metrics(0.9999, 0.001, has_nan=True, nonfinite_tokens=2))
    assert margin.nonfinite and margin.share is None, margin
    assert margin.text() == "no margin: the device output holds NaN or inf", margin.text()
    empty = margin_of(_metrics(None, None))
    assert empty.share is None and empty.unmeasured == (
        "min token cosine",
        "max token norm error",
    ), empty


def test_zero_rows_and_each_pipeline_output_count_with_their_own_bounds() -> None:
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(4, 32, generator=g)
    dense = dense_metrics(ref, ref * 1.01)  # every sentence 1% long: 0.01 / 0.05 of the bound
    sparse_ref = torch.zeros(2, 100)
    sparse_ref[:, :32] = torch.linspace(2.0, 1.0, 32)
    sparse_dev = sparse_ref.clone()
    sparse_dev[:, 30:32] = 0.0  # two of the top 32 ids swapped for zeros: overlap 30/32
    sparse_dev[:, 40:42] = 0.5
    sparse = sparse_metrics(sparse_ref, sparse_dev, "sparse_embedding")
    m = _metrics(0.9999, 0.002, zero_rows=1, zero_row_error=0.005, outputs=[dense, sparse])
    margin = margin_of(m)
    shares = {u.metric: round(u.share, 6) for u in margin.uses}
    print(f"\nshares {shares}")
    assert shares["zero-row error"] == pytest.approx(0.5), shares  # 0.005 / 0.01
    norm = shares["sentence_embedding: max sentence norm error"]
    assert norm == pytest.approx(0.01 / NORM_ERROR_MAX, abs=1e-5), shares
    # top-32 overlap 30/32 = 0.9375 against >= 0.9: (1 - 0.9375) / (1 - 0.9) = 0.625
    assert shares["sparse_embedding: min overlap@32"] == pytest.approx(0.625, abs=1e-9), shares
    weight = shares["sparse_embedding: max top-k weight error"]
    assert margin.share == pytest.approx(max(shares.values()), abs=1e-6), margin.share
    assert weight > 1 and not m.passed, (weight, m.failure())  # the two lost weights fail it


def test_a_stored_margin_reads_back_with_shares_recomputed_and_bad_rows_are_absent() -> None:
    stored = margin_of(_metrics(0.995, 0.006)).to_dict()
    stored["share"] = 0.0  # a stored share is not trusted: recomputed from values and bounds
    back = read_margin(stored)
    assert back is not None and back.share == pytest.approx(0.5, abs=1e-9), back
    for bad in (None, "x", {"metrics": "no"}, {"metrics": [{"metric": "m", "value": "1"}]},
                {"metrics": [{"metric": "m", "value": 1.5, "bound": 1.0, "at_least": True}]},
                {"metrics": [{"metric": "m", "value": float("nan"), "bound": 0.1,
                              "at_least": False}]}):  # fmt: skip
        assert read_margin(bad) is None, bad


def test_widest_prefers_nan_then_the_largest_share() -> None:
    near = Margin((BoundUse("min token cosine", 0.995, TOKEN_COSINE_MIN, True),), task="a")
    far = Margin((BoundUse("min token cosine", 0.9999, TOKEN_COSINE_MIN, True),), task="b")
    broken = Margin((), nonfinite=True, task="c")
    assert widest([far, None, near]) is near and widest([near, broken]) is broken
    assert widest([None]) is None
    assert "(task 'a')" in near.text(), near.text()


def _scaled_runner(scale: float) -> Callable[..., Any]:
    """A stand-in device: the model in fp32 on the CPU, every real token's row scaled."""
    from support.device import FakeDeviceRun

    from hfadapt.spyre.rules.lowering_report import LoweringReport

    def run(model: Any, inputs: dict[str, Any], *, execution: str = "eager", **_: Any) -> Any:
        started = time.perf_counter()
        with torch.inference_mode():
            outputs = model(**inputs)
        outputs.last_hidden_state = outputs.last_hidden_state.float() * scale
        report = LoweringReport("cpu-stand-in", "0", execution)
        return FakeDeviceRun(outputs, report, time.perf_counter() - started)

    return run


def test_a_judged_run_records_its_margin(tiny_model_dirs: dict[str, Path]) -> None:
    from hfadapt.db.engine import get_engine, session
    from hfadapt.db.tables import Run
    from hfadapt.judge.diagnose import diagnose

    diag = diagnose(tiny_model_dirs["bert"], runner=_scaled_runner(1.012))
    assert diag.metrics is not None, diag.reason
    engine = get_engine()  # $HFADAPT_DB, isolated per test by conftest
    with session(engine, write=False) as sess:
        row = sess.get(Run, diag.run_id)
        assert row is not None
        stored = dict(row.evidence or {}).get("margin")
    engine.dispose()
    margin = read_margin(stored)
    print(f"\n{diag.verdict}: {diag.metrics.summary()}\n{margin.text() if margin else None}")
    assert diag.verdict == "pass" and margin is not None, (diag.reason, stored)
    # every row 1.2% long: the norm error uses 0.012 / 0.05 = 24% of its bound
    assert margin.worst is not None and margin.worst.metric.endswith("norm error"), margin.text()
    assert margin.share == pytest.approx(0.24, abs=1e-4), margin.share
    assert stored["share"] == pytest.approx(margin.share, abs=1e-12), stored
