"""jina-embeddings-v5-text-nano judged as users run it, without its code: its config (the
published one, as github.com/oaustegard/jina-v5-nano-mirror holds it byte-identical) translates
to native EuroBERT with the snapshot's parameter count, last-token pooling + normalize and four
PEFT task adapters; a Qwen3-based v5 config (text-small) is refused naming why; full mode reads
the PEFT adapter folders (``adapters/<task>/``) and merging a task equals PEFT's low-rank path;
a structural run draws stand-ins on the adapters' target Linears only and passes every task;
online, the adapter folders come from the Hub with the weights and judge each task exactly as the
folder does, and an adapter file the Hub lacks (404) is the verdict's reason. A tiny nano-shaped
model built here, served by a loopback Hub: no remote code."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from support.families import bundled_family, diagnose_tiny

from hfadapt.errors import WeightsError
from hfadapt.hub.snapshot import read_snapshot
from hfadapt.loading import lora as task_lora
from hfadapt.loading import structural, translate
from hfadapt.loading.load import LoadedModel
from hfadapt.loading.signature import config_from_dict
from hfadapt.loading.task_adapter_files import PEFT_FILES, peft_adapter_files

FAMILY = "jina_embeddings_v5_nano"
TASKS = ["retrieval", "text-matching", "clustering", "classification"]
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# special ids inside the tiny vocabulary (the published ones are 128000-128002)
TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 1000,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "mask_token_id": 3}  # fmt: skip


def _published() -> dict[str, Any]:
    return copy.deepcopy(bundled_family(FAMILY).variants[0]["config"])


def _raw(**change: Any) -> dict[str, Any]:
    return {**_published(), **TINY, **change}


def _row(model_id: str) -> Any:
    return next(r for r in read_snapshot() if r.model_id == model_id)


def _diagnose(ref: str | LoadedModel, **kwargs: Any) -> Any:
    return diagnose_tiny(ref, _raw(), **kwargs)


def test_the_published_nano_config_is_native_eurobert_with_four_task_adapters() -> None:
    got = translate.translate(_published())
    assert isinstance(got, translate.Translation), got
    assert (got.family, got.native_type) == (FAMILY, "eurobert"), (got.family, got.native_type)
    assert got.config["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}, got.config
    assert "task_names" not in got.config and "pretraining_tp" not in got.config, got.config
    spec = got.evidence()["task_lora"]
    assert spec["tasks"] == TASKS and spec["rank"] == 32 and spec["scaling"] == 1.0, spec
    assert got.evidence()["pooling"]["mode"] == "lasttoken", got.evidence()
    from transformers import AutoModel

    with torch.device("meta"):
        native = AutoModel.from_config(config_from_dict(got.config))
    count = sum(p.numel() for p in native.parameters())
    row = _row("jinaai/jina-embeddings-v5-text-nano")
    print(f"native {type(native).__name__}: {count} parameters; snapshot row {row.parameters}")
    assert row.is_custom_code and count == row.parameters == 211_766_016, (count, row.parameters)
    by_row = translate.translate_row(row.model_id, row.config_class, row.model_type,
                                     row.parameters, architectures=row.architectures)  # fmt: skip
    assert isinstance(by_row, translate.Translation), by_row
    assert by_row.config == got.config and by_row.task_lora == got.task_lora, by_row.source


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"use_sliding_window": False}, "use_sliding_window"),  # a Qwen3Config (text-small)
        ({"mask_token_id": None}, "mask_token_id"),  # dropped below: not EuroBERT's config
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"task_names": "retrieval"}, "task_names"),
        ({"auto_map": {"AutoModel": "modeling_other.OtherModel"}}, "auto_map.AutoModel"),
    ],
)
def test_what_is_not_the_nanos_computation_keeps_custom_code(
    change: dict[str, Any], field: str
) -> None:
    raw = {**_published(), **change}
    raw = {k: v for k, v in raw.items() if v is not None or k not in change}
    got = translate.translate(raw)
    assert isinstance(got, translate.Refusal), f"{change} was translated"
    assert got.field == field, f"refusal names {got.field!r}: {got.reason}"


def test_the_qwen3_based_small_row_stays_custom_code_naming_why() -> None:
    row = _row("jinaai/jina-embeddings-v5-text-small")
    got = translate.translate_row(row.model_id, row.config_class, row.model_type,
                                  row.parameters, architectures=row.architectures)  # fmt: skip
    print(got)
    assert isinstance(got, translate.Refusal) and got.field == "parameters", got
    assert "Qwen3" in got.reason and "citable" in got.reason, got.reason


def _peft_hooks(model: torch.nn.Module, adapters: dict[str, tuple[torch.Tensor, torch.Tensor]],
                scaling: float) -> None:  # fmt: skip
    """PEFT's LoRA forward written out beside the unmerged weight: a target Linear adds
    scaling * B(A(x)) (adapters: native weight -> (A [r, in], B [out, r]))."""
    for name, (a, b) in adapters.items():
        module = model.get_submodule(name.removesuffix(".weight"))
        a_t, b_t = a.to(torch.float64), b.to(torch.float64)
        module.register_forward_hook(
            lambda m, args, out, a_t=a_t, b_t=b_t: out + scaling * (args[0] @ a_t.T) @ b_t.T
        )


def _last_hidden(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state


def test_structural_stand_ins_sit_on_the_target_linears_and_merge_like_peft() -> None:
    loaded = structural.build("tiny/jina-v5-nano", config=_raw())
    assert loaded.pooling.mode == "lasttoken" and loaded.pooling.normalize, loaded.pooling
    found, note = task_lora.task_lora_of(loaded)
    assert found is not None and note is None, note
    names = sorted(found.factors)
    print(f"stand-ins: {found.origin}; {len(names)} weights")
    assert len(names) == len(TARGETS) * TINY["num_hidden_layers"], names
    assert all(n.rsplit(".", 2)[-2] in TARGETS for n in names), names
    base = loaded.model.double()
    ids = torch.randint(4, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    plain = _last_hidden(base, ids)
    for index, task in enumerate(TASKS):
        hooked = copy.deepcopy(base)
        _peft_hooks(hooked, {n: (f.right[index], f.left[index]) for n, f in found.factors.items()},
                    found.spec.scaling)  # fmt: skip
        merged = _last_hidden(found.merged(base, task), ids)
        diff = float((merged - _last_hidden(hooked, ids)).abs().max())
        moved = float((1 - torch.cosine_similarity(merged, plain, -1)).max())
        print(f"{task}: merged vs PEFT path max |diff| {diff:.3g}; 1-cos vs base max {moved:.3f}")
        assert diff < 1e-9, f"{task}: merging differs from PEFT's low-rank path by {diff}"
        assert moved > 0.01, f"{task}: the stand-in adapters barely move the output ({moved})"


def _write_adapters(
    root: Path, native: torch.nn.Module, seed: int, **config: Any
) -> dict[str, Any]:
    """PEFT adapter folders as jina's repository ships them (r 4 here, alpha 8): per task
    adapter_config.json and adapter_model.safetensors, keys base_model.model.<module>.lora_A/B."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    written: dict[str, Any] = {}
    for task in TASKS:
        tensors = {}
        for name, module in native.named_modules():
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS:
                rows, cols = module.weight.shape
                key = f"base_model.model.{name}"
                tensors[key + ".lora_A.weight"] = torch.randn(4, cols, generator=gen) * 0.1
                tensors[key + ".lora_B.weight"] = torch.randn(rows, 4, generator=gen) * 0.1
        folder = root / "adapters" / task
        folder.mkdir(parents=True)
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        cfg = {"peft_type": "LORA", "r": 4, "lora_alpha": 8, "bias": "none", "use_dora": False,
               "use_rslora": False, "fan_in_fan_out": False, "modules_to_save": None,
               "target_modules": list(TARGETS), "task_type": "FEATURE_EXTRACTION", **config}  # fmt: skip
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
        written[task] = tensors
    return written


