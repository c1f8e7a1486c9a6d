"""Finding and loading a model: local folders, the HF cache, the Hub (a loopback one here), and
every bad input as a typed error with one clear line; remote code is never run unasked."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from support.hub_server import FakeHub

from hfadapt.errors import (
    ConfigError,
    CustomCodeError,
    HfadaptError,
    ModelNotFoundError,
    TokenizerError,
    WeightsError,
)
from hfadapt.loading import load as loading
from hfadapt.loading.pooling import PoolingSpec

# Small models on a shared machine: one torch thread (see conftest.one_thread).
pytestmark = pytest.mark.usefixtures("one_thread")


def test_minilm_folder_loads_with_tokenizer_and_pooling(minilm_path: Path) -> None:
    lm = loading.load(minilm_path)
    assert type(lm.model).__name__ == "BertModel"
    assert not lm.model.training, "the reference must run in eval mode"
    assert lm.model.dtype.is_floating_point and str(lm.model.dtype) == "torch.float32"
    assert lm.tokenizer is not None and lm.tokenizer.vocab_size == 30522
    assert lm.pooling == PoolingSpec("mean", True, "1_Pooling/config.json")
    assert (lm.source, lm.structural, lm.model_type) == ("folder", False, "bert")
    assert lm.raw_config is not None and lm.raw_config["hidden_size"] == 384


@pytest.mark.parametrize(
    ("arch", "cls"),
    [
        ("bert", "BertModel"),
        ("xlm-roberta", "XLMRobertaModel"),
        ("roberta", "RobertaModel"),
        ("mpnet", "MPNetModel"),
        ("distilbert", "DistilBertModel"),
    ],
)
def test_tiny_folders_of_several_architectures_load(
    tiny_model_dirs: dict[str, Path], arch: str, cls: str
) -> None:
    lm = loading.load(tiny_model_dirs[arch])
    assert type(lm.model).__name__ == cls
    assert lm.pooling.mode == "mean" and lm.pooling.source == "default"


# ---- bad input: each a typed error with one clear line (exit code 2) -----------------------


def _write_config(folder: Path, **changes: object) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (folder / "config.json").write_text(json.dumps(cfg))


def _corrupt_header(folder: Path) -> None:
    with (folder / "model.safetensors").open("r+b") as fh:
        fh.write(b"\xff" * 16)


def _truncate(folder: Path) -> None:
    weights = folder / "model.safetensors"
    with weights.open("r+b") as fh:
        fh.truncate(weights.stat().st_size // 2)


def _mismatch(folder: Path) -> None:
    _write_config(folder, hidden_size=128, intermediate_size=256)


def _no_tokenizer(folder: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (folder / name).unlink(missing_ok=True)


BAD_FOLDERS: dict[str, tuple[Callable[[Path], None], type[HfadaptError], str]] = {
    "no config.json": (lambda f: (f / "config.json").unlink(), ConfigError, r"no config\.json in "),
    "config not JSON": (
        lambda f: (f / "config.json").write_text("{oops"),
        ConfigError,
        r"not readable JSON",
    ),
    "config without model_type": (
        lambda f: _write_config(f, model_type=None),
        ConfigError,
        r"has no model_type",
    ),
    "unknown model_type": (
        lambda f: _write_config(f, model_type="bertish-9000"),
        ConfigError,
        r"'bertish-9000', which transformers \S+ does not know",
    ),
    "corrupt safetensors": (
        _corrupt_header,
        WeightsError,
        r"model\.safetensors in .* is corrupt: .*header",
    ),
    "truncated safetensors": (
        _truncate,
        WeightsError,
        r"is corrupt: .*(incomplete|not fully covered)",
    ),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), WeightsError, r"no weights in "),
    "weights do not fit config": (_mismatch, WeightsError, r"do not fit its config\.json"),
    "missing tokenizer": (_no_tokenizer, TokenizerError, r"no tokenizer in "),
}


@pytest.mark.parametrize("case", list(BAD_FOLDERS))
def test_bad_model_folders_raise_one_clear_line(tiny_bert: Path, case: str) -> None:
    breaker, error, pattern = BAD_FOLDERS[case]
    breaker(tiny_bert)
    with pytest.raises(error) as info:
        loading.load(tiny_bert)
    line = info.value.one_line()
    print(f"{case}: {line}")
    assert "\n" not in line and len(line) < 400, line
    assert pytest.approx(info.value.exit_code) == 2
    assert __import__("re").search(pattern, line), line


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"^no such folder: .*nope$"):
        loading.load(tmp_path / "nope")


def test_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"is an empty folder"):
        loading.load(tmp_path / "empty")


def test_a_file_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match=r"is a file; pass the model's folder"):
        loading.load(tmp_path / "config.json")


def test_hub_id_offline_not_in_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as info:
        loading.load("sentence-transformers/all-MiniLM-L6-v2")
    line = info.value.one_line()
    print(line)
    assert "is not in the HF cache" in line and "HF_HUB_OFFLINE is set" in line, line
    assert "structural mode" in line and "--" not in line, (
        f"a library error names no CLI flag: {line}"
    )


def test_not_a_hub_id(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="neither a folder nor a Hub model id"):
        loading.load("bad id with spaces")


# ---- remote code -----------------------------------------------------------------------------

CONFIG_CODE = """
from transformers import BertConfig

