"""deploy/: the systemd service and timer that run ``hfadapt cycle`` weekly (with OnFailure=
naming the notify unit template) pass ``systemd-analyze verify`` where systemd is installed,
and parse with the keys a scheduler needs everywhere; the CI workflow is a weekly cron that
runs the cycle."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
UNITS = ("hfadapt-cycle.service", "hfadapt-cycle.timer", "hfadapt-notify@.service")


def _unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False)  # systemd allows repeated keys
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string((DEPLOY / name).read_text())
    return parser


def test_the_units_hold_what_a_weekly_cycle_needs() -> None:
    service, timer, notify = (_unit(n) for n in UNITS)
    assert service["Unit"]["OnFailure"] == "hfadapt-notify@%n.service", dict(service["Unit"])
    run = service["Service"]
    assert run["Type"] == "oneshot" and "hfadapt cycle --online" in run["ExecStart"], dict(run)
    assert "--html" in run["ExecStart"] and run["ReadWritePaths"] == "/var/lib/hfadapt"
    assert (
        timer["Timer"]["Unit"] == "hfadapt-cycle.service" and timer["Timer"]["Persistent"] == "true"
    )
    assert timer["Timer"]["OnCalendar"].startswith("Mon "), dict(timer["Timer"])
    assert timer["Install"]["WantedBy"] == "timers.target"
    assert "%i" in notify["Service"]["ExecStart"] and notify["Service"]["Type"] == "oneshot"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_analyze_verifies_the_units(tmp_path: Path) -> None:
    for name in UNITS:
        shutil.copy(DEPLOY / name, tmp_path / name)
    done = subprocess.run(
        ["systemd-analyze", "verify", *(str(tmp_path / n) for n in UNITS)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    # unknown keys and unparsable values are warnings ("..., ignoring") with exit 0
    complaints = [
        line for line in done.stderr.splitlines()
        if re.search(r"ignoring|Unknown|Failed|bad|not executable", line)
    ]  # fmt: skip
    assert done.returncode == 0 and not complaints, done.stderr
    weekly = subprocess.run(
        ["systemd-analyze", "calendar", "--iterations=2", _unit(UNITS[1])["Timer"]["OnCalendar"]],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert weekly.returncode == 0 and weekly.stdout.count("Mon ") >= 2, weekly.stdout


def _workflow() -> dict[str, Any]:
    text = (DEPLOY / "github-actions-cycle.yml").read_text()
    try:
        import yaml
    except ImportError:  # a structural check: the keys at the start of their lines
        for key in ("on:", "  schedule:", "    - cron:", "jobs:"):
            assert re.search(rf"^{re.escape(key)}", text, re.M), key
        cron = re.search(r'cron: "([^"]+)"', text)
        assert cron is not None
        return {"cron": cron.group(1), "run": text}
    data = yaml.safe_load(text)
    on = data.get("on", data.get(True))  # YAML 1.1 reads a bare `on` as true
    steps = data["jobs"]["cycle"]["steps"]
    return {"cron": on["schedule"][0]["cron"], "run": "\n".join(s.get("run", "") for s in steps)}


def test_the_ci_workflow_runs_the_cycle_weekly() -> None:
    flow = _workflow()
    minute, hour, day, month, weekday = flow["cron"].split()
    assert (day, month, weekday) == ("*", "*", "1") and minute.isdigit() and hour.isdigit(), flow
    assert "hfadapt cycle --online" in flow["run"] and "-c requirements/lock.txt" in flow["run"]