@pytest.fixture
def nano_folder(tmp_path: Path, minilm_path: Path) -> tuple[Path, dict[str, Any]]:
    """A nano-shaped folder: the remote config, EuroBertModel's weights (``model.``-prefixed as a
    saved EuroBertForMaskedLM names them), a tokenizer, modules.json naming custom_st only."""
    from safetensors.torch import save_file
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    raw = _raw(vocab_size=tokenizer.vocab_size)
    got = translate.translate(raw)
    assert isinstance(got, translate.Translation), got
    torch.manual_seed(2)
    native = AutoModel.from_config(config_from_dict(got.config)).eval()
    state = {"model." + k: v.contiguous() for k, v in native.state_dict().items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "modules.json").write_text(json.dumps(
        [{"idx": 0, "name": "transformer", "path": "", "type": "custom_st.Transformer"}]))  # fmt: skip
    tokenizer.save_pretrained(tmp_path)
    return tmp_path, _write_adapters(tmp_path, native, seed=3)


def test_full_mode_reads_the_peft_folders_and_judges_every_task(
    nano_folder: tuple[Path, dict[str, Any]],
) -> None:
    from hfadapt.loading.load import load

    folder, written = nano_folder
    loaded = load(folder)
    print(loaded.notes)
    assert loaded.pooling.mode == "lasttoken" and loaded.pooling.normalize, loaded.pooling
    assert any("one PEFT folder per task" in n for n in loaded.notes), loaded.notes
    found, note = task_lora.task_lora_of(loaded)
    assert found is not None and note is None, note
    assert found.origin.startswith("PEFT adapters"), found.origin
    assert (found.spec.rank, found.spec.alpha, found.spec.scaling) == (4, 8.0, 2.0), found.spec
    assert len(found.factors) == len(TARGETS) * TINY["num_hidden_layers"], sorted(found.factors)
    key = "base_model.model.layers.1.self_attn.k_proj.lora_"
    k_proj = found.factors["layers.1.self_attn.k_proj.weight"]
    assert torch.equal(k_proj.right[1], written["text-matching"][key + "A.weight"]), "A of task 1"
    assert torch.equal(k_proj.left[3], written["classification"][key + "B.weight"]), "B of task 3"
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    base = copy.deepcopy(loaded.model).double()
    for index, task in enumerate(TASKS):
        hooked = copy.deepcopy(base)
        pairs = {n: (f.right[index], f.left[index]) for n, f in found.factors.items()}
        _peft_hooks(hooked, pairs, 2.0)
        diff = float(
            (_last_hidden(found.merged(base, task), ids) - _last_hidden(hooked, ids)).abs().max()
        )
        assert diff < 1e-9, f"{task}: merged PEFT adapters differ from their path by {diff}"

    diag = _diagnose(loaded)
    tasks = diag.evidence.get("tasks") or []
    print(f"full mode: {diag.verdict}: {diag.reason}")
    assert [t["task"] for t in tasks] == TASKS, tasks
    assert diag.verdict == "pass", (diag.verdict, diag.reason)
    assert diag.evidence["task_lora"]["origin"].startswith("PEFT adapters"), diag.evidence


