"""The suite's own order (tests/support/ordering.py): the long tests first, longest first, the
tests of a once-per-run fixture together, then the quick ones in collection order; the
measurements file parses to this suite's ids."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.ordering import DURATIONS, durations_from_junit, load_durations, plan

# name -> (measured seconds or None, slow, once-per-run fixture)
SUITE = {
    "fast-0": (0.2, False, None), "ray": (180.0, True, None), "fast-1": (0.3, False, None),
    "agent": (60.0, True, None), "cycle-a": (190.0, True, "cycles"), "unmeasured": (None, True, None),
    "fast-2": (None, False, None), "cycle-b": (2.0, False, "cycles"), "sandbox": (45.0, True, None),
    "measured-quick-slow": (1.0, True, None), "fast-3": (0.1, False, None),
}  # fmt: skip


def _plan() -> list[str]:
    return plan(
        list(SUITE),
        seconds=lambda n: SUITE[n][0],
        slow=lambda n: SUITE[n][1],
        shared=lambda n: SUITE[n][2],
    )


def test_the_long_tests_go_first_longest_first_and_a_fixtures_tests_together() -> None:
    order = _plan()
    print(order)
    assert sorted(order) == sorted(SUITE), order  # nothing lost or doubled
    # the cycle unit (190 + 2 s) before the 180 s test, then 60, 45, and 10 (slow, unmeasured)
    assert order[:6] == ["cycle-a", "cycle-b", "ray", "agent", "sandbox", "unmeasured"], order
    # a measurement outranks the marker; the quick tests keep their collection order
    assert order[6:] == ["fast-0", "fast-1", "fast-2", "measured-quick-slow", "fast-3"], order


def test_the_measurements_name_this_suites_tests(tmp_path: Path) -> None:
    measured = load_durations()
    here = Path(__file__).resolve().parents[2]
    files = {node.split("::")[0] for node in measured}
    missing = sorted(f for f in files if not (here / f).is_file())
    print(f"{len(measured)} measured tests in {len(files)} files; files gone: {missing}")
    assert len(measured) >= 100 and len(missing) <= len(files) // 10, missing
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.package.test_suite_order" name="test_x[a-b]" time="4.25"/>'
        '<testcase classname="tests.sweep.test_sweep.TestGroup" name="test_y" time="0.1"/>'
        '<testcase classname="tests.sweep.test_sweep.TestGroup" name="test_z" time="0.9"/>'
        '<testcase classname="tests.gone.test_gone" name="test_w" time="9.0"/>'
        "</testsuite></testsuites>"
    )
    parsed = durations_from_junit(junit)
    print(parsed)
    assert parsed == {
        "tests/package/test_suite_order.py::test_x[a-b]": 4.25,
        "tests/sweep/test_sweep.py::TestGroup::test_z": 0.9,
    }, parsed
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert load_durations(tmp_path / "missing.json") == {} == load_durations(broken)
    assert DURATIONS.name == "durations.json"


def test_this_runs_in_process_ray_tests_are_planned_one_after_the_other(
    request: pytest.FixtureRequest,
) -> None:
    """tests/conftest.py keeps the tests of the ``local_ray`` fixture (one Ray at a time on the
    machine) together in this run's order, so that no worker waits on another's Ray lock."""
    items = request.session.items
    at = [i for i, item in enumerate(items) if "local_ray" in getattr(item, "fixturenames", ())]
    if not at:
        pytest.skip("no test of the local_ray fixture collected in this run")
    names = [items[i].nodeid for i in at]
    print(f"positions {at} of {len(items)}: {names}")
    assert at == list(range(at[0], at[0] + len(at))), (at, names)
    assert len(at) >= 2 and {n.split("::")[0] for n in names} >= {
        "tests/sweep/test_ray_executor.py",
        "tests/sweep/test_memory_oom.py",
    }, names
