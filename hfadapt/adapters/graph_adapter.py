"""Adapters that are graphs: an agent's accepted draft, stored as data in a folder of its own and
applied by running its graph (:class:`hfadapt.graphs.GraphProgram`) in place of the method it
replaces, with the module instance's parameters passed in.

A folder holds ``adapter.json`` (what it replaces, the rule, where it applies, provenance, the
case it was proven on, the graph's digest; written by hfadapt), ``graph.json`` and
``constants.safetensors`` (the graph), and ``draft-source.txt`` (the drafted Python, for people
to read; never imported). Every load validates all of it again: the manifest's fields, the
digest, every op against the allowlist. Nothing in the folder is executed.

A folder is applied only when this machine proved it (:mod:`hfadapt.graphs.proven`: accepted
here, or re-proven with ``hfadapt adapters verify``): a copied, hand-written or edited folder is
refused with the reason until then. The registry reads a folder's manifest and checks its proof
at discovery; the graph itself is parsed on the adapter's first apply, so a registry's cost
follows the adapters actually used.

Where it applies: instances of exactly the target class whose plain attributes read while the
graph was proven (``conditions.reads``: head counts, an ``eps``, ``config.hidden_act``) equal
what they were then, on calls of the recorded form and sizes within the graph's ranges. A call
that does not fit runs the stock method."""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hfadapt.adapters.api import Adapter, Provenance
from hfadapt.adapters.rebind import stock_bound
from hfadapt.errors import AdapterError, GraphError, UntrustedDataError
from hfadapt.graphs import GraphArtifact, GraphProgram
from hfadapt.graphs.artifact import CONSTANTS_FILE, GRAPH_FILE, read_plain_file
from hfadapt.graphs.reads import is_plain, plain, read_value
from hfadapt.model_config import ModelConfig
from hfadapt.untrusted import bounded, clean_text, parse_json

log = logging.getLogger(__name__)

MANIFEST = "adapter.json"
SOURCE_FILE = "draft-source.txt"
FORMAT = "hfadapt-graph-adapter"
VERSION = 1
MAX_MANIFEST_BYTES = 1024 * 1024
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,79}$")
TARGET = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_.]{0,200}:[A-Za-z_][A-Za-z0-9_]{0,100}\.[A-Za-z_][A-Za-z0-9_]{0,100}$"
)
# A module-level function (transformers.masking_utils:create_bidirectional_mask): applied where
# a method of the model (its ``call_site``, a TARGET) reads it.
FUNCTION_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,200}:[A-Za-z_][A-Za-z0-9_]{0,100}$")
RULE = re.compile(r"^[a-z0-9_.]{1,80}$")
READ_PATH = re.compile(r"^[A-Za-z0-9_.]{1,200}$")
# Packages whose classes a graph adapter may target (importing the target's module is the one
# import a graph adapter causes): the model libraries, and hfadapt's own example modules.
TARGET_PACKAGES = (
    "transformers.",
    "sentence_transformers.",
    "hfadapt.agent.evalcases",
    "hfadapt.adapters.examples",
)


def graph_digest(folder: Path) -> str:
    """sha256 over graph.json and constants.safetensors, as stored."""
    h = hashlib.sha256()
    for name in (GRAPH_FILE, CONSTANTS_FILE):
        data = read_plain_file(folder / name, 512 * 1024 * 1024)
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def is_graph_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and (path / MANIFEST).is_file()


