"""Every environment variable is read in hfadapt.settings and documented in docs/settings.md."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from hfadapt import settings
from hfadapt.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hfadapt"
DOC = ROOT / "docs" / "settings.md"
_ENVIRONMENT = ("environ", "getenv", "putenv", "unsetenv")


def environment_uses(source: str, where: str) -> list[str]:
    """Where code touches the environment itself: ``os.environ``, ``os.getenv``, ``os.putenv``
    or ``os.unsetenv``, as attributes or imported by name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in _ENVIRONMENT:
            found.append(f"{where}:{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = sorted({a.name for a in node.names} & set(_ENVIRONMENT))
            if names:
                found.append(f"{where}:{node.lineno} from os import {', '.join(names)}")
    return found


def test_only_settings_touches_the_environment() -> None:
    found = [
        use
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "settings.py"
        for use in environment_uses(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, f"{len(found)} uses of the environment outside hfadapt.settings:\n" + (
        "\n".join(found)
    )


def test_the_scan_sees_each_way_of_reading() -> None:
    source = "import os\nfrom os import getenv\nos.environ.get('A')\nos.getenv('B')\nos.putenv('C', '')\n"
    found = environment_uses(source, "m.py")
    assert len(found) == 4, found


def table() -> str:
    rows = ["| variable | default | what it holds | whose |", "|---|---|---|---|"]
    for v in settings.VARIABLES:
        owner = {"hfadapt": "hfadapt", "set": "set by hfadapt"}.get(v.owner, v.owner)
        rows.append(f"| `{v.name}` | {v.default} | {v.holds} | {owner} |")
    return "\n".join(rows)


def test_the_docs_table_is_the_settings_list() -> None:
    text = DOC.read_text()
    start = text.index("<!-- settings table: hfadapt.settings.VARIABLES -->\n")
    end = text.index("<!-- end of settings table -->")
    documented = text[start:end].split("\n", 1)[1].strip()
    assert documented == table(), "docs/settings.md differs from hfadapt.settings.VARIABLES"


def test_every_hfadapt_variable_named_anywhere_is_listed() -> None:
    listed = {v.name for v in settings.VARIABLES}
    named: dict[str, str] = {}
    places = [*PACKAGE.rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    for path in places:
        for name in re.findall(r"\bHFADAPT_[A-Z0-9_]+\b", path.read_text()):
            named.setdefault(name, str(path.relative_to(ROOT)))
    missing = {name: where for name, where in named.items() if name not in listed}
    assert not missing, f"variables named but not in hfadapt.settings.VARIABLES: {missing}"


def test_values_are_read_when_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HFADAPT_HOME", str(tmp_path / "a"))
    assert settings.drafts_home() == tmp_path / "a"
    monkeypatch.setenv("HFADAPT_HOME", "")  # empty is unset
    assert settings.drafts_home() == Path.home() / ".local" / "share" / "hfadapt"
    monkeypatch.setenv("HFADAPT_ADAPTERS_PATH", f"{tmp_path / 'x'}{os.pathsep}{os.pathsep}/y")
    assert settings.adapter_folders() == [tmp_path / "x", Path("/y")]
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert settings.hf_hub_cache() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_OFFLINE", "")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "Yes")
    assert settings.hub_offline() is True
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    assert settings.hub_endpoint() == "http://127.0.0.1:9"


def test_a_card_count_that_is_not_a_number_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HFADAPT_SPYRE_DEVICES", "two")
    with pytest.raises(UsageError, match="HFADAPT_SPYRE_DEVICES must be a whole number"):
        settings.spyre_devices()
    monkeypatch.setenv("HFADAPT_SPYRE_DEVICES", "0")
    assert settings.spyre_devices() == 1


def test_exported_puts_back_what_was_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HFADAPT_TEST_KEPT", "before")
    monkeypatch.delenv("HFADAPT_TEST_NEW", raising=False)
    with settings.exported({"HFADAPT_TEST_KEPT": "inside", "HFADAPT_TEST_NEW": "1"}):
        assert os.environ["HFADAPT_TEST_KEPT"] == "inside"
        assert os.environ["HFADAPT_TEST_NEW"] == "1"
    assert os.environ["HFADAPT_TEST_KEPT"] == "before"
    assert "HFADAPT_TEST_NEW" not in os.environ
