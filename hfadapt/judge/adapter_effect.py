"""Whether the adapters a run applied took effect: an applied adapter whose own device rule
still fires in the code it rewrites did nothing there (a dependency release moved or wrapped
that code, or the adapter is broken). Such a run must say so, not list the adapter as a fix.

What counts as the adapter's code: the module of its target (``pkg.module:Class.method``), as
a violation's or a defect firing's source file. What counts as its rule: the rule id it names,
or a profile defect whose ``adapter`` text names it (``rope-rotate-matmul-*`` for
``defect.rotate_half_slice``). A rule that fires elsewhere (another file, another family) is
not the adapter's: that is an ordinary failure, and the usual next step applies."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hfadapt.spyre.rules.lowering_report import LoweringReport, SourceLocation

__all__ = ["Ineffective", "ineffective_adapters", "sentence"]

# adapter names and name patterns in a defect's ``adapter`` text
_NAME = re.compile(r"[a-z0-9][a-z0-9*_-]*-[a-z0-9*_-]+")


@dataclass(frozen=True)
class Ineffective:
    """One applied adapter whose rule still fired in the code it rewrites."""

    adapter: str
    rule: str  # the rule id or defect id that fired
    where: str  # the source location (or module path) where it fired

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _module_file(target: str) -> str:
    """``transformers/models/qwen3/modeling_qwen3.py`` for a target in that module."""
    module = target.partition(":")[0]
    return module.replace(".", "/") + ".py"


def _in(location: SourceLocation | None, module_file: str) -> bool:
    return location is not None and location.short_file.endswith(module_file)


def _named(text: str, adapter: str) -> bool:
    return any(fnmatch.fnmatchcase(adapter, p) for p in _NAME.findall(text))


def ineffective_adapters(
    report: LoweringReport | None,
    applied: Sequence[str],
    adapters: Iterable[Any],
    defect_adapters: dict[str, str],
) -> list[Ineffective]:
    """The applied adapters whose rule fired in their own target module. ``adapters``: the
    registry's Adapter objects (name, rule, target); ``defect_adapters``: the profile's defect
    id -> the adapter text of that defect."""
    if report is None or not applied:
        return []
    wanted = set(applied)
    found: list[Ineffective] = []
    for a in adapters:
        if a.name not in wanted:
            continue
        home = _module_file(a.target)
        for v in report.violations:
            if v.rule_id == a.rule and _in(v.location, home):
                found.append(Ineffective(a.name, v.rule_id, str(v.location)))
                break
        for f in report.defects:
            if not _named(defect_adapters.get(f.defect_id, ""), a.name):
                continue
            if f.location is not None and not _in(f.location, home):
                continue
            found.append(Ineffective(a.name, f.defect_id, str(f.location or f.module or f.op)))
            break
    return found


def sentence(found: Sequence[dict[str, str]]) -> str:
    """One sentence for the next step and the human output."""
    first = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (
        f"adapter {first['adapter']} is applied but its rule {first['rule']} still fires at "
        f"{first['where']}{more}: it did not take effect (the code it rewrites changed, e.g. "
        f"a dependency update); check it with: hfadapt adapters verify {first['adapter']}"
    )
