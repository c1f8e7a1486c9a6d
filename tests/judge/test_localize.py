"""Localizing numeric divergence: the first module whose output leaves tolerance while its
inputs had not, not every module downstream of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hfadapt.judge.localize import MODULE_COSINE_MIN, ModuleRecord, first_divergence, localize
from hfadapt.loading.probes import model_inputs, tokenize_probes

# Small models on a shared machine: one torch thread (see conftest.one_thread).
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_loaded(tiny_model_dirs: dict[str, Path]):  # type: ignore[no-untyped-def]
    from hfadapt.loading import load as loading

    lm = loading.load(tiny_model_dirs["bert"])
    inputs = model_inputs(lm.model, tokenize_probes(lm.tokenizer, lm.config))
    return lm, inputs


@pytest.mark.parametrize(
    ("module", "kind"),
    [
        ("encoder.layer.1.intermediate.intermediate_act_fn", "zero_half"),
        ("encoder.layer.0.attention.self", "zero_half"),
        ("encoder.layer.1.output.LayerNorm", "nan"),
        ("embeddings.LayerNorm", "zero_half"),
    ],
)
def test_injected_fault_is_localized_to_its_module(
    tiny_loaded, fault_runner: Callable[..., object], module: str, kind: str
) -> None:  # type: ignore[no-untyped-def]
    lm, inputs = tiny_loaded
    found = localize(lm.model, inputs, runner=fault_runner(module, kind))
    assert found is not None, f"fault in {module} not localized"
    print(f"\n{kind} fault in {module}: {found.summary()}")
    assert found.module == module, found.summary()
    assert not found.inputs_drifted, found.summary()
    assert found.input_cosine is not None and found.input_cosine >= MODULE_COSINE_MIN, (
        found.input_cosine
    )
    if kind == "nan":
        assert found.has_nan, found.summary()
    else:
        assert found.cosine is not None and found.cosine < MODULE_COSINE_MIN, found.cosine


def test_layer_and_sublayer_are_parsed(tiny_loaded, fault_runner: Callable[..., object]) -> None:  # type: ignore[no-untyped-def]
    lm, inputs = tiny_loaded
    found = localize(
        lm.model,
        inputs,
        runner=fault_runner("encoder.layer.1.intermediate.intermediate_act_fn"),
        rows=[0, 11],
    )
    assert found is not None
    assert (found.layer, found.sublayer, found.module_class) == (
        1,
        "intermediate.intermediate_act_fn",
        "GELUActivation",
    )
    assert found.rows == [0, 11], found.rows
    assert found.reference_absmax > found.device_absmax * 0  # both measured
    assert found.max_abs_diff is not None and found.max_abs_diff > 0.01, found.max_abs_diff


def test_no_fault_no_divergence(tiny_loaded, cpu_runner: Callable[..., object]) -> None:  # type: ignore[no-untyped-def]
    lm, inputs = tiny_loaded
    assert localize(lm.model, inputs, runner=cpu_runner) is None


def test_the_model_passed_in_is_left_untouched(
    tiny_loaded, fault_runner: Callable[..., object]
) -> None:  # type: ignore[no-untyped-def]
    lm, inputs = tiny_loaded
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    localize(lm.model, inputs, runner=fault_runner("encoder.layer.0.output.dense"))
    after = lm.model.state_dict()
    assert all(
        after[k].dtype == torch.float32 and torch.equal(after[k], v) for k, v in before.items()
    )
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in lm.model.modules()), (
        "hooks left behind"
    )


def _rec(name: str, inp: torch.Tensor, out: torch.Tensor) -> ModuleRecord:
    return ModuleRecord(name, 0, "Linear", [inp], [out])


def test_first_divergence_skips_modules_whose_inputs_had_drifted() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 8, generator=g)
    y = torch.randn(1, 4, 8, generator=g)
    bad_y = -y
    mask = torch.ones(1, 4, dtype=torch.bool)
    reference = [_rec("a", x, y), _rec("b", y, y * 2), _rec("c", y * 2, y * 3)]
    device = [_rec("a", x, y), _rec("b", y, bad_y), _rec("c", bad_y, bad_y * 3)]
    found = first_divergence(reference, device, mask)
    assert found is not None and found.module == "b", found
    assert found.cosine == pytest.approx(-1.0, abs=1e-9), found.cosine
    assert found.modules_checked == 2, found.modules_checked


def test_divergence_between_modules_is_flagged() -> None:
    """When the first bad output already had bad inputs, the fault is in code between modules."""
    x = torch.ones(1, 2, 4)
    mask = torch.ones(1, 2, dtype=torch.bool)
    reference = [_rec("layer.0.dense", x, x)]
    device = [_rec("layer.0.dense", -x, -x)]
    found = first_divergence(reference, device, mask)
    assert found is not None and found.inputs_drifted and found.layer == 0, found
    assert "between modules" in found.summary()


def test_pad_positions_do_not_count() -> None:
    x = torch.ones(1, 4, 8)
    dev = x.clone()
    dev[0, 3] = float("nan")  # a padded position
    mask = torch.tensor([[True, True, True, False]])
    assert first_divergence([_rec("m", x, x)], [_rec("m", x, dev)], mask) is None
