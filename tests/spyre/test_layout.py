"""Layout rules: model alignment (unsupported models), head_dim, matmul K, slicing the stick
dimension, zero-length tensors and dynamic shapes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertModel

from hfadapt.errors import SpyreLoweringError, SpyreUnsupportedModelError
from hfadapt.spyre.rules.layout_rules import check_model, ensure_supported

pytestmark = pytest.mark.usefixtures("spyre_backend")


def fp16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).half()


def refused(module: nn.Module, *inputs: torch.Tensor, **compile_kwargs: object):  # type: ignore[no-untyped-def]
    with pytest.raises(SpyreLoweringError) as info:
        torch.compile(module, backend="spyre", **compile_kwargs)(*inputs)
    return info.value.report


def test_hidden_size_312_is_an_unsupported_model(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    config = BertConfig(hidden_size=312, num_attention_heads=12, intermediate_size=1200)
    with pytest.raises(SpyreUnsupportedModelError) as info:
        ensure_supported(config)
    assert str(info.value) == (
        "SpyreUnsupportedModelError: hidden_size=312 is not a multiple of 64; it cannot be "
        "padded without changing the arithmetic; intermediate_size=1200 is not a multiple of "
        "64; it cannot be padded without changing the arithmetic"
    )
    assert info.value.rule_id == "layout.model_alignment"
    # lower() refuses it before compiling anything
    tiny = BertModel(
        BertConfig(
            hidden_size=312, num_attention_heads=12, intermediate_size=1216, num_hidden_layers=1
        )
    ).half()
    with pytest.raises(
        SpyreUnsupportedModelError, match=r"hidden_size=312 is not a multiple of 64"
    ):
        spyre_backend.lower(tiny, {"input_ids": torch.ones(1, 64, dtype=torch.long)})
    assert spyre_backend.last_report() is None


def test_head_dim_32_is_reported_with_the_adapter_fix() -> None:
    # all-MiniLM-L6-v2's shape: 384 / 12 heads
    [v] = check_model(BertConfig(hidden_size=384, num_attention_heads=12, intermediate_size=1536))
    assert (v.rule_id, v.kind) == ("layout.head_dim", "model")
    assert v.message == "head_dim=32 is not a multiple of 64: zero-pad Q, K and V to 64"


def test_head_dim_32_attention_is_a_matmul_k_violation_at_the_call_site() -> None:
    class Attention(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v)  # <sdpa>

    q = fp16(2, 2, 64, 32)
    report = refused(Attention(), q, q.clone(), q.clone())
    [v] = report.violations  # Q @ K^T reduces over head_dim 32; P @ V over 64 keys is fine
    assert (v.rule_id, v.op) == ("layout.matmul_k", "aten::bmm"), str(v)
    assert "K=32" in v.message and v.shapes == ((4, 64, 32), (4, 32, 64)), str(v)
    assert v.location is not None and "<sdpa>" in v.location.code, v.location


def test_matmul_k_32() -> None:
    class Mm(nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x @ w

    [v] = refused(Mm(), fp16(64, 32), fp16(32, 64)).violations
    assert (v.rule_id, v.op) == ("layout.matmul_k", "aten::mm"), str(v)
    assert v.message.startswith("matmul reduction dimension K=32 is not a multiple of"), v.message


def test_slicing_the_stick_dimension_at_an_offset(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    class Halves(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[..., :32] * x[..., 32:]  # rotate_half's slicing

    [v] = refused(Halves(), fp16(4, 64)).violations
    assert (v.rule_id, v.op) == ("layout.stick_slice", "aten::slice.Tensor"), str(v)
    assert v.message == (
        "stick expression with offset: slicing the stick (last) dimension at offset 32, "
        "not a multiple of the stick (64 elements)"
    )

    class Rows(nn.Module):  # slicing another dimension, or the stick dim at offset 0, lowers
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[2:, :32] + 1

    torch.compile(Rows(), backend="spyre")(fp16(4, 64))
    assert spyre_backend.last_report().ok

    class Sticks(nn.Module):  # a stick-aligned offset (hf-adapters _dspark_common.py) lowers
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[..., 64:] * x[..., :64]

    torch._dynamo.reset()
    torch.compile(Sticks(), backend="spyre")(fp16(4, 128))
    assert spyre_backend.last_report().ok, spyre_backend.last_report().summary()

    class Floats(nn.Module):  # an fp32 stick holds 32 elements: offset 32 is aligned there
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.float()[..., 32:] * 2).half()

    torch._dynamo.reset()
    torch.compile(Floats(), backend="spyre")(fp16(4, 64))
    assert spyre_backend.last_report().ok, spyre_backend.last_report().summary()


def test_zero_length_tensor() -> None:
    class Double(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    [v] = refused(Double(), fp16(0, 64)).violations
    assert (v.rule_id, v.op) == ("layout.zero_length", "aten::mul.Tensor"), str(v)
    assert v.message == "zero-length tensor of shape [0, 64]: the device crashes"


def test_dynamic_shapes() -> None:
    class Double(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    report = refused(Double(), fp16(8, 64), dynamic=True)
    rules = {v.rule_id for v in report.violations}
    assert rules == {"layout.dynamic_shape"}, [str(v) for v in report.violations]
    assert "shapes must be static" in report.violations[0].message


def test_a_new_shape_recompiles_statically_or_is_refused(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    """Dynamo marks a dimension dynamic after it changes: the card compiles each static shape,
    so with dynamic=False and by default alike every shape gets its own static graph; only
    ``dynamic=True`` asks for dynamic shapes, a dynamic-shape violation."""

    class Double(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    static = torch.compile(Double(), backend="spyre", dynamic=False)
    static(fp16(8, 64))
    static(fp16(16, 64))
    assert spyre_backend.last_report().ok
    torch._dynamo.reset()
    default = torch.compile(Double(), backend="spyre")
    default(fp16(8, 64))
    out = default(fp16(16, 64))
    assert out.shape == (16, 64) and spyre_backend.last_report().ok
    torch._dynamo.reset()
    dynamic = torch.compile(Double(), backend="spyre", dynamic=True)
    with pytest.raises(SpyreLoweringError, match="dynamic shape"):
        dynamic(fp16(16, 64))


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {
                "model_type": "qwen3",
                "hidden_size": 1024,
                "intermediate_size": 3072,
                "num_attention_heads": 16,
                "head_dim": 64,
            },
            "head_dim=64 is not a multiple of 128: zero-pad Q, K and V to 128 (RoPE)",
        ),
        (
            {
                "model_type": "modernbert",
                "hidden_size": 768,
                "intermediate_size": 1152,
                "num_attention_heads": 12,
            },
            "head_dim=64 is not a multiple of 128: zero-pad Q, K and V to 128 (RoPE)",
        ),
        (
            {
                "model_type": "bert",
                "hidden_size": 1280,
                "intermediate_size": 5120,
                "num_attention_heads": 16,
            },
            "head_dim=80 is not a multiple of 64: zero-pad Q, K and V to 128",
        ),
    ],
    ids=["qwen3-rope-64", "modernbert-rope-64", "bert-80"],
)
def test_head_dim_padding_target(config: dict[str, object], message: str) -> None:
    [v] = check_model(config)
    assert v.message == message
