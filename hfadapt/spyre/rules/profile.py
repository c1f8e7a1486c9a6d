"""The device profile: every Spyre rule (op outcome per mode and dtype, dtype mapping, casts,
layout, numerics) as versioned data with an id and a source. Code asks it; it holds no ifs
about particular ops beyond the named checks in hfadapt.spyre.rules.op_rules."""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import torch

from hfadapt.errors import ProfileError
from hfadapt.options import Execution
from hfadapt.spyre.numerics.dl16 import STICK_ELEMENTS, DL16Format, format_problem
from hfadapt.spyre.numerics.kernels import Accumulator, NumericParams

DEFAULT_PROFILE = "spyre-2026.07"

NATIVE = "native"
FALLBACK = "fallback"
UNSUPPORTED = "unsupported"
OUTCOMES = (NATIVE, FALLBACK, UNSUPPORTED)
MODES = Execution.choices()  # a rule holds in these executions
AUTO_DTYPE = "auto"  # a dtype option meaning "the profile's dtype for the model's family"


@dataclass(frozen=True)
class Rule:
    id: str
    outcome: str
    kind: str  # compute | view | creation | infra
    ops: tuple[str, ...]
    source: str
    modes: tuple[str, ...] = MODES
    checks: tuple[str, ...] = ()
    inferred: bool = False
    note: str = ""


@dataclass(frozen=True)
class Defect:
    """A device-only silent failure: the graph lowers, the card returns wrong numbers.
    ``trigger`` names a matcher in hfadapt.spyre.compile.defects; ``fixed_in`` is the first
    profile version where a source says it is fixed (None: present in every version)."""

    id: str
    source: str  # a key of the profile's sources, or the citation itself
    trigger: str
    effect: str
    modes: tuple[str, ...] = ("compile",)
    fixed_in: str | None = None
    adapter: str = ""
    fixed_source: str = ""  # the source that says it is fixed (a key of sources, or the text)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


# Ops no rule names: what the device says about them.
UNLISTED = Rule(
    id="op.unsupported",
    outcome=UNSUPPORTED,
    kind="compute",
    ops=(),
    source="ops",
    note="not in the supported-operations list",
)


