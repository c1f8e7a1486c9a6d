"""The adapter API's helpers: running stock code on the host with the result back on the device
(``on_host``, ``host_copy``), reading and replacing a forward argument, the decorator's checks
and provenance defaults, the one RoPE table, and that the bundled adapter files use these
instead of their own copies."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hfadapt.adapters.api import (
    Provenance,
    adapter,
    forward_arg,
    host_copy,
    on_host,
    replace_forward_arg,
)
from hfadapt.adapters.registry import bundled_dir, discover, load_file
from hfadapt.errors import AdapterError


def test_on_host_runs_on_the_cpu_and_moves_nested_results_back_to_the_device() -> None:
    from hfadapt.spyre.eager import device as spyre_device

    spyre_device.register()
    x = torch.arange(8, dtype=torch.float16).reshape(2, 4).to("spyre")
    seen: list[str] = []

    def host_fn(a: torch.Tensor, pair: tuple[torch.Tensor, int], scale: float) -> Any:
        seen.extend([a.device.type, pair[0].device.type])
        return {"sum": a.float().sum(-1) * scale, "parts": [a * 2, pair[1]]}

    out = on_host(host_fn, x, (x, 3), back_to=x.device, scale=0.5)
    assert seen == ["cpu", "cpu"], f"fn saw tensors on {seen}"
    devices = [out["sum"].device.type, out["parts"][0].device.type]
    assert devices == ["spyre", "spyre"], f"results on {devices}"
    assert out["parts"][1] == 3
    assert out["sum"].cpu().tolist() == [3.0, 11.0], out["sum"].cpu().tolist()


def test_host_copy_moves_only_what_is_named_and_leaves_the_original_alone() -> None:
    torch.manual_seed(0)
    outer = torch.nn.Module()
    outer.table = torch.nn.Embedding(5, 3).half()
    outer.other = torch.nn.Linear(3, 3).half()
    outer.register_buffer("freq", torch.ones(3, dtype=torch.float16))
    outer.register_buffer("ids", torch.arange(3))
    host = host_copy(outer, "table")
    dtypes = (host.table.weight.dtype, host.freq.dtype, host.ids.dtype, host.other.weight.dtype)
    assert dtypes == (torch.float32, torch.float32, torch.int64, torch.float16), dtypes
    assert host.other is outer.other, "an unnamed submodule must be shared, not copied"
    assert outer.table.weight.dtype == torch.float16 and outer.freq.dtype == torch.float16
    assert torch.equal(host.table.weight, outer.table.weight.float())
    kept = host_copy(outer.table, dtype=None)
    assert kept.weight.dtype == torch.float16, kept.weight.dtype


def test_host_copy_of_a_missing_submodule_is_an_adapter_error_naming_it() -> None:
    outer = torch.nn.Module()
    outer.table = torch.nn.Embedding(5, 3)
    with pytest.raises(AdapterError, match=r"'tabel'.*\(it has table\)"):
        host_copy(outer, "tabel")


class _Model(torch.nn.Module):
    def forward(
        self, input_ids: Any = None, attention_mask: Any = None, position_ids: Any = None
    ) -> Any:
        return input_ids, attention_mask, position_ids


@pytest.mark.parametrize(
    ("args", "kwargs", "expected_args", "expected_kwargs"),
    [
        (("ids", "mask", "pos"), {}, ("ids", "mask", "NEW"), {}),  # by position: replaced there
        (("ids",), {"position_ids": "pos"}, ("ids",), {"position_ids": "NEW"}),  # by keyword
        (("ids",), {}, ("ids",), {"position_ids": "NEW"}),  # not passed: added as a keyword
    ],
)
def test_forward_args_are_read_and_replaced_where_the_call_passed_them(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    expected_args: tuple[Any, ...],
    expected_kwargs: dict[str, Any],
) -> None:
    model = _Model()
    before = forward_arg(model, args, kwargs, "position_ids")
    assert before == ("pos" if len(args) == 3 or kwargs else None), before
    new_args, new_kwargs = replace_forward_arg(model, args, kwargs, "position_ids", "NEW")
    assert (new_args, new_kwargs) == (expected_args, expected_kwargs)
    assert model(*new_args, **new_kwargs)[2] == "NEW"
    assert forward_arg(model, new_args, new_kwargs, "position_ids") == "NEW"
    assert forward_arg(model, args, kwargs, "no_such_argument") is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("kind", "hook", r"kind must be one of method, pre_hook, attention, not 'hook'"),
        ("proof", "graph", r"proof must be one of call, model, not 'graph'"),
    ],
)
def test_adapter_decorator_names_the_parameter_and_its_choices(
    field: str, value: str, message: str
) -> None:
    with pytest.raises(AdapterError, match=message):
        adapter(name="x", target="torch.nn:ReLU.forward", rule="r", **{field: value})


def test_provenance_defaults_to_hand_written_by_hfadapt(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    path.write_text(
        "from hfadapt.adapters.api import adapter\n"
        "@adapter(name='plain', target='torch.nn.modules.activation:ReLU.forward', rule='r')\n"
        "def plain(self, x):\n    return x\n"
    )
    (found,) = load_file(path)
    assert found.provenance == Provenance(), found.provenance
    assert found.provenance.to_dict() == {"origin": "hand-written", "author": "hfadapt"}


def test_every_rope_form_is_a_model_type_the_layout_rules_know_as_rotary() -> None:
    from hfadapt.spyre.rules.layout_rules import ROPE_MODEL_TYPES

    reg = discover(paths=[], entry_points=False)
    rope = next(a for a in reg.adapters if a.name == "rope-host-qwen3")
    forms = sys.modules[rope.fn.__module__]  # the loaded adapters/rope.py
    unknown = sorted(
        f.model_type for f in forms.ROPE_FORMS.values() if f.model_type not in ROPE_MODEL_TYPES
    )
    assert not unknown, f"rope forms whose model type layout_rules does not know: {unknown}"
    names = {a.name for a in reg.adapters}
    missing = [
        family
        for family in forms.ROPE_FORMS
        if {f"rope-host-{family}", f"rope-rotate-matmul-{family}"} - names
    ]
    assert not missing, f"rope forms without both adapters registered: {missing}"


# What a hand-rolled host round trip or a private constant looks like in an adapter file.
_COPIES = {
    "a host round trip (use on_host)": re.compile(r"\.cpu\(\)"),
    "its own stick constant (use STICK)": re.compile(r"^STICK\s*=", re.M),
    "its own provenance (the default is hand-written)": re.compile(r"_PROV\b|provenance="),
    "its own forward-argument lookup (use forward_arg)": re.compile(r"inspect\.signature"),
}


@pytest.mark.parametrize("path", sorted(bundled_dir().glob("*.py")), ids=lambda p: p.name)
def test_bundled_adapter_files_use_the_api_helpers(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = {what: m.group(0) for what, rx in _COPIES.items() if (m := rx.search(text))}
    assert not found, f"{path.name} writes {found}"


@pytest.mark.parametrize("dim", [32, 64, 96, 128])
def test_rotate_half_matmul_is_rotate_half_at_any_head_size(dim: int) -> None:
    """Exact in fp16 whether the head size is a whole number of sticks (x @ R) or not (the
    halves taken along a new axis: a matmul there would have K off the stick boundary)."""
    from transformers.models.llama.modeling_llama import rotate_half

    from hfadapt.adapters.registry import discover

    (rope,) = [a for a in discover().adapters if a.name == "rope-rotate-matmul-qwen3"]
    rotate_half_matmul = rope.fn.__globals__["rotate_half_matmul"]  # the bundled file's own
    x = torch.randn(2, 3, 7, dim, generator=torch.Generator().manual_seed(dim)).half()
    err = float((rotate_half_matmul(x) - rotate_half(x)).abs().max())
    assert err == 0.0, f"head size {dim}: max abs err {err}"
