"""Rotary position embeddings the device can lower (docs/device-profile.md, "Rewrites").

- cos/sin: the rotary module casts integer positions to fp32 on the device (a cast it refuses,
  rule dtype.cast) and calls sin/cos (host fallbacks). The stock rotary forward runs on the host
  instead, and its cos/sin are sent over: the same numbers, computed where they were anyway.
- rotate_half slices the head dimension at head_dim/2, an offset into the stick dimension
  ("stick expression with offset", rule layout.stick_slice). It is the linear map
  x -> cat(-x2, x1), so it is written as ``x @ R`` with R a fixed 0/+-1 matrix: each output is
  one input times +-1 plus exact zeros (in fp32, which the device cannot matmul, the halves are
  taken along a new non-stick axis instead). The attention forward runs as stock code with
  ``apply_rotary_pos_emb`` seeing this ``rotate_half``.
- A head that is not a whole number of sticks (granite-embedding-small-english-r2: 32) cannot
  be rotated by ``x @ R`` (its K, 32, is off the stick: rule layout.matmul_k), by slicing (an
  offset of 16 into the stick: layout.stick_slice), nor by taking the halves along a new axis
  (the stick split into [2, 16], torch-spyre#3138: layout.interleaved_stick_split). It is
  zero-padded on the right to whole sticks first (``constant_pad_nd``) and multiplied by R with
  zero rows for the padding, ``[.., 64] @ [64, 32]``: K is a whole stick, the product has the
  head's own width (no slice back), and each output is still one input times +-1 plus exact
  zeros. Those heads get the ``rope-rotate-padded-*`` adapters (proven at head size 32), the
  others ``rope-rotate-matmul-*`` (proven at 128): one rotation, two scopes, each proven where
  it applies.
- ModernBERT rotates in fp32 (``q.float() * cos ...``, then ``.to(q.dtype)``): on the card's
  eager path that fp32 -> fp16 cast returns its elements scrambled (torch-spyre #2314,
  defect.eager_fp32_cast). Its rotation runs in the model's dtype instead, cos/sin being in
  that dtype already: each product and sum rounded once to fp16, no cast on the device.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.nn import functional as F

from hfadapt.adapters.api import STICK, adapter, head_dim, host_constant, host_copy, on_host
from hfadapt.adapters.rebind import rebind, stock_method


class RopeForm(NamedTuple):
    """How one family's transformers code does rotary embeddings."""

    model_type: str  # config.model_type
    module: str  # the transformers module with {prefix}RotaryEmbedding and {prefix}Attention
    prefix: str
    per_layer_type: bool = False  # the rotary forward takes a layer_type (one rope per kind)
    fp32_rotation: bool = False  # apply_rotary_pos_emb rotates in fp32 and casts back
    attention: str = "sdpa"  # the attention its proof example runs (gemma2's softcap: eager)


# The one RoPE table: adapter family (in the adapter names) -> rope form.
ROPE_FORMS: dict[str, RopeForm] = {
    "qwen3": RopeForm("qwen3", "transformers.models.qwen3.modeling_qwen3", "Qwen3"),
    "gemma3": RopeForm("gemma3_text", "transformers.models.gemma3.modeling_gemma3", "Gemma3", True),
    "modernbert": RopeForm(
        "modernbert",
        "transformers.models.modernbert.modeling_modernbert",
        "ModernBert",
        per_layer_type=True,
        fp32_rotation=True,
    ),
    "nomic-bert": RopeForm(
        "nomic_bert", "transformers.models.nomic_bert.modeling_nomic_bert", "NomicBert"
    ),
    "qwen2": RopeForm("qwen2", "transformers.models.qwen2.modeling_qwen2", "Qwen2"),
    "mistral": RopeForm("mistral", "transformers.models.mistral.modeling_mistral", "Mistral"),
    "llama": RopeForm("llama", "transformers.models.llama.modeling_llama", "Llama"),
    # gemma2 (bge-multilingual-gemma2): one rope for every layer, unlike gemma3's per-kind ones
    "gemma2": RopeForm(
        "gemma2", "transformers.models.gemma2.modeling_gemma2", "Gemma2", attention="eager"
    ),
    # Qwen3-VL's text model (the text tower of Qwen3-VL-Embedding): multimodal rope whose three
    # position rows are equal for text, so its stock forward on the host gives the 1-D rope
    "qwen3-vl": RopeForm(
        "qwen3_vl_text", "transformers.models.qwen3_vl.modeling_qwen3_vl", "Qwen3VLText"
    ),
    # native classes that remote-code families are translated to (hfadapt.loading.translate)
    "gte": RopeForm("gte", "transformers.models.gte.modeling_gte", "Gte"),
    "jina-v3": RopeForm(
        "jina_embeddings_v3",
        "transformers.models.jina_embeddings_v3.modeling_jina_embeddings_v3",
        "JinaEmbeddingsV3",
    ),
    "eurobert": RopeForm("eurobert", "transformers.models.eurobert.modeling_eurobert", "EuroBert"),
}


