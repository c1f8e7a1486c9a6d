"""How much memory judging a structural stand-in takes, estimated from its config before any
weight exists, and how a stand-in is sized to fit a memory budget.

The estimate: the stand-in's parameters (counted exactly, on a model built on the ``meta``
device) times ``PARAM_COPIES`` (the fp32 model, its device copy, the device's half-precision
and compiled copies), plus the activations at the probe lengths times ``ACTIVATION_COPIES``
(the CPU reference runs twice, the device once, and the device run keeps what it collects).
Both factors are upper bounds of peaks measured with ``ru_maxrss`` on Qwen3 and BERT
stand-ins (docs in the ``PARAM_COPIES`` comment); the process's own base (torch, transformers,
hfadapt imported: ``PROCESS_BASE_MB`` of address space) is not part of it.

Sizing (``fit``), in this order, each step only while the estimate is over the budget:

1. a config of the model_type's defaults (``small_member=True``: offline, only the model_type
   is known) is first narrowed to ``SMALL_MEMBER_HIDDEN``, the width of the family's small
   members (Qwen3-0.6B and bge-m3 are 1024 wide, EmbeddingGemma 768), not its 4096-wide default;
2. the width: the widest instance of the same lowering class that fits (fewer heads, whole
   grouped-query groups; head_dim kept; hidden and intermediate sizes keep their residue
   modulo the stick, the intermediate keeps its ratio to the hidden size; norms, activations,
   rope and every other signature field untouched: ``lowering_signature`` is checked equal);
3. the depth: one layer of each distinct layer type (sliding/full attention...), at least one.

A stand-in still over the budget raises ``StandInTooLargeError`` (the run is ``skipped`` with
its reason). Every change is a note in the run's evidence. ``budget`` sets the budget for the
code inside (a sweep worker derives it from its memory limit); without one,
``DEFAULT_BUDGET_MB``, lowered to what an address-space limit (``ulimit -v``) leaves."""

from __future__ import annotations

import contextlib
import contextvars
import os
import resource
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hfadapt.errors import StandInTooLargeError
from hfadapt.loading.signature import ALIGNMENT, lowering_signature

__all__ = [
    "ACTIVATION_COPIES",
    "DEFAULT_BUDGET_MB",
    "PARAM_COPIES",
    "PROCESS_BASE_MB",
    "SMALL_MEMBER_HIDDEN",
    "Estimate",
    "budget",
    "budget_for_limit",
    "current_budget_mb",
    "estimate",
    "fit",
]

# The factors, fitted by least squares to the growth of peak memory (ru_maxrss and VmPeak
# alike) over a MiniLM-sized judge, four 2-layer Qwen3 stand-ins of 36M-214M parameters (random
# probes, compile execution): 1.91 per byte of fp32 parameters (the model and its device copy)
# and 1.40 per byte of activations (the reference's two runs, the device run); rounded up to
# keep a margin (the estimate is then 10-35% above what was measured).
PARAM_COPIES = 2.5
ACTIVATION_COPIES = 2.0
# Address space of a worker process with torch, transformers and hfadapt imported and a small
# (MiniLM-sized) structural judge done: VmPeak measured 1,149 MB.
PROCESS_BASE_MB = 1200
# What a structural judge may take beyond the process's base when nothing lowers it: a worker
# then peaks near PROCESS_BASE_MB + this of address space, whatever the config.
DEFAULT_BUDGET_MB = 4096
# The width a config of the model_type's defaults is judged at: the family's small members.
SMALL_MEMBER_HIDDEN = 1024

_HIDDEN = ("hidden_size", "d_model", "dim", "n_embd")
_HEADS = ("num_attention_heads", "num_heads", "n_heads", "n_head")
_KV_HEADS = ("num_key_value_heads",)
_HEAD_DIM = ("head_dim", "d_kv", "attention_head_size")
_INTER = ("intermediate_size", "hidden_dim", "ffn_dim", "d_ff", "n_inner", "mlp_dim")

_budget: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "stand_in_budget", default=None
)


@dataclass(frozen=True)
class Estimate:
    """The estimated memory of judging one stand-in, in MB beyond the process's base."""

    parameters: int
    param_mb: float
    activation_mb: float

    @property
    def judge_mb(self) -> float:
        return PARAM_COPIES * self.param_mb + ACTIVATION_COPIES * self.activation_mb

    def describe(self) -> str:
        return (
            f"{self.parameters / 1e6:,.1f}M parameters, about {self.judge_mb:,.0f} MB to judge "
            f"({self.param_mb:,.0f} MB of fp32 weights, {self.activation_mb:,.0f} MB of "
            "activations per forward)"
        )


# ---- the budget ----------------------------------------------------------------------------


def budget_for_limit(limit_mb: int | None) -> int:
    """The budget of a process whose address space is capped at ``limit_mb`` (None or 0: no
    cap): what the cap leaves beyond the process's base, at most DEFAULT_BUDGET_MB."""
    if not limit_mb:
        return DEFAULT_BUDGET_MB
    return max(0, min(DEFAULT_BUDGET_MB, int(limit_mb) - PROCESS_BASE_MB))


