"""torch.compile(backend="spyre"): what lowers, what is refused (every violation at once, with
the test's own source lines), host fallbacks, DL16 numerics and the reports."""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hfadapt.errors import SpyreLoweringError
from hfadapt.spyre.numerics import dl16
from hfadapt.spyre.numerics.dl16 import DEFAULT_FORMAT, round_dl16, round_dl16_
from hfadapt.spyre.numerics.dl16_native import available
from hfadapt.spyre.numerics.kernels import chunked_matmul
from hfadapt.spyre.rules.profile import load_profile
from hfadapt.spyre.rules.tracking import SpyreFallbackWarning

pytestmark = pytest.mark.usefixtures("spyre_backend")

DL16_ULP = 2.0**-9  # relative spacing of DL16 values (9 mantissa bits)


def r(x: torch.Tensor) -> torch.Tensor:
    """Round to DL16 (float32 in, float32 out): what the device holds."""
    return round_dl16(x.float())


def fp16(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).half()


def line_of(fn: object, marker: str) -> int:
    """Line number of the source line of ``fn`` that holds ``marker``."""
    lines, start = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    for offset, text in enumerate(lines):
        if marker in text:
            return start + offset
    raise AssertionError(f"{marker!r} not in {fn}")


class Square(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.pow(x * 2, 2) + 1


class Cube(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.pow(x, 3.0)


class ThreeViolations(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.pow(x, 3.0)  # <pow3>
        b = x[:, 16:]  # <slice16>
        c = torch.erf(x)  # <erf>
        return a[:, :48] + b + c[:, :48]


def test_pow_square_lowers_and_runs(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    x = fp16(8, 64)
    out = torch.compile(Square(), backend="spyre")(x)
    expected = r(r(r(r(x.float()) * 2) ** 2) + 1)
    report = spyre_backend.last_report()
    assert out.dtype == torch.float16
    diff = (out.float() - expected).abs().max().item()
    assert diff == 0.0, f"max |compiled - per-node DL16 reference| = {diff}"
    assert report.ok and report.graph_count == 1, report.summary()
    assert report.ops_seen["aten::pow.Tensor_Scalar"] == 1, dict(report.ops_seen)


def test_pow_cube_is_refused_with_the_upstream_message() -> None:
    from torch._inductor.exc import InductorError

    with pytest.raises(SpyreLoweringError) as info:
        torch.compile(Cube(), backend="spyre")(fp16(8, 64))
    message = str(info.value)
    assert message.startswith(
        "InductorError: Unsupported: Spyre backend does not support: pow with exponent 3.0"
    ), message
    assert isinstance(info.value, InductorError)  # what torch-spyre raises, unwrapped by Dynamo
    [v] = info.value.report.violations
    assert (v.rule_id, v.op, v.dtypes, v.shapes) == (
        "op.pow.square",
        "aten::pow.Tensor_Scalar",
        ("float16",),
        ((8, 64),),
    )


def test_tril_and_cumsum_fall_back_to_the_host_and_are_counted(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    class HostOps(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tril(x) + torch.cumsum(x, dim=0)

    x = fp16(64, 64, scale=0.1)
    with pytest.warns(SpyreFallbackWarning) as warned:
        out = torch.compile(HostOps(), backend="spyre")(x)
    messages = sorted(str(w.message) for w in warned if w.category is SpyreFallbackWarning)
    assert messages == ["aten::cumsum is falling back to cpu", "aten::tril is falling back to cpu"]
    report = spyre_backend.last_report()
    assert report.ok, report.summary()
    assert report.fallbacks == Counter({"aten::tril": 1, "aten::cumsum": 1}), report.fallbacks
    # host ops run in fp16 on the host; their results are rounded on the way back
    held = r(x.float())
    tril = r(torch.tril(held).half().float())
    cumsum = r(torch.cumsum(held.half(), dim=0).float())
    diff = (out.float() - r(tril + cumsum)).abs().max().item()
    assert diff == 0.0, f"max |compiled - host-fallback reference| = {diff}"


def test_every_violation_is_reported_at_once_with_its_source_line() -> None:
    with pytest.raises(SpyreLoweringError) as info:
        torch.compile(ThreeViolations(), backend="spyre")(fp16(8, 64))
    report = info.value.report
    found = {v.rule_id: v for v in report.violations}
    assert sorted(found) == ["layout.stick_slice", "op.pow.square", "op.unsupported"], [
        str(v) for v in report.violations
    ]
    expected = {
        "op.pow.square": ("<pow3>", "aten::pow.Tensor_Scalar"),
        "layout.stick_slice": ("<slice16>", "aten::slice.Tensor"),
        "op.unsupported": ("<erf>", "aten::erf"),
    }
    for rule, (marker, op) in expected.items():
        v = found[rule]
        assert v.op == op, v
        assert v.location is not None and v.location.file == __file__, v.location
        assert v.location.line == line_of(ThreeViolations.forward, marker), v.location
        assert v.location.function == "forward"
        assert marker in v.location.code, v.location.code
        assert v.dtypes[0] == "float16" and v.shapes[0] == (8, 64), (v.dtypes, v.shapes)
    # the message lists all three, one line each, with the call site
    message = str(info.value)
    for rule in expected:
        assert f"[{rule}]" in message, message
    assert "stick (last) dimension at offset 16" in message


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.up(x))
        return torch.softmax(self.down(h), dim=-1) * 0.1


def _reference(model: Mlp, x: torch.Tensor, rounded: bool) -> torch.Tensor:
    """The Mlp computed node by node in fp32, each result rounded to DL16 when ``rounded``
    (the device: inputs, weights and the 0.1 constant are DL16 values too; its linears
    accumulate in pieces of the profile's chunk length whose partials are truncated to 9 bits,
    numerics.matmul_chunk_truncate)."""
    q = r if rounded else (lambda t: t.float())

    def linear(a: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if not rounded:
            return F.linear(a, w, b)
        chunk = int(load_profile().numerics["matmul_chunks"]["chunk_elements"])
        return chunked_matmul(a, w.t(), chunk, mantissa_bits=9).add_(b)

    h = q(linear(q(x), q(model.up.weight), q(model.up.bias)))
    h = q(F.gelu(h))
    o = q(linear(h, q(model.down.weight), q(model.down.bias)))
    s = q(torch.softmax(o, dim=-1))
    return q(s * q(torch.tensor(0.1)))


def test_numerics_are_fp32_rounded_to_dl16_after_every_node() -> None:
    model = Mlp().half()
    x = fp16(16, 64, seed=1)
    with torch.no_grad():
        out = torch.compile(model, backend="spyre")(x).float()
        expected = _reference(model, x, rounded=True)
        plain = _reference(model, x, rounded=False)
    # Tolerance: one DL16 ulp on at most 0.1% of elements (fp32 summation order may differ);
    # measured: bit-exact.
    rel = ((out - expected).abs() / expected.abs().clamp_min(1e-30)).max().item()
    exact = (out == expected).float().mean().item()
    assert rel <= DL16_ULP and exact >= 0.999, f"max rel diff {rel:.3g}, exact {exact:.4%}"
    # ... and the device differs measurably from plain fp32 (DL16 keeps 10 significant bits)
    drift = ((out - plain).abs() / plain.abs()).mean().item()
    assert 1e-4 < drift < 1e-2, f"mean relative difference from fp32: {drift:.3g}"


def test_scalars_are_dl16_constants_and_there_is_no_minus_inf() -> None:
    class Masked(nn.Module):
        def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
            scores = torch.where(keep, x * 1025, float("-inf"))
            return torch.softmax(scores, dim=-1)

    x = torch.full((2, 64), 1.0 / 1024, dtype=torch.float16)
    keep = torch.ones(2, 64, dtype=torch.bool)
    keep[1] = False  # a fully masked row
    with torch.no_grad():
        out = torch.compile(Masked(), backend="spyre")(x, keep)
        cpu = Masked()(x, keep)
    # 1025 is no DL16 value (ulp 2 at 1024): the device multiplies by 1024 -> uniform rows
    assert torch.isnan(cpu[1]).all(), cpu[1]  # CPU: softmax over -inf is NaN
    got = out.float()
    # the host -inf constant lands on -3.35e7 (0xEFFF): the fully masked row is uniform
    assert torch.equal(got, torch.full_like(got, 1 / 64)), got


def test_fp32_islands_stay_ieee_and_casts_back_round() -> None:
    class Island(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.float() * 3.0001  # fp32 on the device: IEEE, the scalar unrounded
            return y.to(torch.float16) + 1

    x = fp16(8, 64, seed=3)
    with torch.no_grad():
        out = torch.compile(Island(), backend="spyre")(x).float()
    expected = r(r(r(x.float()) * 3.0001) + 1)
    diff = (out - expected).abs().max().item()
    assert diff == 0.0, f"max |compiled - reference| = {diff}"


def test_bf16_models_run_and_return_bf16() -> None:
    model = Mlp().to(torch.bfloat16)
    x = fp16(16, 64, seed=2).to(torch.bfloat16)
    with torch.no_grad():
        out = torch.compile(model, backend="spyre")(x)
        ref = model.float()(x.float())
    err = (out.float() - ref).abs().max().item()
    assert out.dtype == torch.bfloat16
    assert err < 2e-3, f"max |bf16 device - fp32| = {err}"


@pytest.mark.native
def test_native_rounding_kernel_matches_the_torch_path_bit_for_bit() -> None:
    if not available():
        pytest.skip("no C compiler: the torch path is the only one")
    bits = torch.randint(-(2**31), 2**31 - 1, (2_000_000,), dtype=torch.int64).to(torch.int32)
    special = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 3.36e7, 2**-31, 8.5816e9, 8.6e9]
    )
    x = torch.cat([bits.view(torch.float32), special])
    # the default format (overflow reads back as NaN) and one whose overflow is +-inf
    for fmt in (DEFAULT_FORMAT, dl16.DL16Format(overflow_nan=False)):
        for transfer in (False, True):
            torch_path = dl16._round_inplace(x.clone(), fmt, transfer)
            native = round_dl16_(x.clone(), fmt, transfer=transfer)  # the C kernel: available
            same = (native.view(torch.int32) == torch_path.view(torch.int32)) | (
                native.isnan() & torch_path.isnan()
            )
            assert bool(same.all()), (
                f"{fmt}, transfer={transfer}: {int((~same).sum())} of {x.numel()} values differ"
            )


def test_the_c_kernels_are_a_source_file_of_the_package() -> None:
    from pathlib import Path

    from hfadapt.spyre.numerics import dl16_native

    package = Path(dl16_native.__file__).parent
    shipped = (package / dl16_native.SOURCE_FILE).read_text(encoding="utf-8")
    assert dl16_native.source() == shipped
    exported = [f"hfadapt_{n}(" for n in ("round_dl16", "sum_truncated", "sum_truncated_round")]
    assert all(name in shipped for name in exported), [n for n in exported if n not in shipped]
    hfadapt_dir = package.parents[1]
    in_python = [p.name for p in hfadapt_dir.rglob("*.py") if "#include <" in p.read_text()]
    assert in_python == [], f"C source held in a Python string: {in_python}"


FAILED_BUILD = """
import json, torch
from hfadapt.spyre.numerics import dl16, dl16_native, kernels
loaders = [n for n in dir(dl16_native) if n.startswith("load")]
found = {n: getattr(dl16_native, n)() is not None for n in loaders}
x = torch.randn(64, 300)
rounded = dl16.round_dl16_(x.clone())
same = torch.equal(rounded, dl16._round_inplace(x.clone(), dl16.DEFAULT_FORMAT))
product = kernels.chunked_matmul(x, torch.randn(300, 8), 256, 9)
print(json.dumps({"found": found, "same": same, "finite": bool(product.isfinite().all())}))
"""


def test_a_failed_kernel_build_leaves_every_op_on_the_torch_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A compiler that fails (here ``CC=false``, in a fresh cache folder): every kernel loader
    gives None, nothing raises, and rounding and the chunked product run as torch ops (the one
    guard is the library's loader)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, CC="false", HFADAPT_CACHE_DIR=str(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", FAILED_BUILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    print(seen)
    assert len(seen["found"]) >= 5 and not any(seen["found"].values()), seen["found"]
    assert seen["same"] and seen["finite"], seen
    assert not list(tmp_path.glob("dl16-*.so")), list(tmp_path.iterdir())


def test_report_survives_lowering_and_counts_graphs(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    class TwoGraphs(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(x)
            torch._dynamo.graph_break()
            return y + torch.tril(x)

    compiled = torch.compile(TwoGraphs(), backend="spyre")
    x = fp16(64, 64)
    for call in range(2):  # compiled, then cached: the report covers the same two graphs
        compiled(x)
        report = spyre_backend.last_report()
        assert report.ok and report.graph_count == 2, (call, report.summary())
        assert report.fallbacks == Counter({"aten::tril": 1}), (call, report.fallbacks)


def test_profile_option_selects_rules(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    table = nn.Embedding(100, 64).half()
    ids = torch.randint(0, 100, (4, 64))
    torch.compile(table, backend="spyre")(ids)
    assert spyre_backend.last_report().fallbacks["aten::embedding"] == 1
    torch._dynamo.reset()
    torch.compile(table, backend="spyre", options={"profile": "spyre-2026.10"})(ids)
    report = spyre_backend.last_report()
    assert (report.profile_name, dict(report.fallbacks)) == ("spyre-2026.10", {})


def test_lower_returns_the_report_and_refuses_to_run_a_model_that_does_not_lower(
    spyre_backend,  # type: ignore[no-untyped-def]
) -> None:
    lowered, report = spyre_backend.lower(Square(), (fp16(8, 64),))
    assert report.ok and report.graph_count == 1, report.summary()
    assert lowered.report is report and lowered(fp16(8, 64)).dtype == torch.float16

    lowered, report = spyre_backend.lower(ThreeViolations(), (fp16(8, 64),))
    assert len(report.violations) == 3, report.summary()
    with pytest.raises(SpyreLoweringError, match=r"^InductorError: Unsupported: "):
        lowered(fp16(8, 64))


def test_an_audit_does_not_tokenize_sources_for_a_log_that_is_off(spyre_backend) -> None:  # type: ignore[no-untyped-def]
    """Dynamo names the function around every traced call for its trace_call debug log by
    tokenizing the whole source file (0.38 s for torch/nn/functional.py); lower() skips that
    while the log is off, and keeps it when the log is on."""
    from torch._dynamo import funcname_cache, symbolic_convert

    stock = symbolic_convert.get_funcname
    funcname_cache.clearcache()
    _, report = spyre_backend.lower(Square(), (fp16(8, 64),))  # traced calls in this file
    assert report.ok and report.graph_count == 1, report.summary()
    print(f"log off: files tokenized {sorted(funcname_cache.cache)}")
    assert __file__ not in funcname_cache.cache, sorted(funcname_cache.cache)
    assert symbolic_convert.get_funcname is stock, "the stock function was not put back"

    torch._dynamo.reset()
    torch._logging.set_logs(trace_call=True)
    try:
        spyre_backend.lower(Square(), (fp16(8, 64),))
    finally:
        torch._logging.set_logs()
    print(f"log on: files tokenized {sorted(funcname_cache.cache)}")
    assert __file__ in funcname_cache.cache, sorted(funcname_cache.cache)


def test_importing_hfadapt_registers_no_backend() -> None:
    code = (
        "import hfadapt, hfadapt.spyre, hfadapt.spyre.compile.backend as b\n"
        "from torch._dynamo.backends.registry import _COMPILER_FNS\n"
        "before = 'spyre' in _COMPILER_FNS\n"
        "b.register(); b.register()\n"
        "print(before, 'spyre' in _COMPILER_FNS)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr


@pytest.mark.parametrize("case", ["additive", "bool", "causal", "gqa"])
def test_sdpa_math_decomposition_is_sdpa(case: str) -> None:
    """The decomposition the backend captures SDPA as computes SDPA (float64, 1e-12)."""
    from hfadapt.spyre.decompositions import sdpa_math

    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 64, 64, generator=g, dtype=torch.float64)
    kv_heads = 2 if case == "gqa" else 4
    k, v = (torch.randn(2, kv_heads, 64, 64, generator=g, dtype=torch.float64) for _ in "kv")
    kwargs: dict[str, object] = {
        "additive": {"attn_mask": torch.randn(2, 1, 64, 64, generator=g, dtype=torch.float64)},
        "bool": {"attn_mask": torch.rand(2, 1, 64, 64, generator=g) > 0.3},
        "causal": {"is_causal": True},
        "gqa": {"enable_gqa": True},
    }[case]
    ours = sdpa_math(q, k, v, **kwargs)  # type: ignore[arg-type]
    theirs = F.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]
    err = (ours - theirs).abs().max().item()
    assert err < 1e-12, f"{case}: max |decomposition - SDPA| = {err}"


def test_a_plain_copy_of_an_intermediate_is_handed_on_not_made(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A clone of a contiguous intermediate (eval-mode dropout's) costs the program nothing and
    changes no value; a copy of an input and a returned copy are still made."""
    from hfadapt.spyre.compile import backend

    programs: list[object] = []
    real = backend.build_executable

    def capture(*args, **kwargs):  # type: ignore[no-untyped-def]
        built = real(*args, **kwargs)
        programs.append(built[0])
        return built

    monkeypatch.setattr(backend, "build_executable", capture)

    class Copies(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            y = x * 3
            z = y.view(-1).clone().view(4, 64) + x  # a copy of an intermediate: handed on
            # a copy of the input, a returned copy, a copy of a view of the input
            return z, x.clone(), (y * 2).clone(), x.view(-1).clone().view(4, 64)

    x = fp16(4, 64, seed=5)
    with torch.no_grad():
        z, copy_of_x, doubled, copy_of_view = torch.compile(Copies(), backend="spyre")(x)
    code = programs[-1].code  # type: ignore[attr-defined]
    clones = code.count("aten.clone")
    assert clones == 3, f"{clones} clones in the program:\n{code}"
    assert copy_of_view.data_ptr() != x.data_ptr()
    held = r(x.float())  # the input as the device holds it
    y = r(held * 3)
    assert torch.equal(z.float(), r(y + held)), (z.float() - r(y + held)).abs().max()
    assert torch.equal(copy_of_x.float(), held) and copy_of_x.data_ptr() != x.data_ptr()
    assert torch.equal(doubled.float(), r(y * 2))


def test_a_wider_value_selected_into_a_dl16_result_is_rounded_in_both_modes() -> None:
    """``where`` makes no new value, but an fp32 0-dim fill promoted into its fp16 result is
    not on the DL16 grid: a cast to fp16 rounds it, so the result is rounded, compiled as on
    the eager device (both used to skip the rounding after a value-preserving op in compiled
    mode only, and 0.3 * 3 came out one DL16 step off)."""

    class Select(nn.Module):
        def forward(self, x: torch.Tensor, keep: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
            return torch.where(keep, x, fill) * 3

    x = fp16(4, 8, seed=7)
    keep = torch.arange(32).reshape(4, 8) % 3 == 0
    fill = torch.tensor(0.3)  # fp32, 0-dim: the result is fp16
    held = r(x.float())
    expected = r(torch.where(keep, held, r(fill)) * 3)
    unrounded = r(torch.where(keep, held, fill) * 3)
    assert not torch.equal(expected, unrounded), "the case must tell the two apart"
    with torch.no_grad():
        compiled = torch.compile(Select(), backend="spyre")(x, keep, fill).float()
        eager = Select()(x.to("spyre"), keep.to("spyre"), fill.to("spyre")).cpu().float()
    for name, got in (("compiled", compiled), ("eager", eager)):
        off = int((got != expected).sum())
        assert off == 0, f"{name}: {off} of {got.numel()} values differ, e.g. {got[~keep][:3]}"
