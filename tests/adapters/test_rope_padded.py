"""RoPE on heads off a stick (granite-embedding-small-english-r2: 32 wide). The card refuses
every plain rotate_half there: ``x @ R`` has K = 32 (layout.matmul_k), the slice at head/2 is an
offset into the stick (layout.stick_slice), the halves along a new axis split the stick into
[2, 16] (torch-spyre#3138, layout.interleaved_stick_split). ``rope-rotate-padded-*`` zero-pads
the head to whole sticks and multiplies by R with zero rows for the padding: compiled on the
card it lowers at 16, 32 and 96 and equals rotate_half exactly; a ModernBERT with 16-wide heads
passes compiled with it and fails to lower without it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers.models.llama.modeling_llama import rotate_half

from hfadapt.adapters.registry import discover
from hfadapt.errors import SpyreLoweringError
from hfadapt.spyre.numerics.dl16 import round_dl16
from hfadapt.spyre.rules.profile import available_profiles

REGISTRY = discover(paths=[], entry_points=False)
# the bundled file's own functions (the registry executes it as a module of its own)
ROPE = REGISTRY.get("rope-rotate-padded-modernbert").fn.__globals__


def _halves_on_a_new_axis(x: torch.Tensor) -> torch.Tensor:
    """The rotate_half the bundled file used for heads off a stick before: #3138's split."""
    halves = x.unflatten(-1, (2, x.shape[-1] // 2))
    return torch.cat((-halves.select(-2, 1), halves.select(-2, 0)), dim=-1)


def _matmul_k_unpadded(x: torch.Tensor) -> torch.Tensor:
    """rotate_half as ``x @ R`` with K the head size itself."""
    return torch.matmul(x, ROPE["rotation_matrix"](x.shape[-1], x.dtype, x.device))


@pytest.mark.parametrize("profile", available_profiles())
@pytest.mark.parametrize("size", [16, 32, 96])
def test_padded_rotation_lowers_and_is_exact_on_the_card(
    spyre_backend: Any, size: int, profile: str
) -> None:
    x = torch.randn(2, 4, 64, size, generator=torch.Generator().manual_seed(size)).half()
    compiled = torch.compile(
        ROPE["rotate_half_matmul"], backend="spyre", options={"profile": profile}
    )
    out = compiled(x)
    report = spyre_backend.last_report()
    expected = rotate_half(round_dl16(x.float()))  # what the transfer onto the card holds
    err = float((out.float() - expected).abs().max())
    print(f"{profile}, head {size}: max |error| {err}, ops {dict(report.ops_seen)}")
    assert report.ok, f"head {size}: {report.summary()}"
    assert out.shape == x.shape and err == 0.0, f"head {size}: max |error| {err}"
    assert report.ops_seen["aten::constant_pad_nd"] == (1 if size % 64 else 0), report.ops_seen
    assert not report.defects, [d.defect_id for d in report.defects]


@pytest.mark.parametrize("size", [16, 32])
def test_the_unpadded_forms_do_not_lower_off_a_stick(spyre_backend: Any, size: int) -> None:
    """The controls, spyre-2026.07: the split on a new axis meets #3138, ``x @ R`` with K =
    the head size meets layout.matmul_k."""
    x = torch.randn(1, 2, 64, size).half()
    found = {}
    for form, rule in (
        (_halves_on_a_new_axis, "layout.interleaved_stick_split"),
        (_matmul_k_unpadded, "layout.matmul_k"),
    ):
        torch._dynamo.reset()
        with pytest.raises(SpyreLoweringError) as err:
            torch.compile(form, backend="spyre", options={"profile": "spyre-2026.07"})(x)
        found[form.__name__] = str(err.value).splitlines()[0][:200]
        assert rule in str(err.value), f"head {size}, {form.__name__}: {err.value}"
    print(f"head {size}: {found}")


def _tiny_modernbert(folder: Path, heads: int) -> Path:
    fields = {
        "model_type": "modernbert",
        "architectures": ["ModernBertModel"],
        "hidden_size": 256,
        "num_attention_heads": heads,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "global_attn_every_n_layers": 2,
        "local_attention": 128,
    }
    (folder / "config.json").write_text(json.dumps(fields))
    return folder


def _diagnose(folder: Path, without: tuple[str, ...] = ()) -> Any:
    from hfadapt.judge.diagnose import diagnose

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return diagnose(
            str(folder),
            mode="structural",
            execution="compile",
            without_adapters=without,
            record=False,
            localize_failures=False,
        )


@pytest.mark.slow  # two structural judges, about 20 s on a loaded machine
def test_a_modernbert_with_16_wide_heads_passes_compiled_with_the_padded_rotation(
    tmp_path: Path,
) -> None:
    folder = _tiny_modernbert(tmp_path, heads=16)
    d = _diagnose(folder)
    cos = d.metrics.min_token_cosine if d.metrics else None
    print(f"16-wide heads: {d.verdict}, min token cosine {cos}, adapters {d.adapters}")
    assert d.verdict == "pass", f"{d.verdict}: {d.reason} (min token cosine {cos})"
    assert cos is not None and cos >= 0.99, cos
    assert "rope-rotate-padded-modernbert" in d.adapters, d.adapters
    assert "rope-rotate-matmul-modernbert" not in d.adapters, d.adapters

    torch._dynamo.reset()
    without = _diagnose(folder, without=("rope-rotate-padded-modernbert",))
    print(f"without the padded rotation: {without.verdict}: {without.reason[:300]}")
    assert without.verdict == "lowering_failed", f"{without.verdict}: {without.reason}"
    assert "layout.stick_slice" in without.reason, without.reason
