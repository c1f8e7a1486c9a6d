"""The parent's end-to-end check: it rebuilds the stock model from the case's trusted builder
and judges the outputs the sandbox handed back as safetensors, so a sandbox that reports a
pass for outputs that do not match stock is overruled with the measured cosines."""

from __future__ import annotations

import torch
from safetensors.torch import save

from hfadapt.agent import end_to_end
from hfadapt.agent.end_to_end import CPU_COSINE_MIN, DEVICE_COSINE_MIN, main_tensor

SPEC = {"builder": "hfadapt.agent.evalcases:gelu_model"}


def stock_tensor() -> torch.Tensor:
    run = end_to_end.stock_run(SPEC)
    assert run is not None
    return main_tensor(run[0])


def test_outputs_that_match_stock_pass_and_leave_the_random_state_alone() -> None:
    state = torch.random.get_rng_state()
    ref = stock_tensor()
    assert torch.equal(state, torch.random.get_rng_state()), "the parent's RNG was reseeded"
    device = ref.half().float()  # what fp16 rounding on the device costs
    status, summary, numbers = end_to_end.judge(SPEC, save(end_to_end.pack(ref, device)))
    assert status == "pass", (summary, numbers)
    assert numbers["cpu_vs_stock_min_token_cosine"] > 0.999999, numbers
    assert numbers["device_vs_stock_min_token_cosine"] >= DEVICE_COSINE_MIN, numbers


def test_forged_outputs_fail_with_their_numbers() -> None:
    ref = stock_tensor()
    # The CPU output is right; the "device" one is another tensor (a sandbox claiming a pass).
    forged = torch.randn(ref.shape, generator=torch.Generator().manual_seed(7))
    status, summary, numbers = end_to_end.judge(SPEC, save(end_to_end.pack(ref, forged)))
    dev = numbers["device_vs_stock_min_token_cosine"]
    assert status == "fail" and dev < DEVICE_COSINE_MIN, (status, summary, numbers)
    assert "device with the draft vs stock" in summary, summary
    wrong_cpu = ref.clone()
    wrong_cpu[0, 3] = -wrong_cpu[0, 3]  # one token flipped
    status, summary, numbers = end_to_end.judge(SPEC, save(end_to_end.pack(wrong_cpu, ref)))
    cpu = numbers["cpu_vs_stock_min_token_cosine"]
    assert status == "fail" and cpu < CPU_COSINE_MIN, (status, summary, numbers)


def test_malformed_missing_and_hub_cases() -> None:
    status, summary, _ = end_to_end.judge(SPEC, b"not safetensors")
    assert status == "fail" and "do not read as safetensors" in summary, summary
    only_cpu = save({end_to_end.CPU: stock_tensor()})
    status, summary, _ = end_to_end.judge(SPEC, only_cpu)
    assert status == "fail" and "lack" in summary, summary
    status, summary, _ = end_to_end.judge({"ref": "org/model"}, only_cpu)
    assert status == "skip" and "Hub model" in summary, summary
