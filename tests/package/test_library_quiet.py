"""Library use is as quiet as the command line: ``hfadapt.load`` and ``hfadapt.diagnose`` hold
back what other libraries print (the device's warnings, transformers' "Loading weights" bars)
and count it; ``verbose=True`` or ``HFADAPT_VERBOSE=1`` lets it through."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any, TextIO

import pytest

import hfadapt
from hfadapt.spyre.rules.tracking import reset_warnings

DOWNCAST = "the simulated device SpyreDowncastWarning"


@pytest.fixture(scope="module")
def tiny_sentence_transformer(
    tiny_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tiny BERT as a sentence-transformers folder (modules.json, mean pooling): loading it
    shows transformers' "Loading weights" bar."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    folder = tmp_path_factory.mktemp("tiny-st")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        word = Transformer(str(tiny_model_dirs["bert"]))
        model = SentenceTransformer(
            modules=[word, Pooling(word.get_embedding_dimension())], device="cpu"
        )
        model.save(str(folder))
    return folder


def _printed(
    folder: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, **kw: Any
) -> str:
    """What ``hfadapt.load(folder, **kw)`` writes to stdout and stderr, warnings printed as a
    plain Python process prints them (pytest would otherwise record them), each device
    warning site fresh."""

    def show(
        message: Warning | str, category: type[Warning], filename: str, lineno: int,
        file: TextIO | None = None, line: str | None = None,
    ) -> None:  # fmt: skip
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    reset_warnings()
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        monkeypatch.setattr(warnings, "showwarning", show)
        hfadapt.load(str(folder), **kw)
    out, err = capfd.readouterr()
    return out + err


def test_load_prints_nothing_and_counts_what_it_held(
    tiny_sentence_transformer: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HFADAPT_VERBOSE", raising=False)
    before = hfadapt.held_message_counts().get(DOWNCAST, 0)
    printed = _printed(tiny_sentence_transformer, capfd, monkeypatch)
    assert printed == "", f"hfadapt.load printed {len(printed)} characters:\n{printed[:800]}"
    held = hfadapt.held_message_counts().get(DOWNCAST, 0) - before
    assert held >= 1, f"held {held} device downcast warnings: {hfadapt.held_message_counts()}"
    sites = [c for c in hfadapt.device_warning_counts() if c.category == "SpyreDowncastWarning"]
    assert sites, "the held device warning is not in hfadapt.device_warning_counts()"


@pytest.mark.parametrize("how", ["verbose=True", "HFADAPT_VERBOSE=1"])
def test_the_opt_in_lets_them_through(
    how: str,
    tiny_sentence_transformer: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kw: dict[str, Any] = {}
    if how == "verbose=True":
        monkeypatch.delenv("HFADAPT_VERBOSE", raising=False)
        kw["verbose"] = True
    else:
        monkeypatch.setenv("HFADAPT_VERBOSE", "1")
    before = sum(hfadapt.held_message_counts().values())
    printed = _printed(tiny_sentence_transformer, capfd, monkeypatch, **kw)
    assert "Loading weights" in printed and "SpyreDowncastWarning" in printed, printed[:800]
    held = sum(hfadapt.held_message_counts().values()) - before
    assert held == 0, f"{held} messages held with {how}"


def test_diagnose_holds_them_too(
    capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``hfadapt.diagnose`` with its judging replaced by one that makes the noise a model load
    makes (a transformers log warning, a device warning): held and counted, and let through
    with ``HFADAPT_VERBOSE=1``."""
    import logging

    from hfadapt.judge import diagnose as judging
    from hfadapt.spyre.rules.tracking import SpyreDowncastWarning

    def noisy(*args: Any, **kwargs: Any) -> str:
        logging.getLogger("transformers.modeling_utils").warning("Some weights were not used")
        warnings.warn("int64 is downcast to int32", SpyreDowncastWarning, stacklevel=1)
        return "judged"

    monkeypatch.setattr(judging, "_diagnose_and_record", noisy)
    # transformers' own handler holds the stderr of whichever test first configured it (pytest
    # swaps sys.stderr per test); a handler on this test's stderr shows what reaches handlers
    shown = logging.StreamHandler(sys.stderr)
    logger = logging.getLogger("transformers.modeling_utils")
    monkeypatch.setattr(logger, "handlers", [*logger.handlers, shown])  # undone after the test
    monkeypatch.setattr(logger, "propagate", False)
    for verbose in ("0", "1"):
        monkeypatch.setenv("HFADAPT_VERBOSE", verbose)
        before = hfadapt.held_message_counts()
        capfd.readouterr()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            assert hfadapt.diagnose("org/model", record=False) == "judged"  # type: ignore[comparison-overlap]
        out, err = capfd.readouterr()
        after = hfadapt.held_message_counts()
        held = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
        if verbose == "0":
            assert (out, err) == ("", ""), (out, err)
            assert held == {"transformers log": 1, DOWNCAST: 1}, held
        else:
            assert "Some weights were not used" in err and held == {}, (err, held)


def test_what_a_child_process_held_is_counted_by_the_innermost_holder() -> None:
    """A proof's child holds library messages when its parent does (``holding_now()``) and sends
    the counts back; ``count_held`` adds them to the parent's innermost holder, so they are in
    its one summary line and in ``held_message_counts()``; outside any holder it adds nothing
    (the child was told to let them through)."""
    from hfadapt import noise

    before = noise.held_message_counts().get(DOWNCAST, 0)
    assert not noise.holding_now()
    noise.count_held({DOWNCAST: 5})
    with noise.holding(verbose=False) as outer, noise.holding(verbose=False) as inner:
        assert noise.holding_now()
        noise.count_held({DOWNCAST: 3})
    assert not noise.holding_now()
    assert (inner.counts[DOWNCAST], outer.counts[DOWNCAST]) == (3, 0), (inner.counts, outer.counts)
    assert inner.summary() is not None and f"{DOWNCAST} 3" in inner.summary(), inner.summary()
    after = noise.held_message_counts().get(DOWNCAST, 0)
    assert after - before == 3, (before, after)


def test_libraries_first_imported_during_a_hold_get_their_bars_back_after_it() -> None:
    """huggingface_hub reads HF_HUB_DISABLE_PROGRESS_BARS once, when first imported, and
    transformers copies the hub's switch when it is. A hold exports that variable (for the
    processes started meanwhile): when a program's first ``hfadapt.load`` was where both were
    first imported, their bars stayed off for the rest of the program. A fresh interpreter is
    the point here: only a first import shows it. The user's own setting still wins."""
    import subprocess

    script = (
        "from hfadapt import noise\n"
        "with noise.holding(verbose=False):\n"
        "    import transformers.utils.logging as tlog\n"
        "    import huggingface_hub.utils as hub\n"
        "    inside = (hub.are_progress_bars_disabled(), tlog.is_progress_bar_enabled())\n"
        "print(*inside, hub.are_progress_bars_disabled(), tlog.is_progress_bar_enabled())\n"
    )
    seen = {}
    for user in ("", "1"):
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
        if user:
            env["HF_HUB_DISABLE_PROGRESS_BARS"] = user
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        seen[user] = done.stdout.split()
    # (hub off, transformers on) inside the hold, then after it
    assert seen[""] == ["True", "False", "False", "True"], seen
    assert seen["1"] == ["True", "False", "True", "False"], seen
