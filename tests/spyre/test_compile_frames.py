"""Which frames Dynamo compiles for an adapted model: the adapter glue (registry dispatch and
pre-hooks, the host-mask adapter, transformers' forward decorators) is inlined where it is
traced and never compiled as a frame of its own, while the graphs and outputs stay the same."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch._dynamo.convert_frame as convert_frame

from hfadapt.adapters.examples import tiny_model
from hfadapt.adapters.registry import default_registry
from hfadapt.spyre.compile.backend import lower
from hfadapt.spyre.frames import compile_running, inline_only

GLUE = {"dispatch", "hook", "masks_on_host", "mask_helper_on_host", "token_type_ids_host"}


@pytest.fixture
def compiled_frames(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The code names of the frames Dynamo compiles while the test runs."""
    names: list[str] = []
    compile_ = convert_frame._compile

    def record(code: Any, *args: Any, **kwargs: Any) -> Any:
        names.append(code.co_name)
        return compile_(code, *args, **kwargs)

    monkeypatch.setattr(convert_frame, "_compile", record)
    return names


def test_adapter_glue_is_never_a_frame_of_its_own(compiled_frames: list[str]) -> None:
    torch._dynamo.reset()
    model, ids, mask = tiny_model("bert", 0)
    model = model.half()
    handle = default_registry().apply(model)
    assert {"attention-mask-host-helper", "token-type-ids-host"} <= set(handle.names)
    lowered, report = lower(model, {"input_ids": ids, "attention_mask": mask})
    glue = sorted(set(compiled_frames) & GLUE)
    assert not glue, f"glue compiled as frames: {glue} (all frames: {compiled_frames})"
    assert report.graph_count >= 1, f"graphs: {report.graph_count}"
    # the adapters ran (the host mask builder and ids): the device output equals the CPU one
    handle.remove()
    with torch.no_grad():
        expected = model.float()(input_ids=ids, attention_mask=mask).last_hidden_state
    got = lowered.audit_output.last_hidden_state.float()
    rows = mask.bool()
    cos = torch.nn.functional.cosine_similarity(got[rows], expected[rows], dim=-1).min()
    assert float(cos) > 0.999, f"min per-token cosine {float(cos):.6f}"


def test_compile_running_inside_an_inline_only_frame_after_a_graph_break() -> None:
    torch._dynamo.reset()
    seen: list[bool] = []

    @torch.compiler.disable
    def host_step(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    @inline_only
    def glue(x: torch.Tensor) -> torch.Tensor:
        seen.append(compile_running())
        return x * 2

    def model(x: torch.Tensor) -> torch.Tensor:
        y = host_step(x)  # graph break: glue is then entered as a frame, and skipped
        return glue(y)

    out = torch.compile(model, backend="eager")(torch.ones(2))
    glue(torch.ones(2))  # plain eager
    assert out.tolist() == [4.0, 4.0]
    assert seen == [True, False], f"compile_running() in the compiled and eager call: {seen}"