class TinyConfig(BertConfig):
    model_type = "tiny-custom"
"""
MODEL_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("the repository's code ran")
from transformers import BertModel
from .configuration_tiny import TinyConfig

class TinyModel(BertModel):
    config_class = TinyConfig
"""


@pytest.fixture
def custom_code_model(
    tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Path]:
    """The tiny BERT turned into a repo with its own code; the code leaves a marker file when run."""
    import transformers.dynamic_module_utils as dmu

    monkeypatch.setattr(dmu, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    marker = tmp_path / "RAN"
    (tiny_bert / "configuration_tiny.py").write_text(CONFIG_CODE)
    (tiny_bert / "modeling_tiny.py").write_text(MODEL_CODE.format(marker=str(marker)))
    _write_config(
        tiny_bert,
        model_type="tiny-custom",
        auto_map={
            "AutoConfig": "configuration_tiny.TinyConfig",
            "AutoModel": "modeling_tiny.TinyModel",
        },
    )
    return tiny_bert, marker


def test_remote_code_is_refused_and_never_run(custom_code_model: tuple[Path, Path]) -> None:
    folder, marker = custom_code_model
    with pytest.raises(CustomCodeError) as info:
        loading.load(folder)
    line = info.value.one_line()
    assert "auto_map: configuration_tiny.TinyConfig, modeling_tiny.TinyModel" in line, line
    assert "`trust_remote_code`" in line and "--trust-remote-code" in info.value.one_line(
        flags=True
    )
    assert not marker.exists(), "the model's own code ran although it was not trusted"


def test_remote_code_runs_when_trusted(custom_code_model: tuple[Path, Path]) -> None:
    folder, marker = custom_code_model
    lm = loading.load(folder, trust_remote_code=True)
    assert type(lm.model).__name__ == "TinyModel"
    assert marker.exists()


def test_snapshot_custom_code_flag_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    from hfadapt.loading.translate import family_for_row

    flagged = (
        next(  # a family hfadapt does not translate (tests/loading/test_translate.py has those)
            row
            for row in loading.snapshot_index().values()
            if row.is_custom_code
            and family_for_row(row.config_class, row.model_type, row.architectures) is None
        )
    )
    reason = loading.remote_code_reason({"model_type": "bert"}, flagged.model_id)
    assert reason is not None and "custom_code" in reason, (flagged.model_id, reason)
    # refused before looking for its files: offline and uncached, the verdict is still custom_code
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CustomCodeError, match="the Hub marks it custom_code"):
        loading.load(flagged.model_id)


# ---- the Hub (loopback) and the HF cache ------------------------------------------------------


def test_hub_id_downloads_then_loads_from_the_cache_offline(
    hub_with_tiny_bert: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    sha = hub_with_tiny_bert.models["acme/tiny-bert"].sha
    online = loading.load("acme/tiny-bert")
    assert (online.source, online.revision) == ("hub", sha)
    assert online.pooling == PoolingSpec("mean", True, "1_Pooling/config.json")
    resolved = [r for r in hub_with_tiny_bert.requests if "/resolve/" in r[1] and r[3] == 200]
    assert any(r[1].endswith("model.safetensors") for r in resolved), resolved

    import huggingface_hub.constants as hf_constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    before = len(hub_with_tiny_bert.requests)
    cached = loading.load("acme/tiny-bert")
    assert (cached.source, cached.revision) == ("cache", sha)
    assert len(hub_with_tiny_bert.requests) == before, "offline load went to the network"
    a, b = online.model.state_dict(), cached.model.state_dict()
    assert all(bool((a[k] == b[k]).all()) for k in a)


def test_hub_id_the_hub_does_not_have(hub_with_tiny_bert: FakeHub) -> None:
    with pytest.raises(
        ModelNotFoundError, match=r"acme/nothing-here is not a model on http://127\.0\.0\.1"
    ):
        loading.load("acme/nothing-here")


def test_unreachable_hub_fails_fast(
    monkeypatch: pytest.MonkeyPatch, online: None, sleeps: list[float]
) -> None:
    from support.hub_server import refused_url

    monkeypatch.setenv("HF_ENDPOINT", refused_url())
    with pytest.raises(ModelNotFoundError, match="cannot be reached"):
        loading.load("acme/tiny-bert")
    assert sum(sleeps) == 0, f"slept {sleeps} s: the Hub probe should fail at once, not retry"


def test_config_without_weights_in_cache_offline(
    hub_with_tiny_bert: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crawl caches config.json only; offline, full mode must say the weights are missing."""
    from huggingface_hub import hf_hub_download

    hf_hub_download("acme/tiny-bert", "config.json", cache_dir=str(loading.hf_cache_dir()))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelNotFoundError, match=r"only the config of acme/tiny-bert is in the HF cache"
    ):
        loading.load("acme/tiny-bert")


def test_copy_of_folder_is_self_contained(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> None:
    """A folder moved elsewhere still loads (nothing points back to where it was saved)."""
    moved = Path(shutil.copytree(tiny_model_dirs["mpnet"], tmp_path / "elsewhere"))
    assert type(loading.load(moved).model).__name__ == "MPNetModel"
