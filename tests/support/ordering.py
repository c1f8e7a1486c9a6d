"""The order the suite runs in: the long tests first, longest first, then the rest.

Under ``--dist worksteal`` pytest-xdist cuts the collected list into one contiguous chunk per
worker (equal counts, in order), each worker runs its chunk front to back, and a worker that
runs dry takes the back half of the fullest queue. With the long tests first they all fall in
the first worker's chunk: it starts on the longest while the others run the quick tests, and
what is stolen from it at the end is its shortest long tests, so no long test starts near the
end. A long test here is usually several processes (a sweep's workers, a Ray cluster, a
sandboxed proof, a server): dealt out so that every worker starts on one (measured on 2 cores,
3 workers), they ran together and each took 1.8 times as long, the suite 18.4 minutes against
15.5 this way.

The long units are a test measured at ``HEAVY_SECONDS`` or more (``tests/durations.json``), a
``slow`` test not measured yet, and all the tests that read one fixture no two workers may
run at once (a once-per-run session fixture, the in-process Ray: tests/conftest.py), kept
together; the quick tests keep their collection order (a file's tests stay together, so
its module fixtures are built once).

Refresh the measurements after a suite run with ``--junitxml=FILE``:
``python tests/support/ordering.py FILE`` rewrites ``tests/durations.json`` (a test missing
from it is planned as a ``slow`` or quick one; a stale entry is ignored)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

__all__ = ["DURATIONS", "HEAVY_SECONDS", "durations_from_junit", "load_durations", "plan"]

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
HEAVY_SECONDS = 3.0  # a test measured at this or more runs among the long ones
UNMEASURED_SLOW = 10.0  # what a ``slow`` test not in the measurements is planned at
KEEP_FROM = 0.5  # the measurements file keeps tests that took this long or more


def plan(
    items: Sequence[T],
    seconds: Callable[[T], float | None],
    slow: Callable[[T], bool],
    shared: Callable[[T], str | None],
) -> list[T]:
    """``items`` reordered (module docstring): the long units longest first, then the quick
    tests in their order. ``seconds`` gives a test's measured duration (None: not measured),
    ``slow`` whether it is marked slow, ``shared`` the name of the fixture it reads that keeps
    its tests together (None: none)."""

    def cost(item: T) -> float:
        measured = seconds(item)
        return measured if measured is not None else (UNMEASURED_SLOW if slow(item) else 0.0)

    groups: dict[str, list[T]] = {}
    units: list[tuple[float, list[T]]] = []
    quick: list[T] = []
    for item in items:
        name = shared(item)
        if name is not None:
            groups.setdefault(name, []).append(item)
        elif (own := cost(item)) >= HEAVY_SECONDS:
            units.append((own, [item]))
        else:
            quick.append(item)
    units += [(sum(map(cost, members)), members) for members in groups.values()]
    units.sort(key=lambda unit: -unit[0])  # stable: ties keep their order
    return [item for _, members in units for item in members] + quick


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """The measured seconds by test id; empty when the file is missing or unreadable (the
    order is then the markers' alone: worse balanced, never wrong)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, Mapping):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def durations_from_junit(xml: Path) -> dict[str, float]:
    """Each test's total seconds (setup, call and teardown: pytest's ``junit_duration_report``
    default) from a ``--junitxml`` report, by pytest node id, those of ``KEEP_FROM`` or more."""
    found: dict[str, float] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        parts = classname.split(".")
        # classname is the dotted file path (then any class): find where the file ends
        for cut in range(len(parts), 0, -1):
            path = Path(*parts[:cut]).with_suffix(".py")
            if (DURATIONS.parent.parent / path).is_file():
                node = "::".join([path.as_posix(), *parts[cut:], name])
                break
        else:
            continue
        seconds = float(case.get("time", "0") or 0)
        if seconds >= KEEP_FROM:
            found[node] = round(seconds, 2)
    return found


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(
            "usage: python tests/support/ordering.py JUNIT_XML  (rewrites tests/durations.json)"
        )
    measured = durations_from_junit(Path(sys.argv[1]))
    DURATIONS.write_text(json.dumps(dict(sorted(measured.items())), indent=0) + "\n")
    print(f"{len(measured)} tests of {KEEP_FROM} s or more written to {DURATIONS}")