@pytest.mark.parametrize(
    ("config", "message"),
    [({"use_dora": True}, "use_dora"), ({"use_rslora": True}, "use_rslora"),
     ({"peft_type": "IA3"}, "not a PEFT LORA"), ({"r": 0}, "r=0")],
)  # fmt: skip
def test_an_adapter_that_is_not_a_plain_lora_is_a_weights_error(
    tmp_path: Path, config: dict[str, Any], message: str
) -> None:
    loaded = structural.build("tiny/jina-v5-nano", config=_raw())
    spec = task_lora.LoRASpec.of(loaded.translated_from)
    assert spec is not None
    _write_adapters(tmp_path, loaded.model, seed=4, **config)
    with pytest.raises(WeightsError, match=message):
        task_lora.read_peft_task_lora(tmp_path / "adapters", spec, loaded.model)
    assert task_lora.read_peft_task_lora(tmp_path / "none", spec, loaded.model) is None


def test_a_structural_judge_runs_each_task_with_last_token_pooling() -> None:
    diag = _diagnose("tiny/jina-v5-nano")
    tasks = diag.evidence.get("tasks") or []
    for t in tasks:
        print(f"  {t['task']:15s} {t['verdict']:10s} min cos {t['min_token_cosine']}")
    print(f"{diag.verdict}: {diag.reason}")
    assert diag.verdict == "pass" and [t["task"] for t in tasks] == TASKS, diag.reason
    assert diag.evidence["pooling"].startswith("lasttoken + normalize"), diag.evidence["pooling"]
    assert diag.evidence["translated_from"]["family"] == FAMILY, diag.evidence["translated_from"]


