"""The persistent compile cache of the spyre backend: the ATen graph aot_autograd made of a
Dynamo graph, kept on disk so that another process compiling the same graph skips aot_autograd.

What a compile costs (all-MiniLM-L6-v2, benchmarks/bench_diagnose.py): Dynamo's tracing of the
Python frames, then aot_autograd (functionalization and the decompositions, traced with fake
tensors), then the backend's own judging and code generation (~0.2 s). torch's own caches do
not fit a custom backend: AOTAutogradCache stores Inductor's compiled output (and needs the FX
graph cache), and Dynamo's precompile packages (torch._dynamo.package) hold the guards and
bytecode as pickles. So this cache sits between the two halves: keyed by the Dynamo graph, it
stores aot_autograd's ATen graph as data, and a hit hands that graph to the backend, which
judges it and generates its program again (so reports and defects are always this build's).

- key: sha256 of the Dynamo graph's code, its tensor constants, every input's shape, stride,
  dtype, device and requires_grad, grad mode, the ambient state aot_autograd traces under
  (hfadapt.spyre.numerics.host_state.graph_state: autocast on/off and its dtype per device type, the
  default dtype, deterministic algorithms; torch's AOTAutogradCache and FX graph cache key
  the same), the device profile's name and version, the hfadapt version and the source of the
  decompositions, and torch's version. A graph traced under autocast stored bf16 casts that a
  plain process then ran; one whose state cannot be read is not cached;
- stored: only inference graphs aot_autograd compiled without runtime wrappers of its own (no
  input mutation, every output a fresh tensor, one graph input per Dynamo input);
- entry: one JSON file (``<key>.json``: the graph, hfadapt.spyre.compile.graph_codec, its
  constants as base64 safetensors); never pickles. Written to a temporary file and renamed
  (concurrent sweep workers see a whole entry or none); an entry that does not parse, names
  another key, or does not fit the inputs is ignored and written again;
- where: ``<cache home>/compile`` (``$HFADAPT_CACHE_DIR``, hfadapt.settings); bounded by
  ``HFADAPT_COMPILE_CACHE_MB`` (default 256), least recently used entries removed first (a hit
  touches its file); ``HFADAPT_COMPILE_CACHE=0`` turns it off, and so does ``skipped()`` for
  a block (``hfadapt diagnose --no-cache``);
- what a block used: ``recording()`` collects the keys it hit, missed and stored (a diagnosis
  records them in its evidence, ``caches``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import fx

from hfadapt import settings
from hfadapt import torch_internals as ti
from hfadapt.disk_cache import BoundedFolder
from hfadapt.errors import UntrustedDataError
from hfadapt.spyre.compile.graph_codec import GraphCodecError, decode, encode, input_meta
from hfadapt.spyre.numerics import host_state
from hfadapt.spyre.rules.profile import Profile
from hfadapt.untrusted import parse_json

__all__ = [
    "CompileCache",
    "Entry",
    "Usage",
    "cache_info",
    "clear",
    "default_cache",
    "recording",
    "skipped",
    "stats",
]

log = logging.getLogger(__name__)

FORMAT = 1
DEFAULT_MB = 256
SUFFIX = ".json"
MAX_ENTRY_BYTES = 256 * 2**20

_PLAIN = (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer)
_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0, "stored": 0, "rejected": 0, "evicted": 0}


KEY_SHOWN = 12  # a key's first hex digits: what a run's evidence names an entry by


@dataclass
class Usage:
    """What one block (a diagnosis) did with the cache: the entries it hit, missed and stored
    (their keys' first KEY_SHOWN hex digits), the graphs it could not key, the entries it
    rejected; ``enabled`` False when the cache was off for it."""

    enabled: bool
    hits: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)
    unkeyed: int = 0
    rejected: int = 0

    def note(self, kind: str, key: str | None = None) -> None:
        if kind in ("unkeyed", "rejected"):
            setattr(self, kind, getattr(self, kind) + 1)
            return
        if key is not None:  # one per graph compiled: a few, or a few dozen with graph breaks
            getattr(self, kind).append(key[:KEY_SHOWN])

    def to_dict(self) -> dict[str, Any] | str:
        """The entries by kind and the counts (plain JSON values, for evidence); the string
        ``off`` when the cache was off."""
        if not self.enabled:
            return "off"
        return {
            "hits": list(self.hits),
            "misses": list(self.misses),
            "stored": list(self.stored),
            "unkeyed": self.unkeyed,
            "rejected": self.rejected,
        }


_usage: ContextVar[Usage | None] = ContextVar("hfadapt_compile_cache_usage", default=None)
_skip: ContextVar[bool] = ContextVar("hfadapt_compile_cache_skip", default=False)


@contextlib.contextmanager
def skipped(skip: bool = True) -> Iterator[None]:
    """Neither read nor write the cache in this block (``skip`` False: no change)."""
    token = _skip.set(skip or _skip.get())
    try:
        yield
    finally:
        _skip.reset(token)


@contextlib.contextmanager
def recording() -> Iterator[Usage]:
    """Collect what this block does with the cache (compiles run in the calling thread)."""
    usage = Usage(enabled=enabled())
    token = _usage.set(usage)
    try:
        yield usage
    finally:
        _usage.reset(token)


def stats() -> dict[str, int]:
    """This process's counts: hits, misses, entries stored, rejected (corrupt) and evicted."""
    with _lock:
        return dict(_stats)


def _count(name: str, n: int = 1, key: str | None = None) -> None:
    with _lock:
        _stats[name] += n
    usage = _usage.get()
    if usage is not None and name in ("hits", "misses", "stored", "rejected"):
        usage.note(name, key)


def directory() -> Path:
    return settings.kernel_cache() / "compile"


@lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """The hfadapt version and the source of what shapes the stored graph (the decompositions
    and the native ops kept whole), so a changed checkout never reads an old graph."""
    from hfadapt.spyre import decompositions
    from hfadapt.spyre.compile import graph_codec, native_ops
    from hfadapt.version import __version__

    digest = hashlib.sha256(__version__.encode())
    for module in (decompositions, native_ops, graph_codec):
        try:
            digest.update(Path(str(module.__file__)).read_bytes())
        except OSError:
            digest.update(str(module).encode())
    return digest.hexdigest()


@dataclass
class Entry:
    """A hit: the ATen graph and the indices of its parameter and buffer inputs."""

    gm: fx.GraphModule
    static: list[int]


class CompileCache:
    """One cache folder, bounded to ``max_bytes``."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.folder = BoundedFolder(root, max_bytes, SUFFIX)

    @property
    def max_bytes(self) -> int:
        return self.folder.max_bytes

    # -- keys -----------------------------------------------------------------------------------
    def key(self, gm: fx.GraphModule, inputs: Sequence[object], profile: Profile) -> str | None:
        """The key of a Dynamo graph with these inputs; None when it cannot be keyed (symbolic
        sizes, an input of a kind the cache does not describe)."""
        if any(isinstance(x, torch.Tensor) and type(x) not in _PLAIN for x in inputs):
            _count_unkeyed()
            return None  # tensor subclasses (a fake or functional tensor): not described
        try:
            metas = input_meta(inputs)
            ambient = host_state.graph_state()
        except (GraphCodecError, RuntimeError, TypeError, AttributeError):
            _count_unkeyed()  # inputs not described, or a state torch would not say
            return None
        grads = [bool(getattr(x, "requires_grad", False)) for x in inputs]
        ids = [id(x) for x in inputs]  # repeated inputs: aot_autograd dedups them
        same = [ids.index(i) for i in ids]
        digest = hashlib.sha256()
        for name, buf in sorted(gm.named_buffers()):
            digest.update(name.encode())
            digest.update(_tensor_bytes(buf))
        parts = {
            "format": FORMAT,
            "code": gm.code,
            "constants": digest.hexdigest(),
            "inputs": metas,
            "requires_grad": grads,
            "same": same,
            "grad_enabled": torch.is_grad_enabled(),
            "ambient": ambient,  # autocast, default dtype, deterministic algorithms
            "profile": [profile.name, profile.version],
            "hfadapt": _code_fingerprint(),
            "torch": torch.__version__,
        }
        text = json.dumps(parts, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    # -- reading ----------------------------------------------------------------------------------
    def load(self, key: str, inputs: Sequence[object]) -> Entry | None:
        """The entry for ``key``, checked against ``inputs``; None on a miss or a bad entry
        (which the next store replaces)."""
        raw = self.folder.read(key)
        if raw is None:
            _count("misses", key=key)
            return None
        try:
            entry = self._parse(raw, key, inputs)
        except (GraphCodecError, UntrustedDataError, ValueError, KeyError, TypeError) as exc:
            log.info("compile cache: ignoring entry %s (%s)", self.folder.path(key).name, exc)
            _count("rejected", key=key)
            _count("misses", key=key)
            return None
        self.folder.touch(key)  # least recently used goes first
        _count("hits", key=key)
        return entry

    def _parse(self, raw: bytes, key: str, inputs: Sequence[object]) -> Entry:
        data = parse_json(raw, max_bytes=MAX_ENTRY_BYTES, max_depth=32)
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("key") != key:
            raise ValueError("another format or key")
        if data.get("inputs") != input_meta(inputs):
            raise ValueError("inputs differ")
        constants: dict[str, torch.Tensor] = {}
        if data.get("constants"):
            from safetensors.torch import load as load_tensors

            constants = load_tensors(base64.b64decode(data["constants"], validate=True))
        gm = decode(data["graph"], constants)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(inputs):
            raise ValueError("the graph takes other inputs")
        static = data.get("static")
        if not isinstance(static, list) or not all(
            isinstance(i, int) and 0 <= i < len(inputs) for i in static
        ):
            raise ValueError("malformed static inputs")
        return Entry(gm=gm, static=static)

    # -- writing ----------------------------------------------------------------------------------
    def store(
        self, key: str, gm: fx.GraphModule, inputs: Sequence[object], static: Sequence[int]
    ) -> bool:
        """Write the entry (atomically); False when the graph cannot be stored. The compiler
        calls this under aot_autograd's fake tensor mode: the graph's constants are real
        tensors, read with that mode set aside."""

        try:
            with ti.unset_fake_temporarily():
                graph, constants = encode(gm)
        except GraphCodecError as exc:
            log.info("compile cache: not storing a graph (%s)", exc)
            return False
        blob = ""
        if constants:
            from safetensors.torch import save as save_tensors

            blob = base64.b64encode(save_tensors(constants)).decode("ascii")
        data = {
            "format": FORMAT,
            "key": key,
            "inputs": input_meta(inputs),
            "static": [int(i) for i in static],
            "graph": graph,
            "constants": blob,
        }
        written, evicted = self.folder.write(key, json.dumps(data, separators=(",", ":")).encode())
        _count("evicted", evicted)
        if written:
            _count("stored", key=key)
        return written

    def entries(self) -> list[Path]:
        return self.folder.entries()

    def evict(self) -> int:
        """Remove the least recently used entries until the folder fits ``max_bytes``."""
        removed = self.folder.evict()
        _count("evicted", removed)
        return removed

    def clear(self) -> tuple[int, int]:
        """Remove every entry and temporary file: (entries, temporary files) removed."""
        return self.folder.clear()

    def info(self) -> dict[str, object]:
        return {**self.folder.info(), "enabled": enabled()}


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    return str((t.dtype, tuple(t.shape))).encode() + t.view(torch.uint8).numpy().tobytes()


def _count_unkeyed() -> None:
    usage = _usage.get()
    if usage is not None:
        usage.note("unkeyed")


def enabled() -> bool:
    """Whether the cache is read and written here: ``HFADAPT_COMPILE_CACHE`` not 0, and not in
    a ``skipped()`` block."""
    return settings.compile_cache_enabled() and not _skip.get()


def max_bytes() -> int:
    return max(int(settings.compile_cache_mb(DEFAULT_MB) * 2**20), 0)


def default_cache() -> CompileCache | None:
    """The cache in the cache home, None when turned off."""
    if not enabled():
        return None
    return CompileCache(directory(), max_bytes())


def cache_info() -> dict[str, object]:
    return CompileCache(directory(), max_bytes()).info()


def clear() -> tuple[int, int]:
    """Remove every entry, and the temporary files of writes (killed writers' leftovers):
    (entries, temporary files) removed."""
    return CompileCache(directory(), max_bytes()).clear()