@dataclass
class Profile:
    name: str
    version: str
    description: str
    sources: dict[str, str]
    errors: dict[str, str]
    dtypes: dict[str, dict[str, Any]]
    allowed_casts: frozenset[tuple[str, str]]
    cast_rule: str
    fp32_ops: frozenset[str]
    fp32_rule: str
    rules: dict[str, Rule]
    layout: dict[str, dict[str, Any]]
    numerics: dict[str, dict[str, Any]]
    family_dtypes: dict[str, Any] = field(default_factory=dict)
    defects: tuple[Defect, ...] = ()
    eager_casts: bool = True
    cast_fallback: bool = False  # a cast the device cannot do runs on the host (#1691)
    known_failures: tuple[dict[str, Any], ...] = ()
    path: str = ""
    inplace_lowers: bool = False
    _by_op: dict[str, Rule] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        _validate(self.layout, self.numerics, f"device profile {self.path or self.name}")
        for rule in self.rules.values():
            for op in rule.ops:
                if op in self._by_op and self._by_op[op].id != rule.id:
                    raise ProfileError(
                        f"profile {self.name}: {op} is claimed by both {self._by_op[op].id} and {rule.id}"
                    )
                self._by_op[op] = rule

    # -- lookups -------------------------------------------------------------
    def rule_for(self, op: str) -> Rule:
        """The rule for an ATen overload name ("aten::pow.Tensor_Scalar"): an exact overload
        entry wins over the op's packet ("aten::pow")."""
        rule = self._by_op.get(op)
        if rule is None:
            packet = op.split(".", 1)[0]
            rule = self._by_op.get(packet)
            if (
                rule is None
                and self.inplace_lowers
                and packet.endswith("_")
                and not packet.endswith("__")
            ):
                rule = self._by_op.get(packet[:-1])  # aten::add_ -> aten::add (profile "inplace")
        return rule or UNLISTED

    def outcome(self, op: str, mode: str) -> tuple[str, Rule]:
        rule = self.rule_for(op)
        if mode not in rule.modes:
            return UNSUPPORTED, rule
        return rule.outcome, rule

    def fp32_allowed(self, op: str) -> bool:
        return op.split(".", 1)[0] in self.fp32_ops

    def dtype_info(self, dtype: torch.dtype) -> dict[str, Any]:
        return self.dtypes.get(
            dtype_name(dtype), {"storage": None, "rule": "dtype.unknown", "error": str(dtype)}
        )

    def device_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a tensor has once on the device (int64 becomes int32)."""
        storage = self.dtype_info(dtype).get("storage")
        if storage == "int32" and dtype in (torch.int64, torch.int16):
            return torch.int32
        return dtype

    def cast_allowed(self, src: torch.dtype, dst: torch.dtype) -> bool:
        if src == dst:
            return True
        return (dtype_name(src), dtype_name(dst)) in self.allowed_casts

    def cast_allowed_in(self, src: torch.dtype, dst: torch.dtype, mode: str) -> bool:
        """cast_allowed, and on-device casts exist in this execution (profile ``casts.modes``)."""
        if src != dst and mode == "eager" and not self.eager_casts:
            return False
        return self.cast_allowed(src, dst)

    def matmul_k_padded(self) -> bool:
        """Whether the compiler pads a matmul's K to a whole stick (then K off a stick lowers)."""
        return bool(self.layout.get("matmul_k_multiple", {}).get("padded_by_compiler", False))

    def family_dtype(self, model_type: str | None) -> tuple[str, dict[str, Any]]:
        """The dtype (fp16 | bf16 | fp32) a model of ``model_type`` runs in on the device when
        no dtype is given, and why: {"rule", "dtype", "source", "note", "family"}."""
        spec = self.family_dtypes
        entry = (spec.get("families") or {}).get(model_type or "")
        if entry is None:
            dtype, source, note = spec.get("default", "fp16"), spec.get("default_source", ""), ""
        else:
            dtype, source, note = entry["dtype"], entry.get("source", ""), entry.get("note", "")
        why = {
            "rule": spec.get("rule", "dtype.family"),
            "dtype": dtype,
            "family": model_type if entry is not None else None,
            "source": self.sources.get(source, source),
            "note": note,
        }
        return dtype, why

    def message(self, key: str, **values: object) -> str:
        return self.errors[key].format(**values)

    def layout_value(self, key: str, default: int = 64) -> int:
        return int(self.layout.get(key, {}).get("value", default))

    @functools.cached_property
    def dl16(self) -> DL16Format:
        """The DL16 format of the profile's numerics (built once: every device op asks)."""
        spec = self.numerics.get("dl16", {})
        default = DL16Format()
        return DL16Format(
            exponent_bits=int(spec.get("exponent_bits", default.exponent_bits)),
            mantissa_bits=int(spec.get("mantissa_bits", default.mantissa_bits)),
            bias=int(spec.get("bias", default.bias)),
            max_finite_value=float(spec.get("max_finite", default.max_finite_value)),
            min_normal_value=float(spec.get("min_normal", default.min_normal_value)),
            host_inf_bits=int(str(spec.get("host_inf_bits", "0x6FFF")), 16),
            overflow_nan=str(spec.get("overflow", "nan")) == "nan",
        )

    def numerics_enabled(self, key: str) -> bool:
        return bool(self.numerics.get(key, {}).get("enabled", False))

    @functools.cached_property
    def numeric_params(self) -> NumericParams:
        """The values of the numerics section that the device's kernels compute with, as plain
        numbers (hfadapt.spyre.numerics.kernels takes these, never the profile); a rule the
        profile disables is None (0 for the SDPA key stick). Built once, like ``dl16``."""
        matmul = self.numerics.get("matmul_chunks", {})
        softmax = self.numerics.get("softmax_exp_floor", {})
        keys = self.numerics.get("sdpa_unaligned_keys", {})
        add = self.numerics.get("add_zero_code", {})
        return NumericParams(
            matmul_chunks=(int(matmul["chunk_elements"]), int(matmul["partial_mantissa_bits"]))
            if matmul.get("enabled", False)
            else None,
            softmax_exp_floor=float(softmax["exp_floor"])
            if softmax.get("enabled", False)
            else None,
            sdpa_unaligned_keys=int(keys.get("stick", STICK_ELEMENTS))
            if keys.get("enabled", False)
            else 0,
            add_zero_code=float(add["value"]) if add.get("enabled", False) else None,
            accumulator=self._accumulator(),
            layer_norm_stats=self.numerics_enabled("layer_norm_stats"),
        )

    def _accumulator(self) -> Accumulator | None:
        """The reduced-precision accumulator of ``numerics.reduced_precision_mean``, or None."""
        spec = self.numerics.get("reduced_precision_mean", {})
        if not spec.get("enabled", False):
            return None
        result = spec.get("result_mantissa_bits")
        small = spec.get("small_mean", {})
        small_on = bool(small.get("enabled", False))
        return Accumulator(
            int(spec["mantissa_bits"]),
            int(spec["lanes"]),
            int(result) if result is not None else None,
            float(small.get("below", 0.0)) if small_on else 0.0,
            float(small.get("ratio", 1.0)) if small_on else 1.0,
        )

    def rule_source(self, rule_id: str) -> str:
        """The public source a rule id cites, for reports and prompts."""
        for rule in self.rules.values():
            if rule.id == rule_id:
                return self.sources.get(rule.source, rule.source)
        for section in (self.layout, self.numerics):
            for spec in section.values():
                if spec.get("rule") == rule_id:
                    return str(self.sources.get(spec.get("source", ""), spec.get("source", "")))
        for spec in self.dtypes.values():
            if spec.get("rule") == rule_id:
                return self.sources.get(spec.get("source", ""), "")
        return ""

    def active_defects(self, mode: str = "compile") -> tuple[Defect, ...]:
        """The defects this profile version has in ``mode`` (not fixed at or before it: a
        ``fixed_in`` of "2026.10" covers every 2026.10.x version)."""
        here = _version_key(self.version)[:2]
        return tuple(
            d
            for d in self.defects
            if mode in d.modes and (d.fixed_in is None or here < _version_key(d.fixed_in)[:2])
        )

    def defect_source(self, defect: Defect) -> str:
        return self.sources.get(defect.source, defect.source)

    def describe(self) -> str:
        return f"{self.name} ({self.version})"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _profile_dir() -> Path:
    return Path(str(resources.files("hfadapt.spyre.rules") / "profiles"))


