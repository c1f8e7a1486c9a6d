"""Sweeps for tests: small config dicts, hand-made crawls, a database holding one, and the
stand-in worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


def small_bert(**over: object) -> dict[str, object]:
    """A small BERT config.json dict (2 heads of 64, 4 layers): seconds to judge structurally."""
    config: dict[str, object] = {
        "model_type": "bert",
        "architectures": ["BertModel"],
        "hidden_size": 128,
        "num_attention_heads": 2,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "hidden_act": "gelu",
        "max_position_embeddings": 512,
    }
    config.update(over)
    return config


def sweep_records(kind: str = "small") -> list[object]:
    """Hand-made crawl records (best first). ``small``: 13 models, 11 of them in 5 units of work
    (signatures A x5, B, C, D x3, and one model without a config judged alone), one custom_code
    and one prefilter-excluded model. ``many``: 90 models in 30 signatures of 3, and the same two."""
    from hfadapt.hub.catalog import HubRecord

    recs: list[HubRecord] = []
    if kind == "small":
        for i in range(5):
            recs.append(HubRecord(id=f"org/bert-a{i}", config=small_bert()))
        recs.append(HubRecord(id="org/bert-relu", config=small_bert(hidden_act="relu")))
        recs.append(HubRecord(id="org/minilm", config=small_bert(num_attention_heads=4)))
        recs.append(
            HubRecord(
                id="org/custom",
                config=small_bert(auto_map={"AutoModel": "modeling.M"}),
                is_custom_code=True,
            )
        )
        for i in range(3):
            recs.append(
                HubRecord(
                    id=f"org/xlmr-{i}",
                    config={
                        **small_bert(),
                        "model_type": "xlm-roberta",
                        "architectures": ["XLMRobertaModel"],
                    },
                )
            )
        recs.append(HubRecord(id="org/model-onnx", config=small_bert()))
        recs.append(HubRecord(id="org/no-config", model_type="bert"))
    else:
        acts = (
            "gelu",
            "relu",
            "silu",
            "gelu_new",
            "tanh",
            "gelu_fast",
            "quick_gelu",
            "mish",
            "gelu_pytorch_tanh",
            "sigmoid",
        )
        for act in acts:
            for inter in (256, 264, 272):
                for copy in range(3):
                    recs.append(
                        HubRecord(
                            id=f"org/{act}-{inter}-{copy}",
                            config=small_bert(hidden_act=act, intermediate_size=inter),
                        )
                    )
        recs.append(
            HubRecord(
                id="org/custom",
                config=small_bert(auto_map={"AutoModel": "modeling.M"}),
                is_custom_code=True,
            )
        )
        recs.append(HubRecord(id="org/model-onnx", config=small_bert()))
    for rank, rec in enumerate(recs):
        rec.downloads = 1000 * (len(recs) - rank)
        rec.model_type = rec.model_type or (rec.config or {}).get("model_type")  # type: ignore[assignment]
        rec.library = "sentence-transformers"
    return recs


def store_crawl(engine: object, records: list[object]) -> int:
    """Save ``records`` as a finished crawl (prefiltered as a real crawl is); returns its id."""
    from hfadapt.hub import prefilter
    from hfadapt.hub.catalog import save_crawl, start_crawl

    prefilter.apply(records)  # type: ignore[arg-type]
    crawl_id = start_crawl(engine, source="test", limit=None)  # type: ignore[arg-type]
    save_crawl(engine, crawl_id, records, source="test")  # type: ignore[arg-type]
    return crawl_id


@pytest.fixture
def sweep_engine(tmp_path: Path) -> Iterator[object]:
    """A database (the test's $HFADAPT_DB) holding the ``small`` hand-made crawl."""
    from hfadapt.db.engine import get_engine

    engine = get_engine(str(tmp_path / "runs.db"))
    store_crawl(engine, sweep_records("small"))
    yield engine
    engine.dispose()


@pytest.fixture
def fake_worker(monkeypatch: pytest.MonkeyPatch) -> str:
    """The stand-in sweep worker (tests/support/sweep_fakes.py) as ``module:function``; spawned workers
    find it because tests/ is on their sys.path."""
    import sys

    here = str(Path(__file__).resolve().parents[1])  # tests/: support.sweep_fakes imports
    if here not in sys.path:
        monkeypatch.syspath_prepend(here)
    for var in ("HFADAPT_FAKE_CRASH", "HFADAPT_FAKE_HANG", "HFADAPT_FAKE_SLEEP"):
        monkeypatch.delenv(var, raising=False)
    return "support.sweep_fakes:fake_judge"
