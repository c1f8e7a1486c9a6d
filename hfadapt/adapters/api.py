"""The adapter API: one small Python file declares, with the ``@adapter`` decorator, what it
replaces (a module class's method, a model's forward inputs, or the attention function), when
it applies, which device rule it works around, and where it came from.

Everything an adapter file needs comes from here: the decorator, ``STICK`` (the device's
64-element stick), ``MASKED`` (the additive value of a masked attention position),
``forward_arg`` / ``replace_forward_arg`` (read and replace one argument of a forward, for
``pre_hook`` adapters), the host helpers ``on_host``, ``host_copy`` and ``host_constant`` (run
stock code on the host, result back on the device; build a constant once), ``stock_method`` and
``rebind`` (run the model's own code with one name swapped; ``globals_read`` and ``innermost``
say which names that code reads, through its decorators), ``inline_only`` for an adapter
that only routes the call to other code (``hfadapt.spyre.frames``: Dynamo then never compiles
it as a frame of its own), and example builders for the proofs (``tiny_model``, ``bert_at_trained_scale``, ``ExpFeatures``). How to write and prove
one: docs/adapters.md."""

from __future__ import annotations

import contextlib
import inspect
import pkgutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch

from hfadapt.adapters.examples import ExpFeatures, bert_at_trained_scale, tiny_model
from hfadapt.adapters.host import host_constant, host_copy, on_host, to_device, to_host
from hfadapt.adapters.rebind import globals_read, innermost, rebind, stock_bound, stock_method
from hfadapt.errors import AdapterError
from hfadapt.spyre.frames import inline_only
from hfadapt.spyre.numerics.dl16 import STICK_ELEMENTS
from hfadapt.spyre.rules.layout_rules import head_dim

__all__ = [
    "MASKED",
    "STICK",
    "Adapter",
    "ExpFeatures",
    "Provenance",
    "adapter",
    "bert_at_trained_scale",
    "collected",
    "forward_arg",
    "globals_read",
    "head_dim",
    "host_constant",
    "host_copy",
    "inline_only",
    "innermost",
    "on_host",
    "rebind",
    "replace_forward_arg",
    "stock_method",
    "tiny_model",
    "to_device",
    "to_host",
]

Kind = Literal["method", "pre_hook", "attention"]
Proof = Literal["call", "model"]
KINDS: tuple[str, ...] = get_args(Kind)
PROOFS: tuple[str, ...] = get_args(Proof)
ExampleFn = Callable[[int], tuple[Any, tuple[Any, ...], dict[str, Any]]]

# The device's unit of layout: 64 fp16 elements (128 bytes) along the last dimension. Matmul
# reduction sizes and sequence lengths must be whole sticks (the profile's ``layout`` section;
# docs/device-profile.md). Defined once, beside the profile's layout section.
STICK = STICK_ELEMENTS

# The additive value of a masked attention position: fp16's finfo.min / 2 (-32752, hf-adapters'
# value), for every dtype. exp(MASKED - max) is 0 as with -inf, and the value stays inside DL16's
# range; bf16's own finfo.min / 2 (-1.7e38) does not: moved onto the device it becomes -inf and a
# bf16 model's attention turns to NaN (EmbeddingGemma did).
MASKED = float(torch.finfo(torch.float16).min) / 2


@dataclass(frozen=True)
class Provenance:
    """Where an adapter came from: written by hand, or drafted by an agent and proven. The
    defaults describe a hand-written hfadapt adapter, so bundled files give no provenance."""

    origin: str = "hand-written"  # hand-written | agent
    author: str = "hfadapt"
    date: str = ""
    endpoint_model: str | None = None
    attempt_id: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v not in (None, {}, "")}