def test_the_adapter_files_an_online_load_fetches_stay_inside_the_adapters_folder() -> None:
    got = translate.translate(_raw())
    assert isinstance(got, translate.Translation), got
    files = peft_adapter_files(got.evidence())
    print(files)
    assert files[:2] == ["adapters/retrieval/adapter_config.json",
                         "adapters/retrieval/adapter_model.safetensors"], files  # fmt: skip
    assert len(files) == 2 * len(TASKS), files
    bad = translate.translate(_raw(task_names=["retrieval", "../../secrets"]))
    assert isinstance(bad, translate.Translation), bad
    with pytest.raises(WeightsError, match=r"'\.\./\.\./secrets' is not a folder name"):
        peft_adapter_files(bad.evidence())


# ---- online: the adapters come from the Hub (a loopback one) with the weights -----------------

NANO_ID = "acme/tiny-jina-v5-nano"


def _serve_nano(
    hub: Any, folder: Path, monkeypatch: pytest.MonkeyPatch, *, leave_out: str = ""
) -> None:
    """``folder`` served as NANO_ID (its files and adapters/**, minus ``leave_out``), with
    huggingface_hub pointed at ``hub`` (its endpoint constants are read at import)."""
    import huggingface_hub.constants as hf_constants
    from support.hub_server import FakeModel

    files = {p.relative_to(folder).as_posix(): p.read_bytes()
             for p in [*folder.glob("*"), *folder.glob("adapters/**/*")] if p.is_file()}  # fmt: skip
    assert "adapters/retrieval/adapter_model.safetensors" in files, sorted(files)
    files.pop(leave_out, None)
    hub.add(FakeModel(NANO_ID, files=files))
    # transformers lists additional_chat_templates/ with the tree API: answer as for none
    hub.script(f"/api/models/{NANO_ID}/tree/", status=200, body="[]", times=1000)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setattr(hf_constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                        hub.url + "/{repo_id}/resolve/{revision}/{filename}")  # fmt: skip


def _judge_eagerly(ref: str | LoadedModel) -> Any:
    from hfadapt.judge.diagnose import diagnose

    return diagnose(ref, mode="full", record=False, localize_failures=False, execution="eager")