def available_profiles() -> list[str]:
    return sorted(p.stem for p in _profile_dir().glob("*.json"))


def _read(name_or_path: str) -> tuple[dict[str, Any], str]:
    path = Path(name_or_path)
    if not (path.suffix == ".json" and path.exists()):
        path = _profile_dir() / f"{name_or_path}.json"
    if not path.exists():
        raise ProfileError(
            f"no device profile {name_or_path!r}; bundled: {', '.join(available_profiles())}"
        )
    try:
        return json.loads(path.read_text()), str(path)
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileError(f"device profile {path} does not load: {exc}") from exc


# Sections a child profile updates key by key (a layout entry, a source) instead of replacing.
_MERGED_SECTIONS = ("sources", "layout", "numerics", "dtypes", "casts", "errors")


def _merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    merged = {
        **base,
        **{
            k: v
            for k, v in child.items()
            if k not in ("move_ops", "add_rules", "extends", "add_defects", "fix_defects")
        },
    }
    for section in _MERGED_SECTIONS:
        if isinstance(base.get(section), dict) and isinstance(child.get(section), dict):
            merged[section] = {**base[section], **child[section]}
    defects = [dict(d) for d in base.get("defects", [])] + [
        dict(d) for d in child.get("add_defects", [])
    ]
    for fix in child.get("fix_defects", []):  # {"id", "fixed_in", "source"}: a source says so
        found = [d for d in defects if d["id"] == fix["id"]]
        if not found:
            raise ProfileError(
                f"profile {child.get('name')}: fix_defects names unknown defect {fix['id']}"
            )
        found[0]["fixed_in"] = fix["fixed_in"]
        found[0]["fixed_source"] = fix.get("source", "")
    merged["defects"] = defects
    rules = [dict(r, ops=list(r["ops"])) for r in base["rules"]] + [
        dict(r, ops=list(r["ops"])) for r in child.get("add_rules", [])
    ]
    by_id = {r["id"]: r for r in rules}
    for move in child.get("move_ops", []):
        for r in rules:
            if move["op"] in r["ops"]:
                r["ops"].remove(move["op"])
        if move["to_rule"] not in by_id:
            raise ProfileError(
                f"profile {child.get('name')}: move_ops names unknown rule {move['to_rule']}"
            )
        by_id[move["to_rule"]]["ops"].append(move["op"])
    merged["rules"] = rules
    return merged