@contextlib.contextmanager
def budget(mb: int | None) -> Iterator[None]:
    """Stand-ins built inside fit in ``mb`` MB (None: the default rule, see module doc)."""
    token = _budget.set(mb)
    try:
        yield
    finally:
        _budget.reset(token)


def _address_space_mb() -> tuple[int | None, int]:
    """(this process's RLIMIT_AS soft limit in MB or None, its current address space in MB)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = None if soft == resource.RLIM_INFINITY else int(soft // 2**20)
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[0])
        return limit, int(pages * os.sysconf("SC_PAGE_SIZE") / 2**20)
    except (OSError, ValueError):
        return limit, PROCESS_BASE_MB


def current_budget_mb() -> int:
    """The budget in force: the one ``budget`` set, else DEFAULT_BUDGET_MB, lowered to what an
    address-space limit on this process leaves beyond what it already maps."""
    set_mb = _budget.get()
    if set_mb is not None:
        return set_mb
    limit, used = _address_space_mb()
    if limit is None:
        return DEFAULT_BUDGET_MB
    return max(0, min(DEFAULT_BUDGET_MB, limit - max(used, PROCESS_BASE_MB)))


# ---- the estimate --------------------------------------------------------------------------


def _get(config: Any, names: tuple[str, ...]) -> tuple[str, int] | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def count_parameters(config: Any, build_meta: Callable[[Any], Any]) -> int:
    """The exact parameter count of the model ``config`` builds; ``build_meta(config)`` builds it
    on the meta device (no memory, no weights)."""
    return int(sum(p.numel() for p in build_meta(config).parameters()))


def activation_mb(config: Any, rows: int, length: int) -> float:
    """The activations one forward holds at ``rows`` x ``length`` probes: per layer, a dozen
    hidden-wide tensors, three intermediate-wide ones and the attention scores."""
    hidden = (_get(config, _HIDDEN) or ("", 0))[1]
    heads = (_get(config, _HEADS) or ("", 1))[1]
    inter = (_get(config, _INTER) or ("", 4 * hidden))[1]
    layers = int(getattr(config, "num_hidden_layers", 1) or 1)
    tokens = rows * length
    per_layer = tokens * (12 * hidden + 3 * inter) + rows * heads * length * length
    return 4 * layers * per_layer / 2**20


def estimate(config: Any, build_meta: Callable[[Any], Any], *, tokenized: bool = False) -> Estimate:
    """The estimated memory of judging the stand-in ``config`` builds (see module doc)."""
    from hfadapt.loading.probes import MAX_PROBE_LENGTH, PROBE_SENTENCES, RANDOM_LENGTHS

    params = count_parameters(config, build_meta)
    # random probes: 4 rows padded to 256; tokenized: 12 rows, at most MAX_PROBE_LENGTH long
    rows, length = (
        (len(PROBE_SENTENCES), MAX_PROBE_LENGTH) if tokenized else (len(RANDOM_LENGTHS), 256)
    )
    return Estimate(params, 4 * params / 2**20, activation_mb(config, rows, length))


# ---- sizing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Width:
    """The width fields of a config and how a narrower instance of its lowering class is made."""

    hidden: tuple[str, int]
    heads: tuple[str, int]
    kv: tuple[str, int] | None
    head_dim: int
    explicit_head_dim: bool
    inter: tuple[str, int] | None

    @property
    def group(self) -> int:
        if self.kv is None or self.kv[1] == self.heads[1]:
            return 1
        return self.heads[1] // self.kv[1]

    def head_counts(self) -> list[int]:
        """Candidate head counts, widest first (whole groups under grouped-query attention)."""
        step = self.group
        low = step if step > 1 else min(self.heads[1], 2)
        return list(range(self.heads[1], low - 1, -step))

    def values(self, heads: int) -> dict[str, int] | None:
        """The fields of the instance with ``heads`` heads, or None when no width keeps the
        stick residue of the hidden size."""
        hidden = self.hidden[1]
        residue = hidden % ALIGNMENT
        if self.explicit_head_dim:  # hidden_size is free of heads * head_dim
            new_hidden = _aligned(residue, max(1, round(hidden * heads / self.heads[1])))
        else:
            new_hidden = heads * self.head_dim
            if new_hidden % ALIGNMENT != residue:
                return None
        out = {self.hidden[0]: new_hidden, self.heads[0]: heads}
        if self.kv is not None:
            out[self.kv[0]] = heads // self.group
        if self.inter is not None:
            wanted = max(1, round(self.inter[1] * new_hidden / hidden))
            out[self.inter[0]] = _aligned(self.inter[1] % ALIGNMENT, wanted)
        return out


def _aligned(residue: int, at_least: int) -> int:
    """The smallest value >= at_least congruent to ``residue`` modulo the stick."""
    value = at_least + (residue - at_least) % ALIGNMENT
    return value if value > 0 else value + ALIGNMENT


def _composite(config: Any) -> bool:
    """A composite config (``text_config``, ``vision_config``...): not narrowed here."""
    names = getattr(type(config), "sub_configs", None) or {}
    return any(getattr(config, name, None) is not None for name in names)


def _width(config: Any) -> _Width | None:
    """The width fields, or None when the config cannot be narrowed safely (composite)."""
    if _composite(config):
        return None
    hidden, heads = _get(config, _HIDDEN), _get(config, _HEADS)
    if hidden is None or heads is None:
        return None
    explicit = _get(config, _HEAD_DIM)
    head_dim = explicit[1] if explicit else hidden[1] // heads[1]
    kv = _get(config, _KV_HEADS)
    if not head_dim or (kv is not None and heads[1] % kv[1]):
        return None
    return _Width(hidden, heads, kv, head_dim, explicit is not None, _get(config, _INTER))


def _apply(config: Any, values: dict[str, int]) -> dict[str, int]:
    """Set ``values`` on ``config``; the old values of what changed."""
    old = {k: getattr(config, k) for k in values}
    for key, value in values.items():
        setattr(config, key, value)
    return old


def _try_width(config: Any, width: _Width, heads: int, signature: str) -> dict[str, int] | None:
    """Narrow ``config`` to ``heads`` heads if that keeps its lowering class; the old values."""
    values = width.values(heads)
    if values is None:
        return None
    old = _apply(config, values)
    try:
        same = lowering_signature(config) == signature
    except Exception:
        same = False
    if not same:
        _apply(config, old)
        return None
    return old


def _changes(config: Any, old: dict[str, int]) -> str:
    return ", ".join(
        f"{k} {v} -> {getattr(config, k)}" for k, v in old.items() if v != getattr(config, k)
    )


def _distinct_layer_types(config: Any) -> int:
    kinds = getattr(config, "layer_types", None)
    return max(1, len({str(k) for k in kinds})) if isinstance(kinds, list) and kinds else 1


def _narrowest_fit(
    config: Any, signature: str, limit: float, size: Callable[[], Estimate]
) -> tuple[Estimate, dict[str, int]]:
    """Narrow ``config`` to the widest instance of its lowering class whose estimate fits
    ``limit`` (else the narrowest there is): (its estimate, the old values of what changed)."""
    best = size()
    width = _width(config)
    if width is None or best.judge_mb <= limit:
        return best, {}
    original: dict[str, int] = {}
    for heads in width.head_counts()[1:]:
        old = _try_width(config, width, heads, signature)
        if old is None:
            continue
        original = {**old, **original}
        best = size()
        if best.judge_mb <= limit:
            break
    return best, original


def fit(
    config: Any,
    build_meta: Callable[[Any], Any],
    truncate: Callable[[Any, int], str | None],
    *,
    budget_mb: int | None = None,
    small_member: bool = False,
    tokenized: bool = False,
) -> list[str]:
    """Size ``config`` (already truncated and its vocabulary shrunk) to fit ``budget_mb`` (None:
    ``current_budget_mb()``), in place: the notes of what changed and the final estimate.
    ``build_meta(config)`` builds the model on the meta device (to count its parameters);
    ``truncate(config, layers)`` cuts the depth keeping each layer type. StandInTooLargeError
    when nothing keeps it under the budget. See the module doc."""
    limit = current_budget_mb() if budget_mb is None else budget_mb
    notes: list[str] = []
    signature = lowering_signature(config)
    width = _width(config)
    if small_member and width is not None and width.hidden[1] > SMALL_MEMBER_HIDDEN:
        for heads in width.head_counts():
            values = width.values(heads)
            if values is None or values[width.hidden[0]] > SMALL_MEMBER_HIDDEN:
                continue
            old = _try_width(config, width, heads, signature)
            if old is not None:
                notes.append(
                    "sized as the family's small members (a config of the model_type's "
                    f"defaults): {_changes(config, old)}"
                )
                break

    def size() -> Estimate:
        return estimate(config, build_meta, tokenized=tokenized)

    first = size()
    best, narrowed = _narrowest_fit(config, signature, limit, size)
    layers = int(getattr(config, "num_hidden_layers", 1) or 1)
    if best.judge_mb > limit and _distinct_layer_types(config) < layers:
        _apply(config, narrowed)  # restore the width: a shallower stand-in may keep it
        cut = truncate(config, _distinct_layer_types(config))
        if cut:
            notes.append(f"sized to the memory budget: {cut}")
        best, narrowed = _narrowest_fit(config, signature, limit, size)
    if best.judge_mb > limit:
        raise StandInTooLargeError(
            f"its smallest stand-in needs {best.describe()}, over the {limit:,} MB budget of a "
            f"structural judge (as built, {first.judge_mb:,.0f} MB): judge it where a worker "
            f"has {best.judge_mb + PROCESS_BASE_MB:,.0f} MB or more (--memory-limit, fewer "
            "--workers)"
        )
    if narrowed:
        notes.append(f"sized to the memory budget: {_changes(config, narrowed)}")
    return [*notes, f"memory: {best.describe()}, within the {limit:,} MB budget"]
