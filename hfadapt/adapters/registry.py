"""The adapter registry: discovery (bundled ``adapters/``, user folders, entry points),
matching against a model instance, and scoped, reversible, idempotent, thread-safe apply.

Two forms of adapter are found: Python files people wrote (bundled, on
``HFADAPT_ADAPTERS_PATH``, or from a plugin's entry point), compiled from the bytes read here
(never from a bytecode cache, and with any coding declaration ignored), and graph folders
(an agent's accepted draft: :mod:`hfadapt.adapters.graph_adapter`), which are validated and
run as data. Drafted Python is never imported: a file in the accepted-drafts folder
(``$HFADAPT_HOME/adapters``) or carrying the agent marker is refused, not read.

A broken adapter file is recorded in ``Registry.errors`` and skipped; it never breaks an
import or a model load, whatever it raises (SystemExit included); a KeyboardInterrupt (Ctrl-C)
stops discovery and propagates.
Patches live on module *instances*, so two models in one process never see each other's
adapters, and each patch is gated: unless forced on (``apply(..., device="spyre")``, used when
judging on CPU memory) it only takes over when the call runs for the device (inputs on spyre,
or traced by torch.compile), so an eager CPU run of an adapted model is bit-identical to stock."""

from __future__ import annotations

import hashlib
import inspect
import logging
import sys
import threading
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from hfadapt import settings
from hfadapt.adapters import api as adapter_api
from hfadapt.adapters.api import Adapter
from hfadapt.adapters.graph_adapter import NotProvenError, is_graph_folder, load_graph_adapter
from hfadapt.errors import AdapterError
from hfadapt.spyre.frames import compile_running, inline_only

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hfadapt.adapters"
# The first line of drafted Python that hfadapt hands to people (``adapters export``): a file
# carrying it is agent code nobody has promoted yet, and is never imported.
AGENT_MARKER = "# hfadapt-origin: agent"
_REPORTED: set[tuple[str, str]] = set()  # (path, error) already logged in this process
_LOCK = threading.RLock()
MAX_ADAPTER_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class LoadError:
    path: str
    error: str


def bundled_dir() -> Path:
    """``adapters/`` of a checkout, else the copy inside the installed wheel."""
    package = Path(__file__).resolve().parents[1]
    checkout = package.parent / "adapters"
    if checkout.is_dir() and (package.parent / "pyproject.toml").exists():
        return checkout
    return package / "_bundled" / "adapters"


def user_dirs() -> list[Path]:
    """Folders named by HFADAPT_ADAPTERS_PATH, then the folder accepted agent drafts go to."""
    return [*settings.adapter_folders(), user_adapters_dir()]


def user_adapters_dir() -> Path:
    return settings.drafts_home() / "adapters"


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())


def is_agent_origin(path: Path, text: str | None = None) -> bool:
    """Whether a Python file is agent-drafted: it sits in the accepted-drafts folder or carries
    the origin marker anywhere in its text."""
    try:
        if path.resolve().parent == user_adapters_dir().resolve():
            return True
        text = path.read_text(encoding="utf-8", errors="replace") if text is None else text
    except OSError:
        return True  # unreadable: treat as untrusted
    return AGENT_MARKER in text


