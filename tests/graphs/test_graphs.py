"""Graphs of ATen ops as data (hfadapt.graphs): a rewrite captured with torch.export becomes an
artifact that reads back without running anything, refuses what it must, runs exactly (float64)
and on the simulated device eager and compiled, with host work outside compiled graphs."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from hfadapt.agent import evalcases as ec
from hfadapt.errors import GraphError
from hfadapt.graphs import GraphArtifact, GraphProgram, ops, values
from hfadapt.graphs.capture import capture_method


def softsign(self: Any, x: torch.Tensor) -> torch.Tensor:
    return x * torch.reciprocal(1.0 + x.abs())


def causal(self: Any, scores: torch.Tensor) -> torch.Tensor:
    n = scores.shape[-1]
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    mask = torch.zeros(n, n, dtype=scores.dtype).masked_fill(
        ~keep, torch.finfo(scores.dtype).min / 2
    )
    return (scores + mask.to(scores.device)).softmax(dim=-1)


def rms(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    x = hidden_states.to(torch.float32)
    x = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * x.to(hidden_states.dtype)


def _round_trip(art: GraphArtifact) -> GraphArtifact:
    """Through JSON and safetensors bytes, as an artifact leaves the sandbox."""
    from safetensors.torch import save

    return GraphArtifact.from_bytes(json.dumps(art.to_json()).encode(), save(art.constants))


@pytest.fixture(scope="module")
def programs() -> dict[str, tuple[GraphProgram, Any]]:
    found = {}
    for name, fn, example in (
        ("softsign", softsign, ec.softsign_example),
        ("causal", causal, ec.causal_example),
        ("rms", rms, ec.rms_norm_example),
    ):
        m, args, kwargs = example(0)
        found[name] = (
            GraphProgram(_round_trip(capture_method(m.float(), fn, args, kwargs))),
            example,
        )
    return found


@pytest.mark.parametrize("name", ["softsign", "causal", "rms"])
def test_a_captured_graph_is_exact_in_float64_at_any_size(
    name: str, programs: dict[str, Any]
) -> None:
    program, example = programs[name]
    fn = {"softsign": softsign, "causal": causal, "rms": rms}[name]
    for seed in (0, 1, 2):  # odd sizes that change with the seed: the graph is not pinned to one
        module, args, kwargs = example(seed)
        module = module.double()
        bound = program.bind(module, args, kwargs)
        assert not isinstance(bound, str), bound
        out = program.run(bound)
        ref = fn(module, *args, **kwargs)
        err = float((out - ref).abs().max())
        assert out.dtype == torch.float64 and err <= 1e-15, f"{name} seed {seed}: max abs err {err}"


def test_dtype_device_and_dtype_limits_are_symbols(programs: dict[str, Any]) -> None:
    program, _ = programs["causal"]
    art = program.artifact
    fills = [
        a
        for n in art.nodes
        if n.op == "aten::masked_fill.Scalar"
        for a in n.args
        if isinstance(a, values.Symbol)
    ]
    assert fills == [values.Symbol("min", 0.5)], fills
    assert fills[0].resolve(torch.float16, torch.device("cpu")) == -32752.0
    assert (
        fills[0].resolve(torch.float64, torch.device("cpu")) == torch.finfo(torch.float64).min / 2
    )
    uploads = [n for n in art.nodes if n.op == "aten::_to_copy.default" and "device" in n.kwargs]
    assert [n.kwargs["device"] for n in uploads] == [values.Symbol("$device")], uploads
    share = program.host_share()
    assert share["host_nodes"] == 5 and share["compute_nodes"] == 7, share  # the mask: on the host


def test_a_call_that_does_not_fit_is_refused_with_the_reason(programs: dict[str, Any]) -> None:
    program, example = programs["rms"]
    module, (x,), _ = example(0)
    assert "variance_epsilon" not in json.dumps(program.artifact.to_json())  # baked: a condition
    cases = {
        "keyword arguments": (module.double(), (x,), {"extra": 1}),
        "is torch.int64": (module.double(), (x.long(),), {}),
        "has 2 dimensions": (module.double(), (x[0],), {}),
        "has size": (torch.nn.Module(), (x,), {}),
    }
    for expected, (m, args, kwargs) in cases.items():
        why = program.bind(m, args, kwargs)
        assert isinstance(why, str), f"{expected}: the call was accepted"
        if expected != "has size":
            assert expected in why, why
        else:
            assert "no param weight" in why, why


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("builtins.eval", "not an ATen op name"),
        ("aten::add_.Tensor", "not in hfadapt's allowlist"),
        ("aten::bernoulli.p", "not in hfadapt's allowlist"),
        ("aten::native_dropout.default", "not in hfadapt's allowlist"),
        ("aten::index_put_.default", "not in hfadapt's allowlist"),
        ("prims::add.default", "not an ATen op name"),
        ("aten::mul.NoSuchOverload", "no such ATen overload"),
        ("sym::system", "not a symbolic-size operation"),
    ],
)
def test_ops_outside_the_allowlist_do_not_resolve(name: str, match: str) -> None:
    with pytest.raises(GraphError, match=match):
        ops.resolve(name)


def test_allowed_ops_are_functional_and_deterministic() -> None:
    for packet in sorted(ops.ATEN_OPS):
        overloads = getattr(torch.ops.aten, packet).overloads()
        for overload in overloads:
            name = f"aten::{packet}.{overload}"
            try:
                op = ops.resolve(name)
            except GraphError as exc:  # refused overloads must say why, never pass quietly
                assert "writes" in str(exc) or "random" in str(exc) or "host" in str(exc), (
                    name,
                    exc,
                )
                continue
            schema = op._schema  # type: ignore[attr-defined]
            assert not schema.is_mutable, name
            assert torch.Tag.nondeterministic_seeded not in op.tags or name in ops.ZERO_DROPOUT, (
                name
            )  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"s": "__import__('os')"}, "not a plain word"),
        ({"dtype": "torch.float32"}, "not one a graph may use"),
        ({"device": "cuda"}, "neither 'cpu' nor"),
        ({"ref": 99}, "does not point at an earlier value"),
        ({"f": "1e400e"}, "is not a number"),
        ({"finfo": "min", "scale": 3.0}, "not a known dtype limit"),
        ({"pickle": "gASV"}, "unknown argument tag"),
        (
            {"list": [{"list": [{"list": [{"list": [{"list": [{"list": [{"list": [1]}]}]}]}]}]}]},
            "nests too deep",
        ),
    ],
)
def test_literals_outside_the_format_do_not_decode(value: Any, match: str) -> None:
    with pytest.raises(GraphError, match=match):
        values.decode(value, 3)


def test_host_segments_run_outside_the_compiled_graph(programs: dict[str, Any]) -> None:
    from hfadapt.spyre.compile.backend import lower

    program, example = programs["causal"]
    _, (scores,), _ = example(0)

    class Model(torch.nn.Module):
        def forward(self, scores: torch.Tensor) -> Any:
            bound = program.bind(self, (scores,), {})
            assert not isinstance(bound, str), bound
            return program.run(bound)

    torch._dynamo.reset()
    lowered, report = lower(Model(), {"scores": scores.half()}, None)
    assert report.ok, report.summary()  # tril and masked_fill ran on the host, not in the graph
    ref = causal(None, scores)
    err = float((lowered.audit_output.double() - ref).abs().max())
    assert err < 2e-3, f"compiled with a host segment: max abs err {err} against float64"


def test_a_graph_adapter_is_scoped_dormant_on_the_cpu_and_reversible(
    programs: dict[str, Any],
) -> None:
    from hfadapt.adapters.graph_adapter import graph_adapter
    from hfadapt.adapters.registry import Registry, applied_to

    program, _ = programs["softsign"]
    a = graph_adapter(
        program,
        name="softsign-graph",
        target="hfadapt.agent.evalcases:Softsign.forward",
        rule="op.pow.square",
        reads={},
    )
    model, inputs = ec.softsign_model(0)
    other, _ = ec.softsign_model(0)
    stock = model(**inputs)
    handle = Registry(adapters=[a]).apply(model, device=None)  # dormant unless on the device
    assert handle.names == ["softsign-graph"] and applied_to(other) is None
    assert torch.equal(model(**inputs), stock) and a.fn.runs == 0, (
        "a dormant graph changed a CPU run"
    )  # type: ignore[attr-defined]
    on_device = model.half().to("spyre")
    got = on_device(**{k: v.half().to("spyre") for k, v in inputs.items()}).cpu().float()
    cos = float(torch.nn.functional.cosine_similarity(got, stock, dim=-1).min())
    assert a.fn.runs == 1 and cos > 0.999, f"graph runs {a.fn.runs}, min cosine {cos}"  # type: ignore[attr-defined]
    handle.remove()
    assert applied_to(model) is None
    assert not any(
        "_hfadapt_stack" in m.__dict__ or "forward" in m.__dict__ for m in model.modules()
    )


def test_a_graph_adapter_compiles_into_the_models_graph_without_a_break(
    programs: dict[str, Any],
) -> None:
    """Dynamo inlines the graph: no build, lock or counter breaks the model's graph there (on
    the card a break after a post-LayerNorm output is the handoff defect)."""
    from hfadapt.adapters.graph_adapter import graph_adapter
    from hfadapt.adapters.registry import Registry

    program, _ = programs["softsign"]
    fresh = GraphProgram(program.artifact)  # as loaded: nothing run yet
    a = graph_adapter(
        fresh,
        name="softsign-graph",
        target="hfadapt.agent.evalcases:Softsign.forward",
        rule="op.pow.square",
        reads={},
    )
    model, inputs = ec.softsign_model(0)
    Registry(adapters=[a]).apply(model, device=None)  # active when traced by torch.compile
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(**inputs)
    breaks = [str(b.reason)[:200] for b in explained.break_reasons]
    assert explained.graph_break_count == 0 and explained.graph_count == 1, (
        f"{explained.graph_count} graphs, {explained.graph_break_count} breaks: {breaks}"
    )
