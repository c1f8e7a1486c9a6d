"""An eager ``.clone()`` where a post-LayerNorm output leaves one compiled graph for another.

defect.post_ln_handoff (hf-adapters ``hf_common.py``, encoder_backbone_forward, "REQUIRED"): a
tensor that ends on LayerNorm's broadcast against its 1-D weight/bias reads right on the host
but is misread by the next compiled graph's matmul. hf-adapters compiles each block apart and
clones between them, in eager Python: the clone allocates a fresh canonical-layout tensor.

Where our models cross graphs (found with ``hfadapt.spyre.compile.backend.lower`` on the
bundled families, docs/device-profile-rules.md):

- the ``attention-mask-host`` adapters build masks on the host (``torch.compiler.disable``),
  which breaks the graph right after the embeddings, whose output ends in LayerNorm (BERT,
  XLM-R, RoBERTa, MPNet, DistilBERT, ModernBERT, NomicBERT): the encoder's Q/K/V projections
  in the next graph read it;
- a break inside a module makes Dynamo compile that module's frame apart from its caller's:
  NomicBERT's, gte's and jina-embeddings-v3's layers (post-LN, split by the host rope) hand
  each output to the next layer's graph, and MPNet's encoder
  (the host position bias) hands its last LayerNorm output to the pooler's graph.

- the sentence-transformers heads hfadapt attaches after a transformer
  (``hfadapt.loading.heads.Heads``): the transformer's frame breaks (the host masks above), so
  its last LayerNorm output reaches the heads in a graph of their own, whose first op is often
  a matmul on it (a ColBERT / PyLate projection, SPLADE's MLM head, BGE-M3's linears).

This adapter returns an eager clone of those modules' outputs, and for the heads an eager clone
of the token states they are handed (their input: the heads' own output ends in no LayerNorm):
the clone runs between the graphs (where the graph breaks anyway), and the value is the same.
Modules whose output stays inside one graph (BERT's layers) are left alone: a clone there would
add a graph break for nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from hfadapt.adapters.api import adapter
from hfadapt.adapters.examples import bert_at_trained_scale


@torch.compiler.disable
def eager_clone(value: Any) -> Any:
    """``value`` with its tensors cloned on the host (outside any compiled graph)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):  # transformers ModelOutput (a dict in field order)
        return type(value)(**{k: eager_clone(v) for k, v in value.items()})
    if isinstance(value, tuple):
        return tuple(eager_clone(v) for v in value)
    return value


# Modules compiled as frames of their own (a host step inside them breaks the graph) whose
# output ends in a LayerNorm read by the caller's next graph: class name -> why.
OWN_FRAME_HANDOFFS = {
    "NomicBertLayer": "post-LN layers, each its own frame: the output goes to the next layer",
    "GteLayer": "post-LN layers split by the host rope (Alibaba new -> gte): as NomicBertLayer",
    "JinaEmbeddingsV3Layer": "post-LN layers split by the host rope (jina-embeddings-v3)",
    "MPNetEncoder": "the host position bias splits the frame: the output goes to the pooler",
}


# Modules handed a LayerNorm output from another graph, whose input is cloned: (module, class).
INPUT_HANDOFFS = {
    ("hfadapt.loading.heads", "Heads"): "the heads after a transformer, in a graph of their own",
}


def _takes_a_handoff(module: torch.nn.Module) -> bool:
    return (type(module).__module__, type(module).__name__) in INPUT_HANDOFFS


def _hands_off_a_layer_norm_output(module: torch.nn.Module, config: Any) -> bool:
    """A model's embeddings module (class ``*Embeddings``) with a LayerNorm of its own, one of
    ``OWN_FRAME_HANDOFFS``, or one of ``INPUT_HANDOFFS`` (its input is what is handed off)."""
    name = type(module).__name__
    if name in OWN_FRAME_HANDOFFS or _takes_a_handoff(module):
        return True
    return name.endswith("Embeddings") and any(
        isinstance(child, torch.nn.LayerNorm) for child in module.children()
    )


@adapter(
    name="post-ln-handoff-clone",
    target="torch.nn.modules.module:Module.forward",
    rule="defect.post_ln_handoff",
    applies=_hands_off_a_layer_norm_output,
    example=bert_at_trained_scale,
    proof="model",
)
def clone_the_handoff(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The stock module, its output cloned in eager Python before the next graph reads it (for
    a module of ``INPUT_HANDOFFS``, its input, before it reads it)."""
    if _takes_a_handoff(self):
        return type(self).forward(self, *eager_clone(args), **kwargs)
    return eager_clone(type(self).forward(self, *args, **kwargs))