def read_manifest(folder: Path, raw: bytes | None = None) -> dict[str, Any]:
    """The validated manifest of a graph adapter folder (AdapterError naming what is wrong)."""
    try:
        if raw is None:
            raw = read_plain_file(folder / MANIFEST, MAX_MANIFEST_BYTES)
        data = parse_json(raw, max_bytes=MAX_MANIFEST_BYTES, max_depth=12)
    except (GraphError, UntrustedDataError) as exc:
        raise AdapterError(f"{folder.name}/{MANIFEST}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise AdapterError(f"{folder.name}/{MANIFEST} is not an {FORMAT} manifest")
    if data.get("version") != VERSION:
        raise AdapterError(
            f"{folder.name}: manifest version {data.get('version')!r}; this hfadapt reads {VERSION}"
        )
    name, target, rule = data.get("name"), data.get("target"), data.get("rule")
    if not isinstance(name, str) or not NAME.match(name):
        raise AdapterError(
            f"{folder.name}: adapter name {str(name)[:40]!r} is not letters, digits, '-' or '_'"
        )
    site = data.get("call_site")
    if isinstance(target, str) and FUNCTION_TARGET.match(target):
        if (
            not isinstance(site, str)
            or not TARGET.match(site)
            or not site.startswith(TARGET_PACKAGES)
        ):
            raise AdapterError(
                f"{folder.name}: a function target needs a call_site 'module:Class.method' "
                "in the packages a graph may replace code in"
            )
    elif not isinstance(target, str) or not TARGET.match(target):
        raise AdapterError(
            f"{folder.name}: target {str(target)[:80]!r} is not 'module:Class.method' or "
            "'module:function'"
        )
    if not target.startswith(TARGET_PACKAGES):
        raise AdapterError(
            f"{folder.name}: target {target} is outside the packages a graph may replace code in"
        )
    if not isinstance(rule, str) or not RULE.match(rule):
        raise AdapterError(f"{folder.name}: rule {str(rule)[:40]!r} is not a rule id")
    conditions = data.get("conditions")
    reads = conditions.get("reads") if isinstance(conditions, dict) else None
    if (
        not isinstance(reads, dict)
        or len(reads) > 400
        or not all(isinstance(k, str) and READ_PATH.match(k) for k in reads)
    ):
        raise AdapterError(f"{folder.name}: conditions.reads must map attribute paths to values")
    digest = data.get("graph_sha256")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise AdapterError(f"{folder.name}: the manifest carries no graph digest")
    return data


class GraphMethod:
    """The replacement for ``Class.method``: runs the graph when the call fits, the stock method
    otherwise (said once per adapter and reason). ``runs`` and ``fallbacks`` count both outside
    torch.compile; inside, Dynamo inlines the graph into the model's and nothing is counted: a
    counter there would be a graph break, and on the card a break after a post-LayerNorm output
    is the handoff defect (defect.post_ln_handoff)."""

    def __init__(
        self, program: GraphProgram | Callable[[], GraphProgram], method: str, name: str
    ) -> None:
        self._program: GraphProgram | None = None
        self._load: Callable[[], GraphProgram] | None = None
        if isinstance(program, GraphProgram):
            self._program = program
        else:
            self._load = program  # parsed on first apply (prepare), not at discovery
        self.method, self.name = method, name
        self.runs = 0
        self.fallbacks = 0
        self._said: set[str] = set()
        self._lock = threading.Lock()

    @property
    def program(self) -> GraphProgram:
        found = self._program
        if found is None:
            with self._lock:
                if self._program is None:
                    assert self._load is not None
                    self._program = self._load()
                found = self._program
        return found

    @property
    def prepared(self) -> bool:
        return self._program is not None

    def prepare(self) -> None:
        """Read, check and build the graph now (the registry calls this before applying: never
        while Dynamo traces a call)."""
        _ = self.program

    def __call__(self, module: torch.nn.Module, *args: object, **kwargs: object) -> Any:
        program = self._program if self._program is not None else self.program
        bound = program.bind(module, args, kwargs)
        if isinstance(bound, str):
            self._fell_back(bound)
            return stock_bound(module, self.method)(*args, **kwargs)
        if not torch.compiler.is_compiling():
            self.runs += 1
        return program.run(bound)

    @torch.compiler.disable
    def _fell_back(self, why: str) -> None:
        with self._lock:
            self.fallbacks += 1
            if why not in self._said:
                self._said.add(why)
                log.warning(
                    "graph adapter %s does not fit this call (%s): the stock code runs",
                    self.name,
                    why,
                )


class GraphFunction(GraphMethod):
    """The replacement for a module-level function (``function``, "module:name") where the
    model reads it: patched onto the call-site method, it runs that method's stock code with
    the function's name rebound (:func:`hfadapt.adapters.rebind.rebind`) to a runner that runs
    the graph when the call fits and the held objects' recorded attributes (``reads``: the
    config values read where the graph was proven, the attention implementation) hold, and
    the stock function otherwise."""

    def __init__(
        self,
        program: GraphProgram | Callable[[], GraphProgram],
        method: str,
        name: str,
        function: str,
        reads: dict[str, object],
    ) -> None:
        import inspect

        from hfadapt.graphs.capture import FunctionSite

        super().__init__(program, method, name)
        self.function = function
        self.function_name = function.rsplit(":", 1)[1]
        self.reads = dict(reads)
        self._stock: Any = None
        self._site = FunctionSite()  # owns no tensors: what bind reads the module's from
        self._params: list[str] = []
        self._var_keyword = False
        self._inspect = inspect
        self.runner = self._run_function
        self.runner.__func__.__name__ = self.function_name  # type: ignore[attr-defined]

    def stock_function(self) -> Any:
        if self._stock is None:
            import pkgutil

            fn = pkgutil.resolve_name(self.function)
            sig = self._inspect.signature(fn)
            kinds = self._inspect.Parameter
            self._params = [
                p.name
                for p in sig.parameters.values()
                if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
            ]
            self._var_keyword = any(p.kind == kinds.VAR_KEYWORD for p in sig.parameters.values())
            self._stock = fn
        return self._stock

    def prepare(self) -> None:
        super().prepare()
        self.stock_function()

    def _split(self, args: tuple[object, ...], kwargs: dict[str, object]) -> Any:
        """(graph keywords, held objects) of a call, or why it does not fit."""
        if len(args) > len(self._params):
            return "more positional arguments than the function names"
        named = dict(zip(self._params, args, strict=False))
        for k, v in kwargs.items():
            if k in named:
                return f"argument {k} given twice"
            named[k] = v
        graph, held = {}, {}
        for k, v in named.items():
            if v is None or isinstance(v, (torch.Tensor, bool, int, float, str)):
                graph[k] = v
            else:
                held[k] = v
        return graph, held

    def _held_mismatch(self, held: dict[str, object]) -> str:
        for path, value in self.reads.items():
            if path == "attn_implementation":
                now: Any = getattr(held.get("config"), "_attn_implementation", None)
            else:
                head, _, rest = path.partition(".")
                now = held.get(head, _MISSING)
                for part in rest.split(".") if rest else []:
                    now = getattr(now, part, _MISSING)
                now = plain(now) if is_plain(now) else _MISSING
            if now != value:
                return f"{path} is {now!r} here, {value!r} where the graph was proven"
        return ""

    def _run_function(self, *args: object, **kwargs: object) -> Any:
        stock = self.stock_function()
        split = self._split(args, kwargs)
        why = split if isinstance(split, str) else self._held_mismatch(split[1])
        if not why:
            program = self._program if self._program is not None else self.program
            bound = program.bind(self._site, (), split[0])
            if not isinstance(bound, str):
                if not torch.compiler.is_compiling():
                    self.runs += 1
                return program.run(bound)
            why = bound
        self._fell_back(why)
        return stock(*args, **kwargs)

    def __call__(self, module: torch.nn.Module, *args: object, **kwargs: object) -> Any:
        method = _with_function(type(module), self.method, self.function_name, self.runner)
        return method(module, *args, **kwargs)


@torch.compiler.disable
def _with_function(cls: type, method: str, name: str, runner: Any) -> Any:
    """The class's stock ``method`` with the global ``name`` rebound to ``runner`` (resolved
    outside compiled graphs, as the bundled mask adapters do: the first call fills a cache)."""
    from hfadapt.adapters.rebind import rebind, stock_method

    return rebind(stock_method(cls, method), **{name: runner})


class _Unset:
    def __eq__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Unset()


def reads_function(cls: type, method: str, name: str, function: str) -> bool:
    """Whether ``cls.method`` (as the class defines it) reads the stock ``function`` as
    ``name`` from its module's globals: where a function graph can be applied."""
    import pkgutil

    from hfadapt.adapters.rebind import globals_read, innermost, stock_method

    fn = getattr(cls, method, None)
    if fn is None:
        return False
    stock = stock_method(cls, method)
    try:
        home = innermost(stock).__globals__
        return name in globals_read(stock) and home.get(name) is pkgutil.resolve_name(function)
    except (AdapterError, ImportError, AttributeError, ValueError):
        return False


# A module's place in its model (``layer_idx``), not how it computes: not recorded.
_POSITION_NAMES = ("_idx", "_index", "_id", "layer_number")


def module_attributes(module: torch.nn.Module) -> dict[str, Any]:
    """The module's own plain attributes (an ``eps``, a hidden size, an ``approximate`` flag,
    a head count: what its constructor and config set), not ``training``: recorded with the
    reads when a graph is proven, so that it applies only where they all hold."""
    return {
        name: plain(value)
        for name, value in vars(module).items()
        if not name.startswith("_")
        and name != "training"
        and not name.endswith(_POSITION_NAMES)
        and READ_PATH.match(name)
        and is_plain(value)
    }


def attribute_mismatch(module: torch.nn.Module, reads: dict[str, object]) -> str:
    """Why a graph proven where ``reads`` held does not apply to ``module`` ("" when it does):
    a recorded read that differs, or a plain attribute of the module the proof never recorded
    (a folder from before attributes were recorded applies only to modules without any)."""
    for path, value in reads.items():
        now = read_value(module, path)
        if now != value:
            return f"{path} is {now!r} here, {value!r} where the graph was proven"
    for name, value in module_attributes(module).items():
        if name not in reads:
            return f"attribute {name}={value!r} was not recorded where the graph was proven"
    return ""


def conditions_check(
    cls: type | Callable[[], type | None], reads: dict[str, object], name: str = ""
) -> Callable[[object, object], bool]:
    """The ``applies`` predicate: exactly the target class (or the class a resolver gives,
    resolved on first use), every recorded read unchanged and every plain attribute of the
    module recorded (a mismatch is logged once per reason)."""
    said: set[str] = set()

    def applies(module: Any, config: Any) -> bool:
        m: torch.nn.Module = module
        want = cls if isinstance(cls, type) else cls()
        if want is None or type(m) is not want:
            return False
        why = attribute_mismatch(m, reads)
        if why and why not in said:
            said.add(why)
            log.warning("graph adapter %s does not apply to %s: %s", name, type(m).__name__, why)
        return not why

    return applies


def graph_adapter(
    program: GraphProgram | Callable[[], GraphProgram],
    *,
    name: str,
    target: str,
    rule: str,
    reads: dict[str, object],
    description: str = "",
    provenance: Provenance | None = None,
    path: str = "",
    source: str = "inline",
    call_site: str | None = None,
) -> Adapter:
    """An Adapter that runs ``program`` in place of ``target`` where ``reads`` hold. A
    module-level function target ("module:function") is applied on ``call_site`` (the
    "module:Class.method" that calls it), with the function's name rebound there."""
    if FUNCTION_TARGET.match(target):
        return _function_adapter(
            program, name, target, rule, reads, description, provenance, path, source, call_site
        )
    method = target.rsplit(".", 1)[1]
    a = Adapter(
        name=name,
        kind="method",
        target=target,
        fn=GraphMethod(program, method, name),
        rule=rule,
        description=description,
        provenance=provenance or Provenance(origin="agent", author="agent"),
        path=path,
        source=source,
        form="graph",
    )
    if isinstance(program, GraphProgram):
        cls = a.target_class()
        if cls is None or not issubclass(cls, torch.nn.Module):
            raise AdapterError(f"{name}: target {target} is not a torch module class")
        a.applies = conditions_check(cls, reads, name)
    else:  # discovery: the target's module is imported only when a model could match

        def resolve() -> type | None:
            cls = a.target_class()
            if cls is None or not issubclass(cls, torch.nn.Module):
                raise AdapterError(f"{name}: target {target} is not a torch module class")
            return cls

        a.applies = conditions_check(resolve, reads, name)
    return a


def _function_adapter(
    program: GraphProgram | Callable[[], GraphProgram],
    name: str,
    target: str,
    rule: str,
    reads: dict[str, object],
    description: str,
    provenance: Provenance | None,
    path: str,
    source: str,
    call_site: str | None,
) -> Adapter:
    if not call_site or not TARGET.match(call_site):
        raise AdapterError(
            f"{name}: function target {target} needs the method that calls it "
            "('module:Class.method'), where it is rebound"
        )
    method = call_site.rsplit(".", 1)[1]
    fn = GraphFunction(program, method, name, target, reads)
    a = Adapter(
        name=name,
        kind="method",
        target=call_site,
        fn=fn,
        rule=rule,
        description=description or f"{target} as a graph, where {call_site} calls it",
        provenance=provenance or Provenance(origin="agent", author="agent"),
        path=path,
        source=source,
        form="graph",
    )
    said: set[str] = set()

    def applies(module: torch.nn.Module, config: ModelConfig) -> bool:
        cls = a.target_class()
        if cls is None or not isinstance(module, cls):
            return False
        ok = reads_function(type(module), method, fn.function_name, target)
        if not ok and type(module).__name__ not in said:
            said.add(type(module).__name__)
            log.warning(
                "graph adapter %s does not apply to %s: its %s does not call %s",
                name,
                type(module).__name__,
                method,
                target,
            )
        return ok

    a.applies = applies
    return a


class NotProvenError(AdapterError):
    """A graph adapter folder this machine has not proven (its one line is the reason alone)."""


def not_proven_reason(name: str) -> str:
    return f"graph adapter {name} is not proven on this machine: run hfadapt adapters verify {name}"


def _graph_files(folder: Path) -> dict[str, bytes]:
    from hfadapt.graphs.artifact import MAX_CONSTANT_BYTES, MAX_GRAPH_BYTES

    return {
        MANIFEST: read_plain_file(folder / MANIFEST, MAX_MANIFEST_BYTES),
        GRAPH_FILE: read_plain_file(folder / GRAPH_FILE, MAX_GRAPH_BYTES),
        CONSTANTS_FILE: read_plain_file(folder / CONSTANTS_FILE, MAX_CONSTANT_BYTES),
    }


def _bytes_digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in (GRAPH_FILE, CONSTANTS_FILE):
        h.update(len(files[name]).to_bytes(8, "big"))
        h.update(files[name])
    return h.hexdigest()


def _program_loader(folder: Path, data: dict[str, Any], proven: str | None) -> Any:
    """Reads the graph's bytes once, checks them (against the manifest's digest, and against
    the content this machine proved when ``proven`` is a digest), and builds the program from
    exactly those bytes."""

    def load() -> GraphProgram:
        from hfadapt.graphs.proven import content_digest

        files = _graph_files(folder)
        if _bytes_digest(files) != data["graph_sha256"]:
            raise AdapterError(
                f"{folder.name}: graph.json or constants.safetensors changed since hfadapt wrote them"
            )
        if proven is not None and content_digest(folder) != proven:
            raise NotProvenError(
                f"{folder.name} changed since it was found: {not_proven_reason(data['name'])}"
            )
        return GraphProgram(GraphArtifact.from_bytes(files[GRAPH_FILE], files[CONSTANTS_FILE]))

    return load


def load_graph_adapter(
    folder: Path, source: str = "user", *, proven: bool = True, lazy: bool = False
) -> Adapter:
    """The adapter a graph folder holds, validated (AdapterError/GraphError when anything is
    off: a manifest field, the digest, an op outside the allowlist, a constant). ``proven``:
    refused unless this machine proved the folder as it is (:mod:`hfadapt.graphs.proven`).
    ``lazy``: the graph is parsed on the adapter's first apply (``fn.prepare()``), not here."""
    from hfadapt.graphs.proven import is_proven, proven_digest

    data = read_manifest(folder)
    digest: str | None = None
    if lazy and proven:
        digest = proven_digest(folder)
        if digest is None:
            raise NotProvenError(not_proven_reason(data["name"]))
    loader = _program_loader(folder, data, digest)
    program: GraphProgram | Callable[[], GraphProgram] = loader if lazy else loader()
    if proven and not lazy and not is_proven(folder):
        raise NotProvenError(not_proven_reason(data["name"]))
    prov_raw = data.get("provenance") if isinstance(data.get("provenance"), dict) else {}
    prov = bounded(prov_raw, max_depth=6, max_string=2000)
    provenance = Provenance(
        origin="agent",
        author=clean_text(prov.get("author", "agent"), 120),
        date=clean_text(prov.get("date", ""), 40),
        endpoint_model=clean_text(prov.get("endpoint_model", ""), 128) or None,
        attempt_id=prov.get("attempt_id") if isinstance(prov.get("attempt_id"), int) else None,
        evidence=prov.get("evidence") if isinstance(prov.get("evidence"), dict) else {},
    )
    return graph_adapter(
        program,
        name=data["name"],
        target=data["target"],
        rule=data["rule"],
        call_site=data.get("call_site"),
        reads=dict(data["conditions"]["reads"]),
        description=clean_text(data.get("description", ""), 500),
        provenance=provenance,
        path=str(folder),
        source=source,
    )


def draft_source(folder: Path) -> str:
    """The drafted Python kept with a graph adapter, as text (never imported)."""
    try:
        return read_plain_file(folder / SOURCE_FILE, 1024 * 1024).decode("utf-8", errors="replace")
    except GraphError as exc:
        raise AdapterError(f"{folder.name}: no drafted source kept ({exc})") from exc


__all__ = [
    "MANIFEST",
    "SOURCE_FILE",
    "GraphFunction",
    "GraphMethod",
    "NotProvenError",
    "attribute_mismatch",
    "conditions_check",
    "draft_source",
    "graph_adapter",
    "graph_digest",
    "is_graph_folder",
    "load_graph_adapter",
    "module_attributes",
    "not_proven_reason",
    "read_manifest",
]