def test_an_online_load_fetches_every_task_adapter_and_judges_each_task_with_it(
    fake_hub: Any, nano_folder: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hfadapt.loading.load import load

    folder, _ = nano_folder
    _serve_nano(fake_hub, folder, monkeypatch)
    online = load(NANO_ID)
    sha = fake_hub.models[NANO_ID].sha
    fetched = sorted(r[1].split(f"/resolve/{sha}/")[-1] for r in fake_hub.requests
                     if f"/resolve/{sha}/adapters/" in r[1] and r[3] == 200)  # fmt: skip
    print(f"{online.source} at {online.revision}: adapter files fetched {fetched}")
    wanted = sorted(f"adapters/{t}/{f}" for t in TASKS for f in PEFT_FILES)
    assert (online.source, online.revision) == ("hub", sha), (online.source, online.revision)
    assert sorted(set(fetched)) == wanted and online.absent_on_hub == {}, fetched
    assert any("one PEFT folder per task" in n for n in online.notes), online.notes

    offline = load(folder)
    on, _ = task_lora.task_lora_of(online)
    off, _ = task_lora.task_lora_of(offline)
    assert on is not None and off is not None, "no adapters read"
    assert on.origin == off.origin and on.origin.startswith("PEFT adapters"), on.origin
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    base = _last_hidden(online.model, ids)
    for task in TASKS:
        got = _last_hidden(on.merged(online.model, task), ids)
        same = float((got - _last_hidden(off.merged(offline.model, task), ids)).abs().max())
        moved = float((got - base).abs().max())
        print(f"{task}: online vs folder max |diff| {same:.3g}; vs base weights {moved:.3g}")
        assert same == 0.0, f"{task}: the online adapters differ from the folder's by {same}"
        assert moved > 1e-2, f"{task}: the online run moved off the base weights by {moved} only"

    by_hub, by_folder = _judge_eagerly(NANO_ID), _judge_eagerly(folder)
    hub_tasks = {t["task"]: t["min_token_cosine"] for t in by_hub.evidence.get("tasks") or []}
    folder_tasks = {t["task"]: t["min_token_cosine"] for t in by_folder.evidence.get("tasks") or []}
    print(f"online {by_hub.verdict}: {hub_tasks}\nfolder {by_folder.verdict}: {folder_tasks}")
    assert list(hub_tasks) == TASKS and hub_tasks == folder_tasks, (hub_tasks, folder_tasks)
    assert by_hub.verdict == by_folder.verdict == "pass", (by_hub.reason, by_folder.reason)
    assert by_hub.evidence["task_lora"]["origin"].startswith("PEFT adapters"), by_hub.evidence
    assert "task_lora_note" not in by_hub.evidence, by_hub.evidence["task_lora_note"]


def test_a_task_adapter_the_hub_lacks_is_the_verdicts_reason_not_base_weights(
    fake_hub: Any, nano_folder: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from hfadapt.loading.load import load

    folder, _ = nano_folder
    lost = "adapters/clustering/adapter_model.safetensors"
    _serve_nano(fake_hub, folder, monkeypatch, leave_out=lost)
    loaded = load(NANO_ID)
    print(loaded.absent_on_hub)
    assert list(loaded.absent_on_hub) == [lost], loaded.absent_on_hub
    assert loaded.absent_on_hub[lost].startswith(f"404 at {fake_hub.url}"), loaded.absent_on_hub
    with pytest.raises(WeightsError, match=r"'clustering' not on the Hub: adapters/clustering/"):
        task_lora.task_lora_of(loaded)

    diag = _judge_eagerly(NANO_ID)
    print(f"{diag.verdict}: {diag.reason}")
    assert diag.verdict == "load_failed", (diag.verdict, diag.reason, diag.evidence.get("tasks"))
    assert lost in diag.reason and "404 at http://127.0.0.1" in diag.reason, diag.reason
    assert "\n" not in diag.reason and not diag.evidence.get("tasks"), diag.evidence.get("tasks")

    # offline, the cached snapshot is what there is: the missing file, then no adapters at all
    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    cached = load(NANO_ID)
    assert cached.source == "cache" and cached.absent_on_hub == {}, cached.source
    with pytest.raises(WeightsError, match=r"task 'clustering' has no adapter_model\.safetensors"):
        task_lora.task_lora_of(cached)
    shutil.rmtree(Path(str(cached.path)) / "adapters")
    found, note = task_lora.task_lora_of(load(NANO_ID))
    print(note)
    assert found is None and note is not None and "in the HF cache (offline" in note, note


def test_an_adapter_download_that_fails_is_a_one_line_hub_error(
    fake_hub: Any, nano_folder: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch,
    sleeps: list[float],
) -> None:  # fmt: skip
    from hfadapt.errors import HubResponseError
    from hfadapt.loading.load import load

    folder, _ = nano_folder
    _serve_nano(fake_hub, folder, monkeypatch)
    sha = fake_hub.models[NANO_ID].sha
    failing = f"/{NANO_ID}/resolve/{sha}/adapters/text-matching/adapter_config.json"
    fake_hub.script(failing, status=403, body='{"error": "Forbidden"}', times=1000)
    with pytest.raises(HubResponseError) as caught:
        load(NANO_ID)
    line = caught.value.one_line()
    print(line)
    assert "adapters/text-matching/adapter_config.json of acme/tiny-jina-v5-nano" in line, line
    assert "HTTP 403" in line and "\n" not in str(caught.value), line
    assert sum(sleeps) == 0, f"slept {sleeps} s: a refusal is not retried"
