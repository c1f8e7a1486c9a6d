"""The lowering report: every violation a graph or an eager run met, CPU fallbacks, and the
profile it was judged by. Diagnose, sweeps and the agent consume it (also as JSON)."""

from __future__ import annotations

import ast
import functools
import hashlib
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class SourceLocation:
    """Where in model code an op came from: the first frame outside torch and hfadapt."""

    file: str
    line: int
    function: str
    code: str = ""
    # the function's qualified name (``BertSelfAttention.forward``) when known: it tells apart
    # methods of two classes in one file that share a name; "" in what was recorded before it
    qualname: str = ""

    @property
    def site(self) -> str:
        """``file:qualname`` (``file:function`` when the qualified name is not known)."""
        return f"{self.short_file}:{self.qualname or self.function}"

    @property
    def short_file(self) -> str:
        """The path from the package root (``transformers/models/bert/modeling_bert.py``)."""
        parts = self.file.replace("\\", "/").split("/")
        for anchor in ("site-packages", "dist-packages"):
            if anchor in parts:
                return "/".join(parts[parts.index(anchor) + 1 :])
        return "/".join(parts[-3:])

    def __str__(self) -> str:
        return f"{self.short_file}:{self.line} in {self.function}"


@functools.lru_cache(maxsize=256)
def _definitions(file: str) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, qualified name) of every function in a source file, the
    qualified name as Python's ``co_qualname`` spells it (``Class.method``, ``f.<locals>.g``)."""
    try:
        with open(file, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return ()
    found: list[tuple[int, int, str]] = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                name = f"{prefix}{node.name}"
                found.append((start, node.end_lineno or node.lineno, name))
                walk(node.body, f"{name}.<locals>.")

    walk(tree.body, "")
    return tuple(found)


def qualname_at(file: str, line: int, function: str) -> str:
    """The qualified name of ``function`` around ``line`` of ``file`` (the innermost definition
    of that name holding the line), or "" when the source cannot say."""
    best = ""
    best_start = -1
    for start, end, name in _definitions(file):
        if start <= line <= end and name.rsplit(".", 1)[-1] == function and start > best_start:
            best, best_start = name, start
    return best


@dataclass(frozen=True)
class Violation:
    """One reason the device would refuse the model, with the profile rule that says so."""

    rule_id: str
    op: str  # ATen overload, e.g. "aten::pow.Tensor_Scalar"; or "model" for config-level rules
    message: str  # the text the device (or torch-spyre) would print
    kind: str = "op"  # op | layout | dtype | model
    dtypes: tuple[str, ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()
    location: SourceLocation | None = None
    inferred: bool = False

    @property
    def dtype(self) -> str:
        return self.dtypes[0] if self.dtypes else ""

    def fingerprint(self) -> str:
        """Stable id of (rule, op, dtype, call site): shared by every model that meets the same
        code. The call site is file and qualified function (class and method), not line, so
        it survives small edits; a location recorded without a qualified name keeps the id it
        had (file and function)."""
        site = self.location.site if self.location else ""
        key = "|".join((self.rule_id, self.op, self.dtype, site))
        return hashlib.sha1(key.encode()).hexdigest()[:12]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fingerprint"] = self.fingerprint()
        data["location"] = asdict(self.location) if self.location else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Violation:
        loc = data.get("location")
        return cls(
            rule_id=data["rule_id"],
            op=data["op"],
            message=data["message"],
            kind=data.get("kind", "op"),
            dtypes=tuple(data.get("dtypes", ())),
            shapes=tuple(tuple(s) for s in data.get("shapes", ())),
            location=SourceLocation(**loc) if loc else None,
            inferred=bool(data.get("inferred", False)),
        )

    def __str__(self) -> str:
        where = f" at {self.location}" if self.location else ""
        return f"[{self.rule_id}] {self.op}: {self.message}{where}"


@dataclass(frozen=True)
class DefectFiring:
    """A device defect that fired silently: the graph lowered, the card computes these numbers
    wrong (profile ``defects``). Not a violation: the model runs, its numbers fail."""

    defect_id: str  # e.g. defect.transpose_sdpa_noncontiguous
    source: str  # the public source that documents it
    effect: str
    op: str  # the ATen op that misreads, e.g. aten::mul.Tensor (SDPA's first op)
    node: str  # its node name in the ATen graph
    module: str = ""  # module path (nn_module_stack), e.g. encoder.layer.0.attention.self
    module_class: str = ""
    shape: tuple[int, ...] = ()  # the value read wrongly
    stride: tuple[int, ...] = ()
    dtype: str = ""
    location: SourceLocation | None = None

    def key(self) -> tuple[str, str, str, str, tuple[int, ...], tuple[int, ...]]:
        return (self.defect_id, self.module, self.op, self.node, self.shape, self.stride)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["location"] = asdict(self.location) if self.location else None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DefectFiring:
        loc = data.get("location")
        return cls(
            defect_id=data["defect_id"],
            source=data.get("source", ""),
            effect=data.get("effect", ""),
            op=data.get("op", ""),
            node=data.get("node", ""),
            module=data.get("module", ""),
            module_class=data.get("module_class", ""),
            shape=tuple(data.get("shape", ())),
            stride=tuple(data.get("stride", ())),
            dtype=data.get("dtype", ""),
            location=SourceLocation(**loc) if loc else None,
        )

    def __str__(self) -> str:
        where = self.module or "<model>"
        return f"[{self.defect_id}] {self.op} in {where} ({self.dtype}{list(self.shape)}, stride {list(self.stride)}): {self.source}"


@dataclass
class LoweringReport:
    """What one model met on the device: violations (deduplicated by fingerprint and shape),
    host fallbacks counted per op, int64 downcasts, and the ops seen."""

    profile_name: str
    profile_version: str
    mode: str  # eager | compile
    violations: list[Violation] = field(default_factory=list)
    fallbacks: Counter[str] = field(default_factory=Counter)
    downcasts: int = 0
    ops_seen: Counter[str] = field(default_factory=Counter)
    graph_count: int = 0
    compile_seconds: float = 0.0
    defects: list[DefectFiring] = field(default_factory=list)  # silent device failures that fired
    # the run's graphs were the ones compiled for an earlier model that Dynamo's guards accept
    # as the same program (another task of a model with task adapters): not traced again
    graphs_reused: bool = False
    _seen_keys: set[tuple[str, tuple[tuple[int, ...], ...]]] = field(
        default_factory=set, repr=False
    )

    @property
    def ok(self) -> bool:
        return not self.violations

    def add(self, violation: Violation) -> None:
        key = (violation.fingerprint(), violation.shapes)
        if key not in self._seen_keys:
            self._seen_keys.add(key)
            self.violations.append(violation)

    def add_defect(self, firing: DefectFiring) -> None:
        if all(f.key() != firing.key() for f in self.defects):
            self.defects.append(firing)

    def defect_ids(self) -> list[str]:
        return sorted({f.defect_id for f in self.defects})

    def merge(self, other: LoweringReport) -> None:
        for v in other.violations:
            self.add(v)
        for f in other.defects:
            self.add_defect(f)
        self.fallbacks.update(other.fallbacks)
        self.ops_seen.update(other.ops_seen)
        self.downcasts += other.downcasts
        self.graph_count += other.graph_count
        self.compile_seconds += other.compile_seconds

    def fingerprints(self) -> list[str]:
        return sorted({v.fingerprint() for v in self.violations})

    def summary(self) -> str:
        if self.ok:
            fb = sum(self.fallbacks.values())
            text = f"lowers ({self.mode}, profile {self.profile_name}); {fb} CPU fallback calls"
            if self.defects:
                text += f"; device defects fired: {', '.join(self.defect_ids())}"
            return text
        rules = Counter(v.rule_id for v in self.violations)
        parts = ", ".join(f"{r} x{n}" for r, n in rules.most_common())
        return f"{len(self.violations)} violation(s) ({self.mode}, profile {self.profile_name}): {parts}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile_name": self.profile_name,
            "profile_version": self.profile_version,
            "mode": self.mode,
            "ok": self.ok,
            "violations": [v.to_dict() for v in self.violations],
            "fallbacks": dict(self.fallbacks),
            "downcasts": self.downcasts,
            "ops_seen": dict(self.ops_seen),
            "graph_count": self.graph_count,
            "compile_seconds": self.compile_seconds,
            "defects": [f.to_dict() for f in self.defects],
            "graphs_reused": self.graphs_reused,
        }

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoweringReport:
        report = cls(
            profile_name=data["profile_name"],
            profile_version=data["profile_version"],
            mode=data["mode"],
            fallbacks=Counter(data.get("fallbacks", {})),
            downcasts=int(data.get("downcasts", 0)),
            ops_seen=Counter(data.get("ops_seen", {})),
            graph_count=int(data.get("graph_count", 0)),
            compile_seconds=float(data.get("compile_seconds", 0.0)),
            graphs_reused=bool(data.get("graphs_reused", False)),
        )
        for v in data.get("violations", []):
            report.add(Violation.from_dict(v))
        for f in data.get("defects", []):
            report.add_defect(DefectFiring.from_dict(f))
        return report

    @classmethod
    def from_json(cls, text: str) -> LoweringReport:
        return cls.from_dict(json.loads(text))