def _checked_source(path: Path) -> str:
    """The file's text, read once: refused when it is agent-drafted, not UTF-8, or large."""
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_ADAPTER_FILE_BYTES + 1)
    except OSError as exc:
        raise AdapterError(f"{path.name}: cannot be read ({exc.strerror or exc})") from exc
    if len(data) > MAX_ADAPTER_FILE_BYTES:
        raise AdapterError(f"{path.name}: larger than {MAX_ADAPTER_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AdapterError(
            f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from exc
    if is_agent_origin(path, text):
        raise AdapterError(
            f"{path.name}: drafted Python is never imported (agent marker, or in the accepted-"
            "drafts folder); review it, delete the marker line and move it to a folder on "
            "HFADAPT_ADAPTERS_PATH to promote it"
        )
    return text


def load_file(path: Path, source: str = "user") -> list[Adapter]:
    """Run one adapter file people wrote and return the adapters it registered. The code run is
    compiled from the text read here: no bytecode cache is consulted and a coding declaration
    cannot change what the bytes mean."""
    text = _checked_source(path)
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
    mod_name = f"hfadapt_adapters.{path.stem}_{digest}"
    code = compile(text, str(path), "exec", dont_inherit=True)  # str: the cookie is ignored
    module = types.ModuleType(mod_name)
    module.__file__ = str(path)
    with _LOCK, adapter_api.collected() as found:
        try:
            sys.modules[mod_name] = module
            exec(code, module.__dict__)
        except BaseException:
            sys.modules.pop(mod_name, None)
            raise
    for a in found:
        a.path, a.source = str(path), source
    if not found:
        raise AdapterError(f"{path.name}: defines no @adapter")
    return found


@dataclass
class Registry:
    adapters: list[Adapter] = field(default_factory=list)
    errors: list[LoadError] = field(default_factory=list)

    def add(self, adapter: Adapter) -> None:
        if any(a.name == adapter.name for a in self.adapters):
            self.errors.append(
                LoadError(
                    adapter.path or adapter.name,
                    f"duplicate adapter name {adapter.name!r}; kept the first",
                )
            )
            return
        self.adapters.append(adapter)

    def get(self, name: str) -> Adapter:
        for a in self.adapters:
            if a.name == name:
                return a
        raise AdapterError(f"no adapter named {name!r}; see 'hfadapt adapters list'")

    def load_folder(self, folder: Path, source: str) -> None:
        """Every adapter in ``folder``: its ``*.py`` files (people's code) and its graph
        folders (agents' accepted drafts); names starting with ``_`` are skipped."""
        if not folder.is_dir():
            return
        for path in sorted(folder.iterdir()):
            if path.name.startswith(("_", ".")):
                continue
            try:
                if path.suffix == ".py" and path.is_file():
                    for a in load_file(path, source):
                        self.add(a)
                elif is_graph_folder(path):  # proven here; parsed on first apply
                    self.add(load_graph_adapter(path, source, lazy=True))
            except KeyboardInterrupt:
                raise  # Ctrl-C stops discovery: never a broken adapter
            except BaseException as exc:  # SystemExit too: an adapter file cannot end hfadapt
                self._report(str(path), exc)

    def add_module(self, module: types.ModuleType, source: str = "") -> None:
        """Every adapter defined (with ``@adapter``) in an imported module: what a plugin's
        ``register(registry)`` hook calls. Repeatable: each call adds fresh records."""
        import copy

        for value in vars(module).values():
            made = getattr(value, "__hfadapt_adapter__", None)
            if isinstance(made, Adapter):
                a = copy.copy(made)
                a.source = source or f"module:{module.__name__}"
                self.add(a)

    def _report(self, where: str, exc: BaseException) -> None:
        err = LoadError(where, str(exc) if isinstance(exc, NotProvenError) else _one_line(exc))
        self.errors.append(err)
        if (where, err.error) not in _REPORTED:  # once per process, however often it reloads
            _REPORTED.add((where, err.error))
            log.warning("skipped adapter file %s: %s", where, err.error)

    def load_entry_points(self) -> None:
        """Plugins: each entry point of the ``hfadapt.adapters`` group names a
        ``register(registry)`` callable (pluggy style), called with this registry; it adds its
        adapters (``registry.add(...)`` or ``registry.add_module(module)``). Discovery can run
        any number of times in one process and finds the same adapters each time."""
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            where = f"entry-point:{ep.name}"
            before = len(self.adapters)
            try:
                hook = ep.load()
                if isinstance(hook, types.ModuleType):
                    raise AdapterError(
                        f"entry point {ep.name} names a module; it must name a "
                        "register(registry) function"
                    )
                if not callable(hook):
                    raise AdapterError(f"entry point {ep.name} does not name a callable")
                hook(self)
            except KeyboardInterrupt:
                raise  # Ctrl-C stops discovery: never a broken plugin
            except BaseException as exc:  # SystemExit too: a plugin cannot end hfadapt
                self._report(where, exc)
                continue
            for a in self.adapters[before:]:
                if not a.source or a.source.startswith("module:"):
                    a.source = where

    # -- matching ----------------------------------------------------------------------
    def matches(
        self, model: torch.nn.Module
    ) -> list[tuple[Adapter, list[tuple[str, torch.nn.Module]]]]:
        """Each adapter with the (name, module) pairs of ``model`` it would patch."""
        config = getattr(model, "config", None)
        out = []
        for a in sorted(self.adapters, key=lambda x: x.priority):
            if not a.target_loaded():
                continue  # nothing in this process is an instance of a class never defined
            try:
                cls = a.target_class()
            except AdapterError as exc:
                self.errors.append(LoadError(a.path or a.name, exc.one_line()))
                continue
            hits: list[tuple[str, torch.nn.Module]] = []
            for name, module in model.named_modules():
                if cls is not None and isinstance(module, cls):
                    try:
                        ok = a.applies is None or bool(
                            a.applies(module, getattr(module, "config", None) or config)
                        )
                    except Exception as exc:
                        self.errors.append(
                            LoadError(a.path or a.name, f"applies() failed: {_one_line(exc)}")
                        )
                        ok = False
                    if ok:
                        hits.append((name, module))  # type: ignore[arg-type]
            if hits:
                out.append((a, hits))
        return out

    def apply(
        self,
        model: torch.nn.Module,
        *,
        device: str | None = "spyre",
        only: Iterable[str] | None = None,
        exclude: Iterable[str] = (),
    ) -> AppliedAdapters:
        """Patch every matching module of this model instance. ``device=None`` leaves the
        patches dormant unless the call runs for the device (inputs on spyre, or traced by
        torch.compile): eager CPU runs stay stock. A device name makes them take over on every
        run (what judging on CPU memory needs)."""
        wanted = set(only) if only is not None else None
        skipped = set(exclude)
        with _LOCK:
            handle = applied_to(model)
            if handle is None:
                handle = AppliedAdapters(model)
                model._hfadapt_applied = handle  # type: ignore[assignment]
            handle.state.enabled = device is not None
            for a, hits in self.matches(model):
                if (wanted is not None and a.name not in wanted) or a.name in skipped:
                    continue
                prepare = getattr(a.fn, "prepare", None)  # a graph adapter: parsed now
                if prepare is not None and a.name not in handle.applied:
                    try:
                        prepare()
                    except Exception as exc:
                        self._report(a.path or a.name, exc)
                        continue
                handle._apply(a, hits)
        return handle


class AdapterState:
    """Shared by every patch of one model: whether the adapters take over (device run)."""

    __slots__ = ("attn_original", "enabled")

    def __init__(self) -> None:
        self.enabled = False
        self.attn_original: str | None = None


def _first_tensor(values: Iterable[object], depth: int = 0) -> torch.Tensor | None:
    """The first tensor among ``values``, looking one level into dicts, lists and tuples (a
    sentence-transformers module is handed a features dict)."""
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
        if depth == 0 and isinstance(v, Mapping):
            found = _first_tensor(v.values(), 1)
        elif depth == 0 and isinstance(v, (list, tuple)):
            found = _first_tensor(v, 1)
        else:
            continue
        if found is not None:
            return found
    return None


def runs_for_device(args: tuple[object, ...], kwargs: Mapping[str, object]) -> bool:
    """Whether this call runs for the device: its (first) tensor input is on ``spyre``, or
    torch.compile is tracing or running it (a compiled graph is what a device backend lowers;
    the dispatch glue below runs uncompiled between graphs). An eager CPU call is not: there
    the patches stay dormant and the stock code runs."""
    if compile_running():
        return True
    first = _first_tensor((*args, *kwargs.values()))
    return first is not None and first.device.type == "spyre"


def _method_dispatch(method: str, unbound: bool = False) -> Any:
    def dispatch(self: torch.nn.Module, *args: object, **kwargs: object) -> Any:
        stack: list[Adapter] = self._hfadapt_stack[method]  # type: ignore[index,assignment]
        if stack and (self._hfadapt_state.enabled or runs_for_device(args, kwargs)):  # type: ignore[union-attr]
            return stack[-1].fn(self, *args, **kwargs)
        if unbound:  # a staticmethod or classmethod: the class binds what it takes
            return getattr(type(self), method)(*args, **kwargs)
        return getattr(type(self), method)(self, *args, **kwargs)

    dispatch.__name__ = f"hfadapt_{method}"
    # glue: inlined into the caller's graph, never traced again as a frame of its own after a
    # graph break below it (hfadapt.spyre.frames)
    return inline_only(dispatch)


class AppliedAdapters:
    """What was applied to one model; a context manager and a handle to remove it all."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.state = AdapterState()
        self.applied: dict[str, list[str]] = {}  # adapter name -> module names
        self._undo: list[Any] = []

    @property
    def names(self) -> list[str]:
        return list(self.applied)

    def _apply(self, a: Adapter, hits: list[tuple[str, torch.nn.Module]]) -> None:
        if a.name in self.applied:
            return  # idempotent
        if a.kind == "method":
            for _, module in hits:
                self._patch_method(a, module)
        elif a.kind == "pre_hook":
            for _, module in hits:
                self._add_pre_hook(a, module)
        elif a.kind == "attention":
            for _, module in hits:
                self._switch_attention(a, module)
        self.applied[a.name] = [n or "<root>" for n, _ in hits]

    def _patch_method(self, a: Adapter, module: torch.nn.Module) -> None:
        method = a.method_name
        stacks = module.__dict__.setdefault("_hfadapt_stack", {})
        module.__dict__["_hfadapt_state"] = self.state
        if method not in stacks:
            stacks[method] = []
            raw = inspect.getattr_static(type(module), method, None)
            unbound = isinstance(raw, (staticmethod, classmethod))
            module.__dict__[method] = types.MethodType(_method_dispatch(method, unbound), module)
        stacks[method].append(a)

        def undo() -> None:
            stack = stacks.get(method, [])
            if a in stack:
                stack.remove(a)
            if not stack:
                stacks.pop(method, None)
                module.__dict__.pop(method, None)
            if not stacks:
                module.__dict__.pop("_hfadapt_stack", None)
                module.__dict__.pop("_hfadapt_state", None)

        self._undo.append(undo)

    def _add_pre_hook(self, a: Adapter, module: torch.nn.Module) -> None:
        state = self.state

        @inline_only  # glue, as _method_dispatch's
        def hook(mod: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if state.enabled or runs_for_device(args, kwargs):
                return a.fn(mod, args, kwargs)
            return None

        handle = module.register_forward_pre_hook(hook, with_kwargs=True)
        self._undo.append(handle.remove)

    def _switch_attention(self, a: Adapter, owner: torch.nn.Module) -> None:
        """Point the config of ``owner`` (the matched transformers model, which may sit inside a
        wrapper such as a SentenceTransformer) at the adapter's attention function."""
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        config = getattr(owner, "config", None)
        if config is None:
            raise AdapterError(f"adapter {a.name}: the model has no config to switch attention on")
        from transformers.masking_utils import AttentionMaskInterface

        key = f"hfadapt-{a.name}"
        ALL_ATTENTION_FUNCTIONS[key] = _attention_dispatch(a)
        # Masks are made by the function registered for the attention key; without one,
        # transformers would pass no mask at all. Use the original implementation's.
        AttentionMaskInterface.register(key, _mask_dispatch)
        modules = list(owner.modules())
        if config._attn_implementation == key:
            # The same config seen again (T5EncoderModel and its T5Stack share one): switched
            # already; recording the adapter's key as "original" would make masks recurse.
            for m in modules:
                m.__dict__["_hfadapt_attn_state"] = self.state
            return
        previous = config._attn_implementation or "eager"
        # A second attention adapter takes the key over from the first (the higher priority is
        # applied last): the stock implementation stays the one the model came with.
        original = previous
        if previous.startswith("hfadapt-"):
            original = config.__dict__.get("_hfadapt_attn_original") or "sdpa"
        self.state.attn_original = original
        config.__dict__["_hfadapt_attn_original"] = original
        config._attn_implementation = key
        for m in modules:  # the attention function is handed the attention module, not the model
            m.__dict__["_hfadapt_attn_state"] = self.state

        def undo() -> None:
            config._attn_implementation = previous
            if previous == original:
                config.__dict__.pop("_hfadapt_attn_original", None)
                for m in modules:
                    m.__dict__.pop("_hfadapt_attn_state", None)

        self._undo.append(undo)

    def on_remove(self, undo: object) -> None:
        """Run ``undo()`` when the adapters are removed (e.g. a hook the caller added)."""
        self._undo.append(undo)

    def remove(self) -> None:
        with _LOCK:
            while self._undo:
                self._undo.pop()()
            self.applied.clear()
            if getattr(self.model, "_hfadapt_applied", None) is self:
                del self.model._hfadapt_applied

    def __enter__(self) -> AppliedAdapters:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __repr__(self) -> str:
        if not self.applied:
            return "AppliedAdapters(none applied)"
        names = ", ".join(
            f"{name} on {len(mods)} modules" if len(mods) > 1 else name
            for name, mods in self.applied.items()
        )
        # "enabled" is only the always=True switch: without it the adapters still take over
        # whenever the model runs on spyre or is compiled, so say that, not "off".
        when = (
            "active everywhere (always=True)"
            if self.state.enabled
            else "active on spyre and under torch.compile, stock code in eager CPU runs"
        )
        count = len(self.applied)
        return f"AppliedAdapters({count} adapter{'s' if count != 1 else ''}: {names}; {when})"


def _attention_dispatch(a: Adapter) -> Any:
    def attention(
        module: torch.nn.Module, query: torch.Tensor, *args: object, **kwargs: object
    ) -> Any:
        state = _find_state(module)
        if (
            (state is not None and state.enabled)
            or query.device.type == "spyre"
            or torch.compiler.is_compiling()
        ):
            return a.fn(module, query, *args, **kwargs)
        return _stock_attention(module, state)(module, query, *args, **kwargs)

    return attention


def _mask_dispatch(*args: object, **kwargs: object) -> Any:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    config = kwargs.get("config")
    original = getattr(config, "_hfadapt_attn_original", None) or "sdpa"
    if original not in ALL_MASK_ATTENTION_FUNCTIONS:
        original = "sdpa"
    return ALL_MASK_ATTENTION_FUNCTIONS[original](*args, **kwargs)


def _find_state(module: torch.nn.Module) -> AdapterState | None:
    state = getattr(module, "_hfadapt_attn_state", None)
    return state if isinstance(state, AdapterState) else None


def _stock_attention(module: torch.nn.Module, state: AdapterState | None) -> Any:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    name = state.attn_original if state is not None else "sdpa"
    if name and name != "eager" and name in ALL_ATTENTION_FUNCTIONS:
        return ALL_ATTENTION_FUNCTIONS[name]
    return sys.modules[type(module).__module__].eager_attention_forward


def applied_to(model: torch.nn.Module) -> AppliedAdapters | None:
    handle = getattr(model, "_hfadapt_applied", None)
    return handle if isinstance(handle, AppliedAdapters) else None


_DEFAULT: Registry | None = None


def discover(
    paths: Iterable[Path] | None = None, *, bundled: bool = True, entry_points: bool = True
) -> Registry:
    """Build a registry from the bundled folder, the user folders (or ``paths``) and entry points."""
    reg = Registry()
    if bundled:
        reg.load_folder(bundled_dir(), "bundled")
    for folder in list(paths) if paths is not None else user_dirs():
        reg.load_folder(Path(folder), "user")
    if entry_points:
        reg.load_entry_points()
    return reg


def default_registry(reload: bool = False) -> Registry:
    global _DEFAULT
    with _LOCK:
        if _DEFAULT is None or reload:
            _DEFAULT = discover()
        return _DEFAULT


def apply(
    model: torch.nn.Module,
    *,
    device: str | None = "spyre",
    registry: Registry | None = None,
    only: Iterable[str] | None = None,
    exclude: Iterable[str] = (),
) -> AppliedAdapters:
    """Apply every matching adapter of the (default) registry to this model instance."""
    return (registry or default_registry()).apply(model, device=device, only=only, exclude=exclude)
