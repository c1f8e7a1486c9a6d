"""defect.post_ln_handoff (hf-adapters ``hf_common.py``): a compiled graph's LayerNorm output,
handed to a later compiled graph, is misread by that graph's matmul; read on the host, or cloned
in eager Python between the graphs, it is right. Numbers are measured against a CPU fp32
reference and printed."""

from __future__ import annotations

import functools
import re
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from support.bundled_proofs import bundled_proof
from support.defect_models import tiny_bert_folder
from torch.nn import functional as F

from hfadapt.spyre.compile.backend import lower
from hfadapt.spyre.compile.defects import CROSS_GRAPH_TRIGGERS
from hfadapt.spyre.compile.handoff import TRIGGER, is_marked
from hfadapt.spyre.compile.reports import collect
from hfadapt.spyre.rules.profile import available_profiles, load_profile

DEFECT = "defect.post_ln_handoff"
ADAPTER = "post-ln-handoff-clone"


def _cosine(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-token cosine over the last dimension."""
    a, b = out.double().reshape(-1, out.shape[-1]), ref.double().reshape(-1, ref.shape[-1])
    return F.cosine_similarity(a, b, dim=-1)


def _lower(module: Any, *inputs: torch.Tensor):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lowered, report = lower(module, inputs)
    assert report.ok, f"must lower: {report.summary()}"
    return lowered, report


@torch.compiler.disable
def _host_step(x: torch.Tensor) -> torch.Tensor:
    """Code between two graphs that hands the tensor on as it is (what the host-built masks
    do next to the hidden state)."""
    return x


@torch.compiler.disable
def _host_clone(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


class _TwoGraphs(torch.nn.Module):
    """proj -> LayerNorm | host | matmul (and a residual read); ``clone``: None, "eager"
    (between the graphs) or "graph" (inside the first graph, before it returns)."""

    def __init__(self, clone: str | None = None, hidden: int = 128) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.clone = clone
        self.proj = torch.nn.Linear(hidden, hidden)
        self.ln = torch.nn.LayerNorm(hidden)
        self.out = torch.nn.Linear(hidden, hidden)
        with torch.no_grad():  # an affine part that matters, as trained LayerNorms have
            self.ln.weight.normal_(1.0, 0.3)
            self.ln.bias.normal_(0.0, 0.3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.ln(self.proj(x))
        if self.clone == "graph":
            h = h.clone()
        h = _host_clone(h) if self.clone == "eager" else _host_step(h)
        return self.out(h), h * 2.0


def _run(clone: str | None) -> tuple[torch.Tensor, torch.Tensor, Any]:
    x = torch.randn(2, 64, 128, generator=torch.Generator().manual_seed(1))
    module = _TwoGraphs(clone)
    with torch.no_grad():
        ref_out, ref_h2 = module(x)
    lowered, report = _lower(module.half(), x.half())
    out, h2 = lowered(x.half())
    return _cosine(out.float(), ref_out), _cosine(h2.float(), ref_h2), report


def test_the_defect_is_in_every_profile_with_its_source() -> None:
    assert TRIGGER in CROSS_GRAPH_TRIGGERS
    for name in available_profiles():
        p = load_profile(name)
        [d] = [d for d in p.defects if d.id == DEFECT]
        assert d.trigger == TRIGGER and d.modes == ("compile",) and d.fixed_in is None, d
        assert d.adapter.startswith(ADAPTER), d.adapter
        source = p.defect_source(d)
        assert "hf-adapters" in source and "hf_common.py" in source and ".clone()" in source, source
        assert d in p.active_defects("compile") and d not in p.active_defects("eager")


def test_a_layer_norm_output_handed_to_the_next_graph_is_misread_by_its_matmul() -> None:
    cos, cos_residual, report = _run(None)
    fired = [f for f in report.defects if f.defect_id == DEFECT]
    print(
        f"post-LN handoff: matmul reader per-token cosine min {float(cos.min()):.4f} "
        f"mean {float(cos.mean()):.4f}; residual reader min {float(cos_residual.min()):.6f}"
    )
    assert report.graph_count == 2, report.summary()
    assert len(fired) == 1, [str(f) for f in report.defects]
    f = fired[0]
    assert f.module == "out" and f.module_class == "Linear" and f.op == "aten::addmm", f
    assert f.shape == (2, 64, 128) and f.dtype == "float16", f
    assert "hf_common.py" in f.source and f.effect.endswith("(the output of ln)"), f
    # garbage for the matmul (tokens and features mixed), right for the residual read
    assert float(cos.mean()) < 0.5, f"misread matmul: mean per-token cosine {float(cos.mean())}"
    assert float(cos_residual.min()) > 0.999, f"residual read: {float(cos_residual.min())}"


def test_an_eager_clone_between_the_graphs_fixes_it_a_compiled_clone_does_not() -> None:
    cos_eager, _, report_eager = _run("eager")
    cos_graph, _, report_graph = _run("graph")
    print(
        f"eager clone: min cosine {float(cos_eager.min()):.6f}, fired "
        f"{report_eager.defect_ids()}; clone in the graph: mean cosine "
        f"{float(cos_graph.mean()):.4f}, fired {report_graph.defect_ids()}"
    )
    assert report_eager.defects == [] and float(cos_eager.min()) > 0.999, (
        report_eager.defect_ids(),
        float(cos_eager.min()),
    )
    assert report_graph.defect_ids() == [DEFECT] and float(cos_graph.mean()) < 0.5, (
        report_graph.defect_ids(),
        float(cos_graph.mean()),
    )


def test_read_on_the_host_it_is_right_and_the_check_runs_at_each_call() -> None:
    """The first graph's output (the host's copy) is right and marked; the second graph,
    compiled once, misreads a marked tensor (or an eager view of it) and reads a clone right,
    without recompiling: the mark is checked at run time, not by a guard."""
    x = torch.randn(2, 64, 128, generator=torch.Generator().manual_seed(2))
    module = _TwoGraphs()
    first = torch.nn.Sequential(module.proj, module.ln)
    with torch.no_grad():
        ref_h = first(x)
        ref_out = module.out(ref_h)
    first_lowered, first_report = _lower(first.half(), x.half())
    h = first_lowered(x.half())
    host = _cosine(h.float(), ref_h)
    assert first_report.defects == [] and float(host.min()) > 0.999, float(host.min())
    assert is_marked(h) == "1" and is_marked(h[:, :32]) == "1", is_marked(h)  # Sequential "1"
    assert is_marked(h.clone()) is None

    second = module.out.half()
    lowered, report = _lower(second, h.clone())
    assert report.defects == [], [str(f) for f in report.defects]
    results = {}
    for label, value in (("marked", h), ("view", h[:]), ("clone", h.clone())):
        with collect() as collector, torch.no_grad():
            out = lowered(value)
        fired = collector.report().defect_ids()
        results[label] = (float(_cosine(out.float(), ref_out).mean()), collector.entries, fired)
    print({k: (round(v[0], 4), v[2]) for k, v in results.items()})
    entries = {id(e) for _, found, _ in results.values() for e in found}
    assert len(entries) == 1, f"the second graph was compiled again: {len(entries)} graphs"
    assert results["marked"][0] < 0.5 and results["view"][0] < 0.5, results
    assert results["clone"][0] > 0.999, results
    # the firing is recorded in the graph's report from the first marked call on
    assert results["marked"][2] == [DEFECT], results


def test_the_mark_is_forgotten_with_the_tensor() -> None:
    first = torch.nn.LayerNorm(128).half()
    x = torch.randn(2, 64, 128).half()
    lowered, _ = _lower(first, x)
    h = lowered(x)
    assert is_marked(h) == "LayerNorm", is_marked(h)  # the compiled module itself
    ptr = h.untyped_storage().data_ptr()
    del h
    from hfadapt.spyre.compile import handoff

    assert ptr not in handoff._marks, "a dead tensor's mark must go with it"


def test_no_layer_norm_output_no_mark() -> None:
    """An RMSNorm (the pre-LN decoders' norm) or a LayerNorm without affine part ends on no
    broadcast against a 1-D weight/bias: nothing marked."""
    x = torch.randn(2, 64, 128).half()
    for module in (torch.nn.RMSNorm(128).half(), torch.nn.LayerNorm(128, elementwise_affine=False)):
        lowered, _ = _lower(module.half(), x)
        h = lowered(x)
        assert is_marked(h) is None, f"{type(module).__name__} output marked"


# -- the judge: verification_failed, localized, evidence, adapter ------------------------------


@pytest.mark.slow
def test_diagnose_localizes_the_handoff_and_the_adapter_fixes_it(
    tmp_path: Path,
) -> None:
    import hfadapt.judge.diagnose as diagnose_module
    from hfadapt.cli import diagnose as cli_diagnose

    folder = tiny_bert_folder(tmp_path / "bert-post-ln")
    options = {"mode": "structural", "execution": "compile", "record": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = diagnose_module.diagnose(str(folder), without_adapters=[ADAPTER], **options)
        adapted = diagnose_module.diagnose(str(folder), **options)

    m = stock.metrics
    d = stock.divergence
    print(
        f"stock: {stock.verdict}, min token cosine {m.min_token_cosine if m else None}; "
        f"divergence {d.summary() if d else stock.evidence.get('localize_error')}"
    )
    assert stock.verdict == "verification_failed", f"{stock.verdict}: {stock.reason}"
    assert m is not None and m.min_token_cosine < 0.5, m
    evidence = stock.evidence["defects"]
    assert [e["defect_id"] for e in evidence] == [DEFECT], evidence
    assert "hf_common.py" in evidence[0]["source"]
    firing = evidence[0]["firings"][0]
    assert firing["module"] == "encoder.layer.0.attention.self.query", firing
    assert firing["op"] == "aten::addmm" and "embeddings" in evidence[0]["effect"], evidence
    assert d is not None, stock.evidence.get("localize_error")
    # the first module that reads the misread value: layer 0's query projection
    assert d.module == "encoder.layer.0.attention.self.query", d.summary()
    assert d.cosine is not None and d.cosine < 0.5 and (d.input_cosine or 0) > 0.99, d.summary()
    assert {x["defect_id"] for x in d.defects} == {DEFECT}, d.defects
    assert DEFECT in stock.next_step, stock.next_step

    with cli_diagnose.console.capture() as captured:
        cli_diagnose.render(stock)
    text = " ".join(captured.get().split())
    assert re.search(r"device defect \[defect\.post_ln_handoff\] fired in", text), text

    am = adapted.metrics
    assert adapted.verdict == "pass", f"{adapted.verdict}: {adapted.reason}"
    assert ADAPTER in adapted.adapters, adapted.adapters
    assert am is not None and am.min_token_cosine > 0.999, am
    assert "defects" not in adapted.evidence, adapted.evidence.get("defects")
    print(f"stock min token cosine {m.min_token_cosine:.4f}, adapted {am.min_token_cosine:.6f}")


@pytest.mark.slow
def test_the_adapter_is_proven_through_the_compile_backend(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # verify_adapter with three seeds: the proof test_adapters.py runs, run once for both
    result = bundled_proof(ADAPTER, tmp_path_factory)
    dev = result.device
    print(f"{ADAPTER}: equivalence {result.equivalence_text}; device {result.device_text}")
    assert result.ok, result.failure
    assert dev is not None and DEFECT in dev.stock_rules and DEFECT not in dev.adapted_rules
    assert dev.stock_error is not None and dev.adapted_error is not None
    assert dev.adapted_error < 0.05 < dev.stock_error, (dev.stock_error, dev.adapted_error)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["gte", "jina_embeddings_v3"])
def test_post_ln_layers_split_by_the_host_rope_are_cloned(model_type: str, tmp_path: Path) -> None:
    """gte (Alibaba new) and jina-embeddings-v3 are post-LN and the host rope splits each layer
    into frames of its own: a layer's LayerNorm output crosses into the next layer's q_proj.
    Without the adapter the defect fires in a layer's projection (found by the bundled 10,000
    sweep: 115 such models failed); with it nothing fires and the model passes."""
    import hfadapt.judge.diagnose as diagnose_module
    from hfadapt.adapters.examples import tiny_model

    model, _, _ = tiny_model(model_type, 0, initializer_range=0.2)
    model.config.save_pretrained(tmp_path)
    options = {"mode": "structural", "execution": "compile", "record": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = diagnose_module.diagnose(
            str(tmp_path), localize_failures=False, without_adapters=[ADAPTER], **options
        )
        adapted = diagnose_module.diagnose(str(tmp_path), **options)
    fired = [f["module"] for e in stock.evidence.get("defects", []) for f in e["firings"]]
    print(
        f"{model_type}: stock {stock.verdict} ({stock.reason}), handoffs into {fired}; "
        f"adapted {adapted.verdict} ({adapted.reason})"
    )
    assert any(m.endswith("q_proj") for m in fired), fired
    assert adapted.verdict == "pass", adapted.reason
    assert ADAPTER in adapted.adapters and "defects" not in adapted.evidence, adapted.evidence


@functools.lru_cache(maxsize=1)
def _compiled_cold_then_warm() -> tuple[list[int], list[list[str]]]:
    """A 2-layer ModernBERT compiled three times with the RoPE attention adapter: with nothing
    built for it in this process (its rotate_half copies, and the host-built rotation constant
    the rewrite multiplies by), with the same registry warm, and once more; each compile's
    graph count and the defects fired."""
    from support.tiny_models import TINY, tiny_inputs
    from transformers import AutoConfig, AutoModel

    from hfadapt.adapters.registry import discover
    from hfadapt.spyre import host_constants

    torch.manual_seed(0)
    fields = {"num_hidden_layers": 2, "vocab_size": 1000, "use_cache": False, **TINY["modernbert"]}
    config = AutoConfig.for_model("modernbert", **fields)
    model = AutoModel.from_config(config).eval().half()
    inputs = tiny_inputs(config.vocab_size)
    host_constants.forget()  # cold, whatever ran before in this process
    registry = discover()
    graphs, fired = [], []
    for _ in range(3):
        torch._dynamo.reset()
        with warnings.catch_warnings(), registry.apply(model):
            warnings.simplefilter("ignore")
            _, report = lower(model, inputs)
        graphs.append(report.graph_count)
        fired.append(sorted({f"{f.defect_id} in {f.module}" for f in report.defects}))
    print(f"graphs per compile (cold, warm, warm): {graphs}; defects: {fired}")
    return graphs, fired


@pytest.mark.slow
def test_graph_boundaries_do_not_depend_on_which_copies_were_built_before() -> None:
    """The RoPE attention adapter runs stock code with a rebound rotate_half. Looked up while
    Dynamo traced the forward, a copy not built yet (or one the trace did not find) called the
    cache's disabled builder: a graph break between ModernBERT's attention norm and its Wqkv,
    and defect.post_ln_handoff fired, depending on which tests had run before. The copy is now
    built when the adapter is applied: a fresh registry fires nothing, cold or warm, and warm
    compiles give the same graphs."""
    graphs, fired = _compiled_cold_then_warm()
    assert graphs[1] == graphs[2], graphs
    assert fired == [[], [], []], fired


# Found by the canary on 2026-12-06, once the suite's order put this check in a process where
# nothing had built the rotation constant yet (the same on torch 2.13 and 2.14.1): the first
# compile built it inside the trace, through host_constant's disabled builder, so the graph
# broke at each build (10 graphs cold, 5 warm; no defect fired for ModernBERT), and a verdict's
# graphs depended on what the worker had judged before. lower() now traces again when a host
# constant was built during its trace (hfadapt.spyre.host_constants).
@pytest.mark.slow
def test_a_cold_host_constant_cache_compiles_to_the_warm_graphs() -> None:
    graphs, _ = _compiled_cold_then_warm()
    assert graphs[0] == graphs[1], graphs
