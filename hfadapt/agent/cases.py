"""A failure the agent works on: a fingerprint with its evidence, the code that raised it
(target to replace, source of the enclosing function), how to build example inputs for the
equivalence proof, and the model to judge on the device. Plain data, so it crosses into the
sandbox as JSON; everything it names to import is hfadapt's or the model library's code."""

from __future__ import annotations

import ast
import inspect
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hfadapt.spyre.rules.lowering_report import SourceLocation, Violation

if TYPE_CHECKING:
    from types import FrameType

    import torch


@dataclass
class FailureCase:
    name: str  # a short label: the suite case name, or the fingerprint
    fingerprint: str
    rule_id: str
    op: str
    message: str  # the device's own error text
    # What the adapter replaces, if known: "module:Class.method" (kind "method", a forward or
    # a helper method; "staticmethod"; "classmethod") or "module:function" (kind "function",
    # a module-level function such as transformers.masking_utils:create_bidirectional_mask).
    target: str | None = None
    kind: str = "method"
    # kind "function": the method that calls it, "module:Class.method", where an accepted graph
    # is applied (the function's name rebound in that method's globals for the model).
    call_site: str | None = None
    location: str = ""  # "file:line in function"
    code_line: str = ""
    dtype: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    enclosing_source: str = ""
    # Inputs for the equivalence proof: a builder "pkg.mod:fn" (seed -> module, args, kwargs)
    # or a file of captured calls; else the draft's own example= is used (and says so).
    example: str | None = None
    example_file: str | None = None
    # The model to judge on the device: {"builder": "pkg.mod:fn"} (seed -> model, inputs) or
    # {"ref": model id or folder, "structural": bool}.
    model: dict[str, Any] | None = None
    profile: str | None = None
    execution: str = "eager"
    run_dtype: str = "float16"
    registry: str = "default"  # the adapters applied besides the draft: default | none
    without_adapters: list[str] = field(default_factory=list)  # left out of "default"
    # How the device step recognises this failure: by fingerprint (rule, op, dtype, call site),
    # or by rule and op alone ("rule_op") for the eval suite's one-site modules, whose call
    # site lies in hfadapt and so is attributed to whichever caller runs them.
    match: str = "fingerprint"

    def is_this(self, violation: Violation) -> bool:
        if violation.fingerprint() == self.fingerprint:
            return True
        return self.match == "rule_op" and (violation.rule_id, violation.op) == (
            self.rule_id,
            self.op,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FailureCase:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def module_name_for(file: str) -> str | None:
    """The importable module a source file is, from sys.modules or the site-packages path."""
    resolved = str(Path(file).resolve())
    for name, mod in list(sys.modules.items()):
        mod_file = getattr(mod, "__file__", None)
        if mod_file and str(Path(mod_file).resolve()) == resolved:
            return name
    short = SourceLocation(file, 0, "").short_file
    if short.endswith(".py") and "/" in short:
        return short[: -len(".py")].replace("/", ".").removesuffix(".__init__")
    return None


def _enclosing(tree: ast.Module, line: int) -> list[ast.stmt]:
    """The chain of class/function definitions around ``line``, outermost first."""
    chain: list[ast.stmt] = []
    body: list[ast.stmt] = tree.body
    while True:
        for node in body:
            defines = isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            if defines and node.lineno <= line <= (node.end_lineno or node.lineno):
                chain.append(node)
                body = node.body  # type: ignore[attr-defined]
                break
        else:
            return chain


KINDS = ("method", "staticmethod", "classmethod", "function")


def _method_kind(func: ast.stmt) -> str:
    decorators = {
        getattr(d, "id", getattr(d, "attr", "")) for d in getattr(func, "decorator_list", [])
    }
    for kind in ("staticmethod", "classmethod"):
        if kind in decorators:
            return kind
    return "method"


def locate_target(location: SourceLocation) -> tuple[str | None, str, str]:
    """(target or None, its kind, source of the enclosing function). A method of a class
    (forward, a helper, a staticmethod or classmethod) is ``module:Class.method``; code in a
    module-level function (or a closure inside one) is ``module:function``, the top-level
    function, which :func:`function_entry` turns into the function the model's code calls."""
    try:
        text = Path(location.file).read_text(encoding="utf-8")
        chain = _enclosing(ast.parse(text), location.line)
    except (OSError, SyntaxError, ValueError):
        return None, "method", location.code
    if not chain:
        return None, "method", location.code
    func = chain[-1]
    lines = text.splitlines()
    start = min([func.lineno, *(d.lineno for d in getattr(func, "decorator_list", []))])
    source = "\n".join(lines[start - 1 : func.end_lineno])
    module = module_name_for(location.file)
    names = [getattr(n, "name", "") for n in chain]
    if module and len(chain) >= 2 and isinstance(chain[-2], ast.ClassDef):
        return f"{module}:{names[-2]}.{names[-1]}", _method_kind(func), source
    if module and isinstance(chain[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"{module}:{names[0]}", "function", source
    return None, "method", source


def locate(location: SourceLocation) -> tuple[str | None, str]:
    """(target "module:Class.method" or None, source of the enclosing function)."""
    target, kind, source = locate_target(location)
    return (target if kind != "function" else None), source


def from_violation(
    violation: Violation,
    *,
    model: dict[str, object] | None = None,
    execution: str = "eager",
    profile: str | None = None,
    evidence: dict[str, object] | None = None,
    example_file: str | None = None,
) -> FailureCase:
    """A case for one violation met on the device."""
    target, kind, source = (None, "method", "")
    if violation.location is not None:
        target, kind, source = locate_target(violation.location)
    return FailureCase(
        name=violation.fingerprint(),
        fingerprint=violation.fingerprint(),
        rule_id=violation.rule_id,
        op=violation.op,
        message=violation.message,
        target=target,
        kind=kind,
        location=str(violation.location or ""),
        code_line=violation.location.code if violation.location else "",
        dtype=violation.dtype,
        evidence={
            "shapes": [list(s) for s in violation.shapes],
            "dtypes": list(violation.dtypes),
            "kind": violation.kind,
            **(evidence or {}),
        },
        enclosing_source=source,
        example_file=example_file,
        model=model,
        profile=profile,
        execution=execution,
    )


def target_source(target: str | None) -> str:
    """Source of the method a target names ("" when it cannot be found)."""
    if not target:
        return ""
    try:
        return inspect.getsource(pkgutil.resolve_name(target))
    except (ImportError, AttributeError, OSError, TypeError):
        return ""


def split_target(target: str) -> tuple[str, str, str]:
    """(module, class or "", method or function name) of ``module:Class.method`` or
    ``module:function``."""
    module_name, _, qual = target.partition(":")
    cls, _, name = qual.rpartition(".")
    return module_name, cls, name


def target_kind(target: str) -> str:
    """The kind of code a target names, read from the class: method, staticmethod,
    classmethod, or function (a module-level function)."""
    module_name, cls_name, name = split_target(target)
    if not cls_name:
        return "function"
    raw = inspect.getattr_static(pkgutil.resolve_name(f"{module_name}:{cls_name}"), name)
    if isinstance(raw, staticmethod):
        return "staticmethod"
    if isinstance(raw, classmethod):
        return "classmethod"
    return "method"


def stock_call(target: str) -> Callable[..., object]:
    """The stock code at ``target`` as ``call(module, *args, **kwargs)``: a method (forward, a
    helper, a staticmethod or classmethod) as the module's class defines it, bound as Python
    binds it (a staticmethod gets no ``self``); a module-level function with the objects its
    :class:`~hfadapt.graphs.capture.FunctionSite` holds (the model's ``config``)."""
    _, cls_name, name = split_target(target)
    if not cls_name:
        fn = pkgutil.resolve_name(target)

        def call_function(site: Any, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **site.context(), **kwargs)

        return call_function

    def call_method(module: torch.nn.Module, *args: object, **kwargs: object) -> Any:
        raw = inspect.getattr_static(type(module), name)
        return raw.__get__(module, type(module))(*args, **kwargs)

    return call_method


def draft_call(fn: Callable[..., object], kind: str) -> Callable[..., Any]:
    """A draft as ``call(module, *args, **kwargs)``, the form graphs are captured in: a method
    takes ``self``, a staticmethod its own arguments only, a classmethod the class, a
    module-level function its own arguments and the objects the site holds."""
    if kind == "staticmethod":
        return lambda module, *args, **kwargs: fn(*args, **kwargs)
    if kind == "classmethod":
        return lambda module, *args, **kwargs: fn(type(module), *args, **kwargs)
    if kind == "function":
        return lambda site, *args, **kwargs: fn(*args, **site.context(), **kwargs)
    return fn


def _homes(model: torch.nn.Module, name: str, fn: Any) -> list[object]:
    """The Python modules of the model's classes whose globals hold ``fn`` as ``name``: where
    the model's code reads it."""
    found: dict[str, Any] = {}
    for m in model.modules():
        for klass in type(m).__mro__:
            mod = sys.modules.get(klass.__module__)
            if mod is not None and vars(mod).get(name) is fn:
                found[mod.__name__] = mod
    return list(found.values())


def function_entry(
    model: torch.nn.Module, inputs: Any, file: str, function: str
) -> tuple[str, str] | None:
    """(target "module:function", call site "module:Class.method") for code in a module-level
    function that the model runs: the function of that module the model's own code called
    (``create_bidirectional_mask`` for a failure in ``_preprocess_mask_arguments``), and the
    method that called it. Found by running the model once on the CPU, watching calls. None
    when the code did not run or no method of a class called into it."""
    import torch

    wanted = str(Path(file).resolve())
    found: list[tuple[str, str]] = []

    def entry_of(frame: FrameType) -> tuple[str, str] | None:
        home = frame.f_globals
        f = frame
        while f.f_back is not None and f.f_back.f_globals is home:
            f = f.f_back
        caller = f.f_back
        # decorators of transformers' (deprecate_kwarg ...) route the call: look past them
        while caller is not None and str(caller.f_globals.get("__name__", "")).startswith(
            "transformers.utils."
        ):
            caller = caller.f_back
        if caller is None or "." not in caller.f_code.co_qualname:
            return None
        module_name = str(home.get("__name__", ""))
        target = f"{module_name}:{f.f_code.co_name}"
        try:
            resolved = pkgutil.resolve_name(target)
        except (ImportError, AttributeError, ValueError):
            return None
        if not callable(resolved) or "<locals>" in caller.f_code.co_qualname:
            return None
        site = f"{caller.f_globals.get('__name__', '')}:{caller.f_code.co_qualname}"
        return target, site

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if found or event != "call" or frame.f_code.co_name != function:
            return
        if str(Path(frame.f_code.co_filename).resolve()) == wanted:
            hit = entry_of(frame)
            if hit is not None:
                found.append(hit)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        with torch.no_grad():
            model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    finally:
        sys.setprofile(previous)
    return found[0] if found else None


def capture_calls(
    model: torch.nn.Module, runs: list[Any], target: str, *, per_run: int = 1, path: Path
) -> int:
    """Run ``model`` on CPU on each input set of ``runs`` and save the first ``per_run`` calls of
    the target (module, args, kwargs) to ``path``, for the equivalence proof: a forward's
    through a pre-hook on the target class's instances; a helper method's, staticmethod's or
    classmethod's with its own arguments (the class attribute wrapped for the run; a static or
    class method's module is the first instance of the class in the model); a module-level
    function's where the model's modules read it, its held objects on a FunctionSite.
    Returns how many calls were captured."""
    import torch

    module_name, cls_name, name = split_target(target)
    captured: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    budget = [0]
    if not cls_name:
        install = _record_function(model, target, captured, budget)
    elif name == "forward":
        install = _record_forward(model, f"{module_name}:{cls_name}", captured, budget)
    else:
        install = _record_method(model, f"{module_name}:{cls_name}", name, captured, budget)
    undo = install()
    try:
        with torch.no_grad():
            for inputs in runs:
                budget[0] = per_run
                model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    finally:
        undo()
    if captured:
        torch.save(captured, path)
    return len(captured)


def _clean_copy(module: Any) -> Any:
    import copy

    clone = copy.deepcopy(module)
    for sub in clone.modules():  # the copy must not carry capture hooks (unpicklable)
        sub._forward_pre_hooks.clear()
        sub._forward_pre_hooks_with_kwargs.clear()
        # nor applied adapters' method dispatch: a bound method pickles as a getattr of its
        # name (hfadapt_forward), which the loaded module lacks; on CPU the stock code runs
        for method in vars(sub).get("_hfadapt_stack", {}):
            vars(sub).pop(method, None)
        for key in [k for k in vars(sub) if k.startswith("_hfadapt_")]:
            vars(sub).pop(key)
    return clone


def _take(
    captured: list[object],
    budget: list[int],
    module: torch.nn.Module,
    args: object,
    kwargs: dict[str, object],
) -> None:
    import copy

    if budget[0] > 0:
        budget[0] -= 1
        captured.append((_clean_copy(module), copy.deepcopy(args), copy.deepcopy(kwargs)))


def _record_forward(
    model: torch.nn.Module, cls_path: str, captured: list[Any], budget: list[int]
) -> Callable[[], Callable[[], None]]:
    cls = pkgutil.resolve_name(cls_path)

    def install() -> Callable[[], None]:
        def hook(
            module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
        ) -> None:
            _take(captured, budget, module, args, kwargs)

        handles = [
            m.register_forward_pre_hook(hook, with_kwargs=True)
            for m in model.modules()
            if isinstance(m, cls)
        ]

        def undo() -> None:
            for h in handles:
                h.remove()

        return undo

    return install


def _record_method(
    model: torch.nn.Module, cls_path: str, name: str, captured: list[Any], budget: list[int]
) -> Callable[[], Callable[[], None]]:
    cls = pkgutil.resolve_name(cls_path)
    owner = next(k for k in cls.__mro__ if name in vars(k))
    raw = vars(owner)[name]
    instance = next((m for m in model.modules() if isinstance(m, cls)), None)
    if instance is None:
        raise RuntimeError(f"the model has no {cls.__name__} to call {name} on")

    def install() -> Callable[[], None]:
        if isinstance(raw, staticmethod):
            fn = raw.__func__

            def static(*args: object, **kwargs: object) -> Any:
                _take(captured, budget, instance, args, kwargs)
                return fn(*args, **kwargs)

            wrapped: Any = staticmethod(static)
        elif isinstance(raw, classmethod):
            cfn = raw.__func__

            def klass(c: Any, *args: Any, **kwargs: Any) -> Any:
                _take(captured, budget, instance, args, kwargs)
                return cfn(c, *args, **kwargs)

            wrapped = classmethod(klass)
        else:

            def method(self: object, *args: object, **kwargs: object) -> Any:
                if isinstance(self, cls):
                    _take(captured, budget, self, args, kwargs)
                return raw(self, *args, **kwargs)

            wrapped = method
        setattr(owner, name, wrapped)
        return lambda: setattr(owner, name, raw)

    return install


def _record_function(
    model: torch.nn.Module, target: str, captured: list[Any], budget: list[int]
) -> Callable[[], Callable[[], None]]:
    from hfadapt.graphs.capture import FunctionSite, split_function_call

    _, _, name = split_target(target)
    fn = pkgutil.resolve_name(target)
    homes = _homes(model, name, fn)
    if not homes:
        raise RuntimeError(f"no module of the model's classes reads {target}")

    def recorder(*args: object, **kwargs: object) -> Any:
        if budget[0] > 0:
            import copy

            graph, held = split_function_call(fn, args, kwargs)
            site = FunctionSite(copy.deepcopy(held))
            _take(captured, budget, site, (), graph)
        return fn(*args, **kwargs)

    def install() -> Callable[[], None]:
        for mod in homes:
            setattr(mod, name, recorder)

        def undo() -> None:
            for mod in homes:
                setattr(mod, name, fn)

        return undo

    return install


def captured_example(path: str) -> Any:
    """An example builder over captured calls: seed i < n replays call i; later seeds keep the
    shapes and redraw the main input with its captured mean and spread."""
    import torch

    calls = torch.load(path, weights_only=False)

    def example(seed: int) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        module, args, kwargs = calls[seed % len(calls)]
        if seed < len(calls) or not args or not isinstance(args[0], torch.Tensor):
            return module, args, kwargs
        # Only the main input (hidden states) is redrawn: masks and ids keep their meaning.
        x = args[0]
        if not x.is_floating_point() or x.numel() < 2:
            return module, args, kwargs
        g = torch.Generator().manual_seed(seed)
        std = float(x.double().std()) or 1.0
        fresh = torch.randn(x.shape, generator=g, dtype=x.dtype) * std + float(x.double().mean())
        return module, (fresh, *args[1:]), kwargs

    return example
