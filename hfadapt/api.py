"""Load-time use of the adapter registry: ``hfadapt.load``, ``hfadapt.adapt``,
``hfadapt.applied`` and ``hfadapt.register_device``.

import hfadapt
model = hfadapt.load("sentence-transformers/all-MiniLM-L6-v2")   # adapted, fp16, on spyre
embeddings = model.encode(["hello world"])                       # float32, as stock
hfadapt.applied(model).names                                     # the adapters it runs

The adapters of ``adapt`` are dormant in eager CPU runs (stock code, bit-identical results) and
take over when a call runs for the device: inputs on ``spyre``, or traced by torch.compile.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hfadapt.adapters.registry import (
    AppliedAdapters,
    Registry,
    applied_to,
    default_registry,
    runs_for_device,
)
from hfadapt.errors import DeviceError, UsageError, did_you_mean
from hfadapt.noise import holding
from hfadapt.options import DType

if TYPE_CHECKING:
    from hfadapt.hub.resolve import HubOptions


def register_device() -> None:
    """Make ``"spyre"`` a torch device and ``backend="spyre"`` a torch.compile backend in this
    process: the simulated device, unless the real torch-spyre is installed (then the card's
    own device stays). Idempotent. ``import torch`` already registers the simulated device
    unless ``HFADAPT_SPYRE_AUTOLOAD=0``; ``adapt`` and ``load`` call this themselves."""
    from hfadapt.spyre.compile import backend
    from hfadapt.spyre.eager import device as spyre_device

    if spyre_device.real_torch_spyre() is None:
        spyre_device.register()
    backend.register()


def applied(model: torch.nn.Module) -> AppliedAdapters | None:
    """The adapters ``adapt`` (or ``load``) applied to this model instance: a handle with
    ``.names``, ``.applied`` (adapter name -> the modules it patched) and ``.remove()``; None
    when nothing was applied."""
    return applied_to(model)


def _first_float_parameter(model: torch.nn.Module) -> torch.Tensor | None:
    for p in model.parameters():
        if p.is_floating_point():
            return p
    return None


def _refuse_fp32(
    model: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    """A forward pre-hook: fp32 weights on the device fail deep inside (``aten::addmm on
    DataFormats.IEEE_FP32``); say what to do before the first op."""
    if torch.compiler.is_compiling():
        return
    p = _first_float_parameter(model)
    if p is None or p.dtype != torch.float32 or p.device.type != "spyre":
        return
    if runs_for_device(args, kwargs):
        raise DeviceError(
            "the model is float32 on spyre, which computes in float16/bfloat16: call "
            "model.half() before model.to('spyre') (hfadapt.load does this by default)"
        )


def adapt(
    model: torch.nn.Module,
    *,
    device: str | None = "spyre",
    always: bool = False,
    registry: Registry | None = None,
    only: list[str] | None = None,
    exclude: list[str] | tuple[str, ...] = (),
) -> AppliedAdapters:
    """Apply every matching adapter to this model instance (and its submodules, e.g. the
    transformer inside a SentenceTransformer). Returns the handle (``.remove()``).

    The adapters take over only when a call runs for the device (its inputs are on spyre, or
    torch.compile traces it); an eager CPU run executes the stock code and stays bit-identical
    to the unadapted model. ``always=True`` makes them take over on every run. ``device="spyre"``
    registers the simulated device and the ``backend="spyre"`` compiler (so ``model.half()
    .to("spyre")`` and ``torch.compile(model, backend="spyre")`` work right away) and refuses a
    float32 model on the device with a one-line hint; ``device=None`` registers nothing."""
    if device is not None and device.split(":")[0] != "spyre":
        raise UsageError(f"device must be 'spyre' or None, not {device!r}")
    reg = registry or default_registry()
    handle = reg.apply(model, device="spyre" if always else None, only=only, exclude=exclude)
    if device is not None:
        register_device()
        if "_hfadapt_fp32_guard" not in model.__dict__:
            hook = model.register_forward_pre_hook(_refuse_fp32, with_kwargs=True)
            model.__dict__["_hfadapt_fp32_guard"] = hook

            def unhook() -> None:
                hook.remove()
                model.__dict__.pop("_hfadapt_fp32_guard", None)

            handle.on_remove(unhook)
    return handle


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    dt: torch.dtype = getattr(torch, DType.parse(dtype, "dtype").torch_name)
    return dt


def _is_sentence_transformer(folder: Path | None) -> bool:
    return folder is not None and (folder / "modules.json").is_file()


def _host_float32(value: object) -> Any:
    """What stock sentence-transformers on CPU returns: float32, on the host. Integer and
    binary outputs (``precision="int8"``...) pass through unchanged."""
    import numpy as np

    if isinstance(value, torch.Tensor):
        return value.cpu().float() if value.is_floating_point() else value.cpu()
    if isinstance(value, np.ndarray):
        return value.astype(np.float32) if np.issubdtype(value.dtype, np.floating) else value
    if isinstance(value, dict):
        return {k: _host_float32(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_host_float32(v) for v in value]
    return value


def _features_to_host(module: torch.nn.Module, args: object, output: object) -> Any:
    """Inside ``encode``: the forward's output features, computed on the device, handed to
    encode's own post-processing on the host (selecting token embeddings by the attention mask
    is host work: on the device it is an int -> bool cast and a boolean index, which the card
    refuses). Calls of the model outside ``encode`` are left alone."""
    if not module.__dict__.get("_hfadapt_in_encode") or not isinstance(output, dict):
        return None
    return {
        k: v.cpu() if isinstance(v, torch.Tensor) and v.device.type != "cpu" else v
        for k, v in output.items()
    }


def _float32_encode(model: Any) -> None:
    """Make ``model.encode`` return float32 on the host, as the stock model on CPU does, while
    the device computes in its own precision."""
    stock = type(model).encode
    model.register_forward_hook(_features_to_host)

    def encode(self: object, *args: object, **kwargs: object) -> Any:
        self.__dict__["_hfadapt_in_encode"] = True
        try:
            return _host_float32(stock(self, *args, **kwargs))
        finally:
            self.__dict__["_hfadapt_in_encode"] = False

    encode.__doc__ = stock.__doc__
    model.encode = types.MethodType(encode, model)


def _host_model(
    ref: str, hub: HubOptions, trust_remote_code: bool, sentence_transformers: bool | None
) -> Any:
    """The model on the host, in fp32: a SentenceTransformer (its ``encode`` returning float32)
    when asked for, or (None) when the model has a modules.json; else the transformers model."""
    from hfadapt.hub import resolve as locate
    from hfadapt.loading import load as loading

    source = locate.resolve(ref, hub)
    if sentence_transformers is None:
        sentence_transformers = _is_sentence_transformer(source.folder) or (
            source.kind != "folder" and locate.has_file(source, "modules.json", hub)
        )
    if not sentence_transformers:
        return loading.load(ref, trust_remote_code=trust_remote_code, hub=hub).model
    model = _sentence_transformer(source, hub, trust_remote_code=trust_remote_code)
    _float32_encode(model)
    return model


def _sentence_transformer(source: Any, hub: HubOptions, *, trust_remote_code: bool) -> Any:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:  # a core dependency: only a broken install gets here
        raise UsageError(
            "sentence-transformers is not importable; reinstall hfadapt "
            f"(pip install hfadapt): {exc}"
        ) from exc
    # stock layer code, as judged (no hub kernels swapped in: hfadapt.loading.load)
    stock = {"use_kernels": False}
    if source.kind == "folder":
        return SentenceTransformer(
            str(source.folder),
            device="cpu",
            trust_remote_code=trust_remote_code,
            model_kwargs=stock,
        )
    return SentenceTransformer(
        source.model_id,
        device="cpu",
        trust_remote_code=trust_remote_code,
        model_kwargs=stock,
        revision=hub.revision,
        token=hub.token,
        cache_folder=hub.cache_dir,
        local_files_only=hub.local_files_only or source.kind == "cache",
    )


def _check_known(names: Sequence[str], registry: Registry | None) -> None:
    """UsageError for the first of ``names`` that is no adapter of the registry."""
    if not names:
        return
    known = {a.name for a in (registry or default_registry()).adapters}
    unknown = [n for n in names if n not in known]
    if unknown:
        hint = did_you_mean(unknown[0], known)
        raise UsageError(f"no adapter named {unknown[0]!r}{hint}; see 'hfadapt adapters list'")


def load(
    model_id_or_path: str | os.PathLike[str],
    *,
    device: str | None = "spyre",
    dtype: torch.dtype | str = torch.float16,
    adapters: bool = True,
    without_adapters: list[str] | tuple[str, ...] = (),
    trust_remote_code: bool = False,
    sentence_transformers: bool | None = None,
    registry: Registry | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    local_files_only: bool = False,
    run_remote_code_in_process: bool = False,
    verbose: bool | None = None,
) -> Any:
    """Load a Hub model (HF cache or download) or a local folder, apply the registry's adapters,
    convert to ``dtype`` and move it to ``device`` ("spyre" registers the simulated device
    unless the real torch-spyre is installed). A sentence-transformers model comes back as a
    ``SentenceTransformer`` whose ``encode()`` runs on the device and returns float32 on the
    host, as the stock model does (``sentence_transformers`` None: decide by the presence of
    modules.json). ``revision``, ``token``, ``cache_dir`` and ``local_files_only`` mean what
    they mean to ``from_pretrained``. ``applied(model)`` says which adapters it runs;
    ``without_adapters`` names registry adapters to leave out (UsageError for an unknown name).

    ``trust_remote_code=True`` returns a model whose repository code runs in THIS process, so
    it is refused (UsageError) unless ``run_remote_code_in_process=True`` says so explicitly;
    to judge such a model safely use ``diagnose(..., trust_remote_code=True)``, which runs it
    only in the OS sandbox (docs/remote-code.md).

    What other libraries print meanwhile (the device's warnings, transformers' "Loading
    weights" bars and log records) is held back and counted in ``held_message_counts()``, as
    the command line holds it; ``verbose=True`` (None: ``HFADAPT_VERBOSE``) lets it through."""
    if trust_remote_code and not run_remote_code_in_process:
        raise UsageError(
            "trust_remote_code: hfadapt.load would run the model repository's code in your own "
            "process, outside any sandbox; judge it sandboxed with hfadapt.diagnose(..., "
            "trust_remote_code=True) (CLI: hfadapt diagnose MODEL --trust-remote-code), or "
            "pass run_remote_code_in_process=True to load it here anyway"
        )
    from hfadapt.hub.resolve import HubOptions

    if adapters:  # before any download: a misspelt name would stay applied
        _check_known(without_adapters, registry)
    cache = os.fspath(cache_dir) if cache_dir is not None else None
    hub = HubOptions(
        revision=revision, token=token, cache_dir=cache, local_files_only=local_files_only
    )
    torch_dtype = _dtype(dtype)
    with holding(verbose):
        model = _host_model(
            os.fspath(model_id_or_path), hub, trust_remote_code, sentence_transformers
        )
        model.eval()
        if adapters:
            on_spyre = device is not None and device.split(":")[0] == "spyre"
            adapt(
                model,
                device="spyre" if on_spyre else None,
                registry=registry,
                exclude=tuple(without_adapters),
            )
        model.to(torch_dtype)
        if device is not None:
            if device.split(":")[0] == "spyre":
                with contextlib.suppress(DeviceError):  # the real torch-spyre: its own device
                    register_device()
            model.to(device)
    return model
