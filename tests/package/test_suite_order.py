"""The suite's own order (tests/support/ordering.py): each xdist worker's chunk starts with an
even share of the long tests, longest first; chunks have the counts xdist cuts; the tests of a
once-per-run fixture stay in one chunk; the measurements file parses to this suite's ids."""

from __future__ import annotations

from pathlib import Path

from support.ordering import DURATIONS, chunk_sizes, durations_from_junit, load_durations, plan

# name -> (measured seconds or None, slow, once-per-run fixture)
SUITE = {
    "ray": (180.0, True, None), "agent": (60.0, True, None), "cache": (70.0, True, None),
    "sandbox": (45.0, True, None), "unmeasured": (None, True, None),
    "cycle-a": (190.0, True, "cycles"), "cycle-b": (2.0, False, "cycles"),
    **{f"fast-{i}": (0.2, False, None) for i in range(20)},
    "fixture-free-slow": (1.0, True, None),
}  # fmt: skip


def _chunks(order: list[str], workers: int) -> list[list[str]]:
    sizes, out, at = chunk_sizes(len(order), workers), [], 0
    for size in sizes:
        out.append(order[at : at + size])
        at += size
    return out


def test_long_tests_lead_each_chunk_and_the_heavy_time_is_dealt_evenly() -> None:
    order = plan(
        list(SUITE),
        seconds=lambda n: SUITE[n][0],
        slow=lambda n: SUITE[n][1],
        shared=lambda n: SUITE[n][2],
        workers=3,
    )
    chunks = _chunks(order, 3)
    cost = {n: 192.0 if n == "cycle-a" else SUITE[n][0] or 10.0 for n in SUITE}
    leads = [[n for n in c if n != "cycle-b" and cost[n] >= 3] for c in chunks]
    heavy = [sum(cost[n] for n in lead) for lead in leads]
    print(f"chunks {chunks}; heavy seconds {heavy}")
    assert sorted(order) == sorted(SUITE), order  # nothing lost or doubled
    assert [len(c) for c in chunks] == [9, 9, 10], chunks  # 28 tests, as xdist cuts them
    # dealt longest first to the chunk with the least: 192 (both cycle tests), 180, then 70, 60,
    # 45 and 10 to the third: 192 / 180 / 185
    assert max(heavy) - min(heavy) <= 15, heavy
    assert any({"cycle-a", "cycle-b"} <= set(c) for c in chunks), chunks
    for chunk, lead in zip(chunks, leads, strict=True):
        # each chunk starts with its long tests, longest first; then the light ones
        assert (lead and chunk[: len(lead)] == lead) or chunk[:2] == ["cycle-a", "cycle-b"], chunk
        assert [cost[n] for n in lead] == sorted((cost[n] for n in lead), reverse=True), chunk


def test_one_worker_runs_the_longest_first_and_light_tests_keep_their_order() -> None:
    order = plan(
        list(SUITE), lambda n: SUITE[n][0], lambda n: SUITE[n][1], lambda n: SUITE[n][2], 1
    )
    print(order)
    assert order[:3] == ["cycle-a", "cycle-b", "ray"], order
    fast = [n for n in order if n.startswith("fast")]
    assert fast == [f"fast-{i}" for i in range(20)], fast
    assert order.index("fixture-free-slow") > order.index("unmeasured"), order


def test_xdist_cuts_counts_as_its_scheduler_does() -> None:
    assert chunk_sizes(1888, 3) == [629, 629, 630]
    assert chunk_sizes(2, 3) == [0, 1, 1]
    assert sum(chunk_sizes(1001, 4)) == 1001


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
        "</testsuite></testsuites>"
    )
    parsed = durations_from_junit(junit)
    print(parsed)
    assert parsed == {
        "tests/package/test_suite_order.py::test_x[a-b]": 4.25,
        "tests/sweep/test_sweep.py::TestGroup::test_z": 0.9,
    }, parsed
    assert load_durations(tmp_path / "missing.json") == {}
    assert DURATIONS.name == "durations.json"