def _build(data: dict[str, Any], path: str) -> Profile:
    try:
        rules = {}
        for r in data["rules"]:
            if r["outcome"] not in OUTCOMES:
                raise ProfileError(f"rule {r['id']}: unknown outcome {r['outcome']!r}")
            rules[r["id"]] = Rule(
                id=r["id"],
                outcome=r["outcome"],
                kind=r.get("kind", "compute"),
                ops=tuple(r["ops"]),
                source=r.get("source", ""),
                modes=tuple(r.get("modes", MODES)),
                checks=tuple(r.get("checks", ())),
                inferred=bool(r.get("inferred", False)),
                note=r.get("note", ""),
            )
        return Profile(
            name=data["name"],
            version=data["version"],
            description=data.get("description", ""),
            sources=data["sources"],
            errors=data["errors"],
            dtypes=data["dtypes"],
            allowed_casts=frozenset(tuple(p) for p in data["casts"]["allowed"]),
            cast_rule=data["casts"]["rule"],
            fp32_ops=frozenset(data["fp32_ops"]["ops"]),
            fp32_rule=data["fp32_ops"]["rule"],
            rules=rules,
            layout=data["layout"],
            numerics=data["numerics"],
            family_dtypes=data.get("family_dtypes", {}),
            eager_casts="eager" in data["casts"].get("modes", MODES),
            cast_fallback=data["casts"].get("unsupported", "refuse") == "fallback",
            known_failures=tuple(data.get("known_failures", ())),
            path=path,
            inplace_lowers="inplace" in data,
            defects=_defects(data.get("defects", [])),
        )
    except KeyError as exc:
        raise ProfileError(f"device profile {path} lacks the field {exc}") from exc


# -- the numbers a profile gives: checked on load --------------------------------------------
# A profile's numerics and layout values reach C kernels and torch ops that do not check them
# (a 23-bit ``partial_mantissa_bits`` made the C sums shift by -1 and change every sign). Each
# is checked here against what the code can compute with; a value outside is a ProfileError
# naming the field, its value and what is allowed.

# fields every numerics section may hold that no code computes with
_NOTES = frozenset({"rule", "source", "cites", "note", "inferred"})
# numerics section -> the fields it may hold besides _NOTES
_NUMERICS_FIELDS: dict[str, frozenset[str]] = {
    "dl16": frozenset(
        {
            "sign_bits",
            "exponent_bits",
            "mantissa_bits",
            "bias",
            "max_finite",
            "min_normal",
            "host_inf_bits",
            "subnormals",
            "rounding",
            "overflow",
        }
    ),
    "compute": frozenset(),
    "reduced_precision_mean": frozenset(
        {
            "enabled",
            "mantissa_bits",
            "lanes",
            "result_mantissa_bits",
            "small_mean",
            "published_mean_rel_error",
            "published_fp16_control",
            "published_line",
        }
    ),
    "add_zero_code": frozenset({"enabled", "value", "published"}),
    "sdpa_unaligned_keys": frozenset({"enabled", "stick", "published"}),
    "softmax_exp_floor": frozenset({"enabled", "exp_floor", "published", "masked_by"}),
    "layer_norm_stats": frozenset({"enabled"}),
    "matmul_chunks": frozenset({"enabled", "chunk_elements", "partial_mantissa_bits"}),
}
# what a profile's DL16 fields are called on DL16Format
_DL16_FIELDS = {
    "max_finite_value": "max_finite",
    "min_normal_value": "min_normal",
    "overflow_nan": "overflow",
}


