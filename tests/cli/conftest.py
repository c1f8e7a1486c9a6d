"""The command line, through hfadapt.cli.main: output, usage errors, exit codes. The shared
fixtures this part's tests use, from tests/support."""

from __future__ import annotations

from support.device import cpu_runner, fault_runner, one_thread
from support.hub import fake_hub, online
from support.models import minilm_path, tiny_bert, tiny_model_dirs
from support.reports import report_engine

__all__ = [
    "cpu_runner",
    "fake_hub",
    "fault_runner",
    "minilm_path",
    "one_thread",
    "online",
    "report_engine",
    "tiny_bert",
    "tiny_model_dirs",
]
