"""An applied adapter whose own rule still fires in the code it rewrites is reported as without
effect (diagnose, runs.db, ``hfadapt show``, ``hfadapt report``), and the next step names it;
an adapter whose rewrite cannot be built is not applied, with the reason recorded."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.adapters.registry import Registry, discover
from hfadapt.judge.adapter_effect import ineffective_adapters
from hfadapt.spyre.rules.lowering_report import LoweringReport, SourceLocation, Violation

ROPE = "rope-rotate-matmul-nomic-bert"
NOMIC = {  # head size 64: the stock rotate_half slices the stick at 32 (layout.stick_slice)
    "model_type": "nomic_bert",
    "architectures": ["NomicBertModel"],
    "hidden_size": 256,
    "num_attention_heads": 4,
    "intermediate_size": 512,
    "num_hidden_layers": 1,
}


def _violation(rule: str, file: str) -> Violation:
    where = SourceLocation(f"/x/site-packages/{file}", 138, "rotate_half")
    return Violation(rule_id=rule, op="aten::slice.Tensor", message="m", location=where)


def test_only_the_adapters_own_rule_in_its_own_module_counts() -> None:
    reg = discover(paths=[], entry_points=False)
    report = LoweringReport("p", "1", "eager")
    report.add(
        _violation("layout.stick_slice", "transformers/models/nomic_bert/modeling_nomic_bert.py")
    )
    report.add(_violation("layout.stick_slice", "transformers/models/bert/modeling_bert.py"))
    applied = [ROPE, "rope-rotate-matmul-qwen3", "layer-norm-unfused"]
    found = ineffective_adapters(report, applied, reg.adapters, {})
    assert [(f.adapter, f.rule) for f in found] == [(ROPE, "layout.stick_slice")], found
    assert "modeling_nomic_bert.py:138" in found[0].where, found[0]


def _no_op_rope(reg: Registry) -> Registry:
    """The registry with the nomic-bert RoPE rewrite replaced by one that runs stock code:
    what a dependency release that wraps the rewritten helper made of it."""
    real = reg.get(ROPE)

    def stock(self: Any, *args: Any, **kwargs: Any) -> Any:
        return type(self).forward(self, *args, **kwargs)

    broken = dataclasses.replace(real, fn=stock, applies=None)
    return Registry(adapters=[broken if a.name == ROPE else a for a in reg.adapters])


@pytest.mark.slow
def test_a_run_says_which_applied_adapter_had_no_effect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.judge.diagnose import diagnose

    folder = tmp_path / "nomic"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(NOMIC))
    db = tmp_path / "runs.db"
    registry = _no_op_rope(discover(paths=[], entry_points=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = diagnose(
            str(folder),
            mode="structural",
            execution="eager",
            registry=registry,
            db=str(db),
            localize_failures=False,
        )
    broken = d.evidence.get("adapters_ineffective")
    assert d.verdict == "lowering_failed" and ROPE in d.adapters, (d.verdict, d.reason)
    assert broken and broken[0]["adapter"] == ROPE, d.evidence
    assert broken[0]["rule"] == "layout.stick_slice", broken
    assert ROPE in d.next_step and "did not take effect" in d.next_step, d.next_step
    code, out, err = run_cli(["show", str(folder), "--db", str(db)], monkeypatch, capsys)
    assert code == 0, err
    assert f"no effect: {ROPE}: its rule layout.stick_slice still fires" in out, out
    code, out, err = run_cli(["report", "--db", str(db)], monkeypatch, capsys)
    assert code == 0, err
    assert f"adapter without effect: {ROPE} was applied to 1 model" in out, out


def test_an_adapter_whose_rewrite_cannot_be_built_is_not_applied_and_says_why() -> None:
    """The RoPE adapter builds its rewrite when applied: a swap that cannot take effect makes
    ``applies`` fail, so the adapter is left out with the reason (never listed as applied)."""
    import torch
    from transformers import AutoConfig, AutoModel

    from hfadapt.adapters.rebind import rebind

    reg = discover(paths=[], entry_points=False)
    real = reg.get(ROPE)

    def refuses(module: Any, config: Any) -> bool:
        rebind(type(module).forward, no_such_global=torch.cos)  # raises AdapterError
        return True

    registry = Registry(adapters=[dataclasses.replace(real, applies=refuses)])
    cfg = AutoConfig.for_model(**{k: v for k, v in NOMIC.items() if k != "architectures"})
    handle = registry.apply(AutoModel.from_config(cfg))
    assert ROPE not in handle.applied, handle.applied
    errors = [e.error for e in registry.errors]
    assert any("never reads no_such_global" in e for e in errors), errors