class _Fields:
    """The checks of one profile's values; each refusal names ``where`` and the field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def refuse(self, field: str, value: object, allowed: str) -> NoReturn:
        shown = json.dumps(value) if isinstance(value, (bool, int, float, str)) else repr(value)
        raise ProfileError(f"{self.where}: {field} is {shown}; allowed: {allowed}")

    def integer(
        self,
        spec: dict[str, object],
        field: str,
        key: str,
        low: int,
        high: int | None,
        why: str = "",
    ) -> int:
        value = spec[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < low
            or (high is not None and value > high)
        ):
            span = f"from {low} to {high}" if high is not None else f"of at least {low}"
            self.refuse(f"{field}.{key}", value, f"an integer {span}{why}")
        return value

    def number(
        self, spec: dict[str, object], field: str, key: str, low: float, high: float, why: str = ""
    ) -> float:
        value = spec[key]
        if not (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and low <= value <= high
        ):
            self.refuse(f"{field}.{key}", value, f"a number in [{low:g}, {high:g}]{why}")
        return float(value)

    def boolean(self, spec: dict[str, object], field: str, key: str) -> bool:
        value = spec[key]
        if not isinstance(value, bool):
            self.refuse(f"{field}.{key}", value, "true or false (a JSON boolean)")
        return value

    def one_of(
        self, spec: dict[str, object], field: str, key: str, allowed: tuple[object, ...], why: str
    ) -> None:
        value = spec[key]
        if value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
            self.refuse(f"{field}.{key}", value, " or ".join(map(json.dumps, allowed)) + why)

    def shares(self, spec: dict[str, object], field: str, key: str) -> None:
        """A table of published relative errors or probabilities: numbers in [0, 1]."""
        table = spec[key]
        if not isinstance(table, dict):
            self.refuse(f"{field}.{key}", table, "a table of numbers in [0, 1]")
        for name in table:
            self.number(table, f"{field}.{key}", name, 0.0, 1.0)

    def section(self, numerics: dict[str, object], name: str) -> dict[str, Any] | None:
        spec = numerics.get(name)
        if spec is None:
            return None
        field = f"numerics.{name}"
        if not isinstance(spec, dict):
            self.refuse(field, spec, "an object of fields")
        known = _NUMERICS_FIELDS[name] | _NOTES
        for key in spec:
            if key not in known:  # a misspelt field would be read as absent
                allowed = f"no such field; known: {', '.join(sorted(known))}"
                self.refuse(f"{field}.{key}", spec[key], allowed)
        if "inferred" in spec:
            self.boolean(spec, field, "inferred")
        if "enabled" in spec:
            self.boolean(spec, field, "enabled")
        return spec

    def required(self, spec: dict[str, object], field: str, *keys: str) -> None:
        for key in keys:
            if key not in spec:
                raise ProfileError(f"{self.where}: {field} lacks the field {key!r}")


def _validate(layout: dict[str, Any], numerics: dict[str, Any], where: str) -> None:
    """Every layout value and numerics field the simulator computes with, checked."""
    check = _Fields(where)
    stick = _validate_layout(check, layout)
    for name in numerics:
        if name not in _NUMERICS_FIELDS:  # no code reads it: a misspelt section
            allowed = f"no such section; known: {', '.join(sorted(_NUMERICS_FIELDS))}"
            check.refuse(f"numerics.{name}", numerics[name], allowed)
    _validate_dl16(check, numerics)
    spec = check.section(numerics, "reduced_precision_mean")
    field = "numerics.reduced_precision_mean"
    if spec is not None:
        if spec.get("enabled", False):
            check.required(spec, field, "mantissa_bits", "lanes")
        if "mantissa_bits" in spec:
            check.integer(
                spec, field, "mantissa_bits", 0, 23, " (an add keeps at most float32's 23)"
            )
        if "lanes" in spec:
            check.integer(spec, field, "lanes", 1, None, " (partial sums)")
        if spec.get("result_mantissa_bits") is not None:
            check.integer(spec, field, "result_mantissa_bits", 0, 23, " (or null: not truncated)")
        small = spec.get("small_mean")
        if small is not None:
            if not isinstance(small, dict):
                check.refuse(f"{field}.small_mean", small, "an object of fields")
            if small.get("enabled", False):
                check.required(small, f"{field}.small_mean", "below", "ratio")
                check.number(small, f"{field}.small_mean", "below", 0.0, 1.0)
                check.number(small, f"{field}.small_mean", "ratio", 1e-3, 1e3)
        for key in ("published_mean_rel_error", "published_fp16_control", "published_line"):
            if key in spec:
                check.shares(spec, field, key)
    spec = check.section(numerics, "sdpa_unaligned_keys")
    if spec is not None and "stick" in spec:
        check.integer(spec, "numerics.sdpa_unaligned_keys", "stick", 1, None)
    spec = check.section(numerics, "add_zero_code")
    field = "numerics.add_zero_code"
    if spec is not None:
        if spec.get("enabled", False):
            check.required(spec, field, "value")
        if "value" in spec:
            check.number(spec, field, "value", 0.0, 1.0, " (the code 0 + 0 reads back as)")
    spec = check.section(numerics, "softmax_exp_floor")
    field = "numerics.softmax_exp_floor"
    if spec is not None:
        if spec.get("enabled", False):
            check.required(spec, field, "exp_floor")
        if "exp_floor" in spec:
            check.number(
                spec, field, "exp_floor", 0.0, 1.0, " (a probability's exp, at most exp(0))"
            )
        if "published" in spec:
            check.shares(spec, field, "published")
    check.section(numerics, "layer_norm_stats")
    check.section(numerics, "compute")
    spec = check.section(numerics, "matmul_chunks")
    field = "numerics.matmul_chunks"
    if spec is not None:
        if spec.get("enabled", False):
            check.required(spec, field, "chunk_elements", "partial_mantissa_bits")
        if "chunk_elements" in spec:
            chunk = check.integer(spec, field, "chunk_elements", stick, None)
            if chunk % stick:
                allowed = f"a positive multiple of the {stick}-element stick (whole sticks)"
                check.refuse(f"{field}.chunk_elements", chunk, allowed)
        if "partial_mantissa_bits" in spec:
            why = " (a truncation drops at least one of float32's 23 mantissa bits)"
            check.integer(spec, field, "partial_mantissa_bits", 0, 22, why)


def _validate_layout(check: _Fields, layout: dict[str, Any]) -> int:
    """Every layout entry's values positive integers, the stick the kernels' 64 elements of
    128 bytes; returns the stick's elements."""
    for name, spec in layout.items():
        if not isinstance(spec, dict):
            check.refuse(f"layout.{name}", spec, "an object of fields")
        for key in spec:
            if key.startswith("value"):
                check.integer(spec, f"layout.{name}", key, 1, None)
        if "padded_by_compiler" in spec:
            check.boolean(spec, f"layout.{name}", "padded_by_compiler")
    stick: int = layout.get("stick_elements_fp16", {}).get("value", STICK_ELEMENTS)
    if stick != STICK_ELEMENTS:
        allowed = f"{STICK_ELEMENTS} (the simulator's kernels are built for that stick)"
        check.refuse("layout.stick_elements_fp16.value", stick, allowed)
    stick_bytes = layout.get("stick_bytes", {}).get("value", 2 * stick)
    if stick_bytes != 2 * stick:
        check.refuse(
            "layout.stick_bytes.value", stick_bytes, f"{2 * stick} ({stick} fp16 elements)"
        )
    fp32 = layout.get("fp32_stick_reduction", {}).get("value", stick_bytes // 4)
    if fp32 != stick_bytes // 4:
        allowed = f"{stick_bytes // 4} (the fp32 elements of a {stick_bytes}-byte stick)"
        check.refuse("layout.fp32_stick_reduction.value", fp32, allowed)
    return stick


def _validate_dl16(check: _Fields, numerics: dict[str, object]) -> None:
    spec = check.section(numerics, "dl16")
    if spec is None:
        return
    field = "numerics.dl16"
    default = DL16Format()
    if "sign_bits" in spec:
        check.integer(spec, field, "sign_bits", 1, 1)
    for key in ("max_finite", "min_normal"):
        if key in spec:
            check.number(spec, field, key, 0.0, math.inf)
    if "subnormals" in spec:
        check.one_of(
            spec, field, "subnormals", (False,), " (results below min_normal flush to zero)"
        )
    if "rounding" in spec:
        check.one_of(spec, field, "rounding", ("nearest_even",), " (the one rounding modelled)")
    if "overflow" in spec:
        check.one_of(
            spec,
            field,
            "overflow",
            ("nan", "inf"),
            " (what a result past max_finite reads back as)",
        )
    code = spec.get("host_inf_bits", "0x6FFF")
    if not (isinstance(code, str) and re.fullmatch(r"(0[xX])?[0-9a-fA-F]{1,8}", code)):
        check.refuse(
            f"{field}.host_inf_bits", code, 'a hexadecimal code as a string, e.g. "0x6FFF"'
        )
    fmt = dict(
        exponent_bits=spec.get("exponent_bits", default.exponent_bits),
        mantissa_bits=spec.get("mantissa_bits", default.mantissa_bits),
        bias=spec.get("bias", default.bias),
        max_finite_value=float(spec.get("max_finite", default.max_finite_value)),
        min_normal_value=float(spec.get("min_normal", default.min_normal_value)),
        host_inf_bits=int(code, 16),
        overflow_nan=spec.get("overflow", "nan") == "nan",
    )
    refused = format_problem(**fmt)
    if refused is not None:
        key, value, allowed = refused
        name = _DL16_FIELDS.get(key, key)
        check.refuse(f"{field}.{name}", spec.get(name, value), allowed)


def _defects(entries: list[dict[str, Any]]) -> tuple[Defect, ...]:
    out = []
    for d in entries:
        modes = tuple(d.get("modes", ("compile",)))
        if unknown := set(modes) - set(MODES):
            raise ProfileError(f"defect {d['id']}: unknown modes {sorted(unknown)}")
        out.append(
            Defect(
                id=d["id"],
                source=d["source"],
                trigger=d["trigger"],
                effect=d["effect"],
                modes=modes,
                fixed_in=d.get("fixed_in"),
                adapter=d.get("adapter", ""),
                fixed_source=d.get("fixed_source", ""),
            )
        )
    return tuple(out)


def _resolve(name_or_path: str, chain: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    data, path = _read(name_or_path)
    name = str(data.get("name", name_or_path))
    if name in chain:
        raise ProfileError(f"profile {name}: circular 'extends' ({' -> '.join((*chain, name))})")
    if "extends" in data:
        base, _ = _resolve(data["extends"], (*chain, name))
        data = _merge(base, data)
    return data, path


@lru_cache(maxsize=16)
def load_profile(name_or_path: str | None = None) -> Profile:
    """Load a bundled profile by name, or a profile JSON file by path. Cached."""
    data, path = _resolve(name_or_path or DEFAULT_PROFILE)
    return _build(data, path)