@dataclass
class Adapter:
    """One registered rewrite.

    kind ``method``: ``target`` is ``"pkg.module:Class.method"``; on each matching instance the
    method is replaced by ``fn(self, *args, **kwargs)``.
    kind ``pre_hook``: ``fn(module, args, kwargs) -> (args, kwargs) | None`` runs before the
    matching module's forward (e.g. build an attention mask on the host).
    kind ``attention``: ``fn`` is a transformers attention function (module, q, k, v, mask, ...);
    matching models switch ``config._attn_implementation`` to it.
    """

    name: str
    kind: Kind
    target: str
    fn: Callable[..., Any]
    rule: str  # the device-profile rule id it works around
    description: str = ""
    applies: Callable[[Any, Any], bool] | None = None  # (module, config) -> bool
    example: ExampleFn | None = None  # seed -> (module, args, kwargs) for equivalence proofs
    provenance: Provenance = field(default_factory=Provenance)
    priority: int = 100
    proof: Proof = "call"  # "call": fn against the stock method; "model": the model's output
    path: str = ""  # the file (or, for a graph, the folder) it was loaded from
    source: str = ""  # "bundled", "user", "entry-point:<pkg>", or "inline"
    form: str = "python"  # "python": code people wrote; "graph": an agent's draft, run as data

    def target_class(self) -> type | None:
        """The class whose instances this adapter matches (None for model-level adapters)."""
        module_name, _, qual = self.target.partition(":")
        if not qual:
            raise AdapterError(
                f"adapter {self.name}: target {self.target!r} is not 'module:Class[.method]'"
            )
        cls_name = qual.split(".")[0]
        try:
            obj: Any = pkgutil.resolve_name(f"{module_name}:{cls_name}")
        except ImportError as exc:
            raise AdapterError(f"adapter {self.name}: cannot import {module_name}: {exc}") from exc
        except AttributeError:
            obj = None
        if not isinstance(obj, type):
            raise AdapterError(f"adapter {self.name}: {module_name} has no class {cls_name}")
        return obj

    def target_loaded(self) -> bool:
        """Whether the target's module has been imported in this process (a malformed target
        counts as loaded, so resolving it reports the mistake). An instance of the target can
        only exist once its module ran: matching skips the rest without importing them."""
        module_name, sep, _ = self.target.partition(":")
        return not sep or module_name in sys.modules

    @property
    def method_name(self) -> str:
        qual = self.target.partition(":")[2]
        return qual.split(".", 1)[1] if "." in qual else "forward"

    def original(self) -> Callable[..., object]:
        """The stock code this adapter replaces (for equivalence proofs). For a method, the
        instance's own class method: a subclass's override is what that instance runs."""
        if self.kind == "method":
            method = self.method_name

            def stock(module: torch.nn.Module, *args: object, **kwargs: object) -> Any:
                return stock_bound(module, method)(*args, **kwargs)

            return stock
        if self.kind == "attention":
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward
        raise AdapterError(
            f"adapter {self.name}: a {self.kind} adapter replaces no single function"
        )

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "target": self.target,
            "rule": self.rule,
            "description": self.description,
            "provenance": self.provenance.to_dict(),
            "path": self.path,
            "source": self.source,
            "form": self.form,
        }


# Where the decorator puts what it makes; ``collected`` swaps it while a file runs.
_COLLECTOR: list[Adapter] = []


@contextlib.contextmanager
def collected() -> Iterator[list[Adapter]]:
    """The adapters ``@adapter`` makes while inside (an adapter file's code running), in a
    fresh list; before and after, they go where they went before."""
    global _COLLECTOR
    saved = _COLLECTOR
    found: list[Adapter] = []
    _COLLECTOR = found
    try:
        yield found
    finally:
        _COLLECTOR = saved


def adapter(
    *,
    name: str,
    target: str,
    rule: str,
    kind: Kind = "method",
    description: str = "",
    applies: Callable[[Any, Any], bool] | None = None,
    example: ExampleFn | None = None,
    provenance: Provenance | dict[str, Any] | None = None,
    priority: int = 100,
    proof: Proof = "call",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as an adapter (llm-style: the decorator appends).
    ``provenance`` left out: a hand-written hfadapt adapter (the ``Provenance`` defaults)."""
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise AdapterError(f"adapter name {name!r} must be letters, digits, '-' or '_'")
    if kind not in KINDS:
        raise AdapterError(f"adapter {name}: kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if proof not in PROOFS:
        raise AdapterError(
            f"adapter {name}: proof must be one of {', '.join(PROOFS)}, not {proof!r}"
        )
    prov = provenance if isinstance(provenance, Provenance) else Provenance(**(provenance or {}))

    def register(fn: Callable[..., object]) -> Callable[..., Any]:
        made = Adapter(
            name=name,
            kind=kind,
            target=target,
            fn=fn,
            rule=rule,
            description=description or (fn.__doc__ or "").strip(),
            applies=applies,
            example=example,
            provenance=prov,
            priority=priority,
            proof=proof,
        )
        _COLLECTOR.append(made)
        # kept on the function too, so a plugin's register(registry) can hand its module's
        # adapters over again however many times discovery runs (Registry.add_module)
        fn.__hfadapt_adapter__ = made  # type: ignore[attr-defined]
        return fn

    return register


# -- forward arguments (pre_hook adapters) -------------------------------------------------


def _position(module: Any, name: str) -> int | None:
    """Where ``name`` stands among the positional parameters of this module's forward."""
    params = [p for p in inspect.signature(type(module).forward).parameters if p != "self"]
    return params.index(name) if name in params else None


def forward_arg(
    module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object], name: str
) -> object:
    """The value of the forward argument ``name`` in a call ``module(*args, **kwargs)``,
    passed by keyword or by position; None when the call does not pass it."""
    if name in kwargs:
        return kwargs[name]
    idx = _position(module, name)
    return args[idx] if idx is not None and len(args) > idx else None


def replace_forward_arg(
    module: torch.nn.Module,
    args: tuple[object, ...],
    kwargs: dict[str, object],
    name: str,
    value: object,
) -> tuple[tuple[object, ...], dict[str, object]]:
    """``(args, kwargs)`` with the forward argument ``name`` set to ``value``, where the call
    passed it (by position or keyword), else as a keyword: what a pre_hook returns."""
    idx = _position(module, name)
    if name not in kwargs and idx is not None and len(args) > idx:
        return (*args[:idx], value, *args[idx + 1 :]), kwargs
    return args, {**kwargs, name: value}
