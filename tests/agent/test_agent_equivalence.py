"""hfadapt.adapters.equivalence: right rewrites proven in float64 with their error, wrong ones and the
negative controls (identity, zero, constant) rejected with theirs, and a checker whose inputs
cannot tell them apart reported as inconclusive."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hfadapt.adapters.equivalence import compare_outputs, prove_equivalent
from hfadapt.adapters.registry import discover
from hfadapt.agent.evalcases import gelu_example, softsign_example
from hfadapt.agent.suite import SUITE

STABLE_FILES = ("activations.py", "rms_norm.py", "layer_norm.py")


def gelu_original():
    from transformers.activations import NewGELUActivation

    return NewGELUActivation.forward


def cube_gelu(self, x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


def square_gelu(self, x):  # the classic wrong rewrite: x*x for pow(x, 3)
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x))))


def test_right_rewrite_is_equivalent_with_numbers() -> None:
    r = prove_equivalent(cube_gelu, gelu_original(), gelu_example, seeds=(0, 1, 2))
    assert r.equivalent, r.summary()
    assert len(r.cases) == 12 and r.max_rel_err <= 1e-12, r.summary()
    assert {c.variant for c in r.cases} == {"random", "zeros", "large", "negative"}
    assert {tuple(c.shapes[0]) for c in r.cases} == {
        (3, 7, 65),
        (3, 9, 65),
        (3, 11, 65),
    }  # odd sizes
    assert [c.name for c in r.controls] == ["identity", "zero", "constant", "scaled"]
    assert r.controls_rejected, r.controls


def test_wrong_rewrite_is_rejected_with_its_error() -> None:
    r = prove_equivalent(square_gelu, gelu_original(), gelu_example)
    assert not r.equivalent
    assert r.max_rel_err > 0.01, r.summary()
    failed = {c.variant for c in r.cases if not c.ok}
    assert failed == {"random", "large", "negative"}, failed  # zeros cannot tell x*x from x**3
    assert "inputs differ" in r.reason


@pytest.mark.parametrize(
    "control",
    [
        lambda self, x: x,  # identity
        lambda self, x: torch.zeros_like(x),  # zero
        lambda self, x: torch.full_like(x, 0.5),  # constant
        lambda self, x: 1.001 * cube_gelu(self, x),  # right, but scaled by 0.1 %
    ],
    ids=["identity", "zero", "constant", "scaled"],
)
def test_negative_controls_as_candidates_are_rejected(control) -> None:
    r = prove_equivalent(control, gelu_original(), gelu_example, controls=False)
    assert not r.equivalent, r.summary()
    assert r.max_rel_err > 5e-4, r.summary()


def test_inputs_that_cannot_tell_controls_apart_are_inconclusive() -> None:
    def zeros_only(seed: int):
        from transformers.activations import NewGELUActivation

        return NewGELUActivation(), (torch.zeros(2, 3, 5, dtype=torch.float64),), {}

    r = prove_equivalent(cube_gelu, gelu_original(), zeros_only, variants=("random", "zeros"))
    assert not r.equivalent
    accepted = sorted(c.name for c in r.controls if not c.rejected)
    assert accepted == ["constant", "identity", "scaled", "zero"], r.controls
    assert r.reason.startswith("inconclusive"), r.reason


def test_every_suite_example_rejects_every_control() -> None:
    """The stock code called as the harness calls it (``stock_call``: a staticmethod without
    ``self``, a module-level function with its site's objects) against itself."""
    from pkgutil import resolve_name

    from hfadapt.agent.cases import stock_call

    for spec in SUITE:
        target = stock_call(spec.target)
        r = prove_equivalent(target, target, resolve_name(spec.example), seeds=(0, 1))
        assert r.equivalent and r.max_abs_err == 0.0, (spec.name, r.summary())
        assert r.controls_rejected, (spec.name, [(c.name, c.detail) for c in r.controls])


def test_bundled_activation_and_norm_adapters_are_proven() -> None:
    # The rest of the bundled adapters are re-proven by `hfadapt adapters verify` (its tests).
    reg = discover(paths=[], entry_points=False)
    mine = [a for a in reg.adapters if a.example is not None and Path(a.path).name in STABLE_FILES]
    assert len(mine) >= 5, [a.name for a in mine]
    for a in mine:
        r = prove_equivalent(a, seeds=(0, 1))
        assert r.equivalent, (a.name, r.summary())
        assert r.max_rel_err < 1e-6, (a.name, r.max_rel_err)


def test_compare_outputs_checks_structure_dtype_and_nan_positions() -> None:
    a = torch.tensor([1.0, float("nan"), float("-inf")], dtype=torch.float64)
    assert compare_outputs(a, a.clone())[0]
    assert not compare_outputs(a, torch.tensor([1.0, 2.0, float("-inf")], dtype=torch.float64))[0]
    assert "dtype" in compare_outputs(a, a.float())[3]
    assert "shape" in compare_outputs(a, a[:2])[3]
    assert "leaves" in compare_outputs((a, a), (a,))[3]
    ref, near = (
        torch.tensor([100.0], dtype=torch.float64),
        torch.tensor([100.0 + 1e-5], dtype=torch.float64),
    )
    ok, abs_err, rel_err, _ = compare_outputs(ref, near)
    assert ok and rel_err == pytest.approx(1e-7, rel=1e-3), (abs_err, rel_err)


def test_a_rewrite_that_raises_is_a_failed_case_not_a_crash() -> None:
    def broken(self, x):
        raise ValueError("boom")

    from hfadapt.agent.evalcases import Softsign

    r = prove_equivalent(broken, Softsign.forward, softsign_example)
    assert not r.equivalent and "ValueError: boom" in r.reason, r.reason