def rotation_matrix(
    dim: int, dtype: torch.dtype, device: torch.device, rows: int | None = None
) -> Tensor:
    """R[rows, dim] with pad(x, rows - dim) @ R == rotate_half(x) == cat(-x[..., d/2:],
    x[..., :d/2]): the rows past ``dim`` (``rows`` defaults to ``dim``) meet the zero padding
    and are zero. Built on the host once per (size, rows, dtype, device); a compiled graph then
    sees it as a constant."""
    width = dim if rows is None else rows
    return host_constant("rope.rotate_half", _rotation, dim, width, dtype, back_to=device)


def _rotation(dim: int, rows: int, dtype: torch.dtype) -> Tensor:
    half = dim // 2
    r = torch.zeros(rows, dim, dtype=dtype)
    idx = torch.arange(half)
    r[idx + half, idx] = -1
    r[idx, idx + half] = 1
    return r


_STICK_FP16 = STICK  # elements of a 128-byte stick in fp16/bf16 (the profile's)


def stick_width(size: int) -> int:
    """``size`` rounded up to whole fp16/bf16 sticks."""
    return -(-size // _STICK_FP16) * _STICK_FP16


def rotate_half_matmul(x: Tensor) -> Tensor:
    """rotate_half without slicing the stick dimension. fp16/bf16: ``x @ R`` (hf-adapters'
    rewrite); a head size that is not a whole number of sticks (granite-embedding-small's 32)
    is zero-padded to whole sticks first and R has zero rows for the padding, so the matmul's
    K is on the stick boundary and its output has the head's own width. fp32 (the device has no
    fp32 matmul): the halves are selected along a new second-to-last axis, negated and
    concatenated back."""
    size = x.shape[-1]
    if x.dtype == torch.float32:
        halves = x.unflatten(-1, (2, size // 2))
        x1, x2 = halves.select(-2, 0), halves.select(-2, 1)
        return torch.cat((-x2, x1), dim=-1)
    width = stick_width(size)
    if width != size:
        x = F.pad(x, (0, width - size))
    return torch.matmul(x, rotation_matrix(size, x.dtype, x.device, rows=width))


def _rotation_in_model_dtype(
    q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int = 1
) -> tuple[Tensor, Tensor]:
    """apply_rotary_pos_emb without the fp32 island: q and k rotated in their own dtype (cos
    and sin converted only if they come in another one), with the matmul rotate_half."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    if cos.dtype != q.dtype:
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    q_embed = (q * cos) + (rotate_half_matmul(q) * sin)
    k_embed = (k * cos) + (rotate_half_matmul(k) * sin)
    return q_embed, k_embed


def _stock_rotary(
    module: torch.nn.Module, dtype: torch.dtype, position_ids: Tensor, *args: Any, **kwargs: Any
) -> Any:
    """The stock rotary forward on a host copy (fp32 buffers); cos/sin come out in ``dtype``."""
    stub = torch.empty(0, dtype=dtype)
    return stock_method(type(module), "forward")(
        host_copy(module), stub, position_ids, *args, **kwargs
    )


def _layer_type(form: RopeForm, cfg: Any) -> dict[str, Any]:
    """The rotary forward's ``layer_type`` argument, for families with one rope per kind."""
    types = getattr(cfg, "layer_types", None)
    return {"layer_type": types[0]} if types and form.per_layer_type else {}


def _rotary_example(form: RopeForm):
    def make(seed: int):
        import importlib

        from transformers import AutoConfig

        mod = importlib.import_module(form.module)
        cfg = AutoConfig.for_model(
            form.model_type, hidden_size=256, num_attention_heads=2, head_dim=128
        )
        rope = getattr(mod, f"{form.prefix}RotaryEmbedding")(cfg).double()
        x = torch.randn(2, 64, 256, dtype=torch.float64)
        pos = torch.arange(64)[None].expand(2, -1) + seed
        return rope, (x, pos), _layer_type(form, cfg)

    return make


def _attention_example(form: RopeForm, head_size: int = 128):
    """The family's attention at 64 tokens, hidden size 256 in heads of ``head_size``."""
    heads = 256 // head_size

    def make(seed: int):
        import importlib

        from transformers import AutoConfig

        mod = importlib.import_module(form.module)
        cfg = AutoConfig.for_model(
            form.model_type,
            hidden_size=256,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            head_dim=head_size,
            attn_implementation=form.attention,
            attention_dropout=0.0,
        )
        cls = getattr(mod, f"{form.prefix}Attention")
        try:
            attn = cls(cfg, layer_idx=0)
        except TypeError:
            attn = cls(cfg)
        torch.manual_seed(seed)
        rope = getattr(mod, f"{form.prefix}RotaryEmbedding")(cfg)
        x = torch.randn(2, 64, 256)
        cos, sin = rope(x, torch.arange(64)[None].expand(2, -1), **_layer_type(form, cfg))
        return (
            attn.double().eval(),
            (),
            {
                "hidden_states": x.double(),
                "position_embeddings": (cos.double(), sin.double()),
                "attention_mask": None,
            },
        )

    return make


# The attention forward with the matmul rotate_half, kept on each attention module when the
# adapter is applied: built before any trace. Looked up from the rebind cache while Dynamo
# traced the forward, a lookup the trace missed called the cache's disabled builder, a graph
# break that depended on what the process had compiled before (docs/device-profile-rules.md).
_ROTATED_FORWARD = "_hfadapt_rotated_forward"


def _rotated_forward(module: torch.nn.Module) -> Any:
    home = sys.modules[type(module).__module__]
    fp32 = any(f.fp32_rotation and f.module == home.__name__ for f in ROPE_FORMS.values())
    if fp32:
        apply = _rotation_in_model_dtype
    else:
        apply = rebind(home.apply_rotary_pos_emb, rotate_half=rotate_half_matmul)
    return rebind(stock_method(type(module), "forward"), apply_rotary_pos_emb=apply)


def _head_on_sticks(module: torch.nn.Module, config: Any) -> bool:
    """Whether the module's head size (the rotated width) is a whole number of sticks."""
    size = getattr(module, "head_dim", None)
    if not isinstance(size, int):
        size = head_dim(config)
    return size is None or size % _STICK_FP16 == 0


def _with_rotated_forward(module: torch.nn.Module, config: Any) -> bool:
    """applies() of rope-rotate-matmul-*: every attention module of the family whose head is a
    whole number of sticks; its rotated forward is built now."""
    if not _head_on_sticks(module, config):
        return False
    object.__setattr__(module, _ROTATED_FORWARD, _rotated_forward(module))
    return True


def _with_padded_rotated_forward(module: torch.nn.Module, config: Any) -> bool:
    """applies() of rope-rotate-padded-*: the attention modules whose head is not a whole
    number of sticks (the rotation pads it); its rotated forward is built now."""
    if _head_on_sticks(module, config):
        return False
    object.__setattr__(module, _ROTATED_FORWARD, _rotated_forward(module))
    return True


def _register(family: str, form: RopeForm) -> None:
    @adapter(
        name=f"rope-host-{family}",
        target=f"{form.module}:{form.prefix}RotaryEmbedding.forward",
        rule="dtype.cast",
        example=_rotary_example(form),
    )
    def rotary_on_host(
        self: torch.nn.Module, x: Tensor, position_ids: Tensor, *args: Any, **kwargs: Any
    ) -> Any:
        """The stock rotary forward (positions -> cos, sin) on the host."""
        return on_host(
            _stock_rotary, self, x.dtype, position_ids, *args, back_to=x.device, **kwargs
        )

    @adapter(
        name=f"rope-rotate-matmul-{family}",
        target=f"{form.module}:{form.prefix}Attention.forward",
        rule="layout.stick_slice",
        applies=_with_rotated_forward,
        example=_attention_example(form),
    )
    def attention_rotate_matmul(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        """The stock attention forward, its rotary step using rotate_half as a matmul."""
        return _run_rotated(self, *args, **kwargs)

    @adapter(
        name=f"rope-rotate-padded-{family}",
        target=f"{form.module}:{form.prefix}Attention.forward",
        rule="layout.stick_slice",
        applies=_with_padded_rotated_forward,
        example=_attention_example(form, head_size=32),
    )
    def attention_rotate_padded(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        """The stock attention forward for heads off a stick (16, 32 wide...), its rotate_half
        a matmul on the head zero-padded to whole sticks (never a [2, n/2] split)."""
        return _run_rotated(self, *args, **kwargs)


def _run_rotated(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    forward = getattr(module, _ROTATED_FORWARD, None)
    if forward is None:  # called without the registry (a proof on its example)
        forward = _rotated_forward(module)
    return forward(module, *args, **kwargs)


for _family, _form in ROPE_FORMS.items():
    _register(_family, _form)
