"""The order the suite runs in, so that the xdist workers finish together.

Under ``--dist worksteal`` pytest-xdist cuts the collected list into one contiguous chunk per
worker (equal counts, in order), each worker runs its chunk front to back, and a worker that
runs dry takes the back half of the fullest queue. A long test therefore belongs at the front
of some chunk: started last, or stolen late, it is a tail where the other cores wait. This
module plans the list that way from measured durations (``tests/durations.json``):

- the heavy units (a test measured at ``HEAVY_SECONDS`` or more, a ``slow`` test not measured
  yet, and all the tests that share a once-per-run session fixture, which go to one chunk so
  no worker waits on another's lock) are dealt out longest first, each to the chunk with the
  least heavy time so far;
- each chunk starts with its heavy units, longest first; the light tests fill the chunks up to
  xdist's counts, in collection order (a file's tests stay together, so its module fixtures
  are built once), and are what is stolen at the end.

Refresh the measurements after a suite run with ``--junitxml=FILE``:
``python tests/support/ordering.py FILE`` rewrites ``tests/durations.json`` (a test missing
from it is planned as a ``slow`` or light one; a stale entry is ignored)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["DURATIONS", "HEAVY_SECONDS", "chunk_sizes", "durations_from_junit", "plan"]

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
HEAVY_SECONDS = 3.0  # a test measured at this or more is dealt out on its own
UNMEASURED_SLOW = 10.0  # what a ``slow`` test not in the measurements is planned at
KEEP_FROM = 0.5  # the measurements file keeps tests that took this long or more


@dataclass
class _Unit(Generic[T]):
    items: list[T]
    seconds: float


@dataclass
class _Chunk(Generic[T]):
    size: int
    heavy: list[_Unit[T]] = field(default_factory=list)
    light: list[T] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return sum(unit.seconds for unit in self.heavy)

    @property
    def count(self) -> int:
        return sum(len(unit.items) for unit in self.heavy) + len(self.light)


def chunk_sizes(total: int, workers: int) -> list[int]:
    """The counts pytest-xdist's worksteal scheduler sends each worker first (its
    ``check_schedule``: each idle node in turn gets the pending count over the nodes left)."""
    sizes, left = [], total
    for index in range(workers):
        size = left // (workers - index)
        sizes.append(size)
        left -= size
    return sizes


def plan(
    items: Sequence[T],
    seconds: Callable[[T], float | None],
    slow: Callable[[T], bool],
    shared: Callable[[T], str | None],
    workers: int,
) -> list[T]:
    """``items`` reordered for ``workers`` worksteal workers (module docstring). ``seconds``
    gives a test's measured duration (None: not measured), ``slow`` whether it is marked
    slow, ``shared`` the name of the once-per-run fixture it reads (None: none)."""
    groups: dict[str, _Unit[T]] = {}
    heavy: list[_Unit[T]] = []
    light: list[T] = []
    for item in items:
        measured = seconds(item)
        cost = measured if measured is not None else (UNMEASURED_SLOW if slow(item) else 0.0)
        name = shared(item)
        if name is not None:
            unit = groups.get(name)
            if unit is None:
                unit = groups[name] = _Unit([], 0.0)
                heavy.append(unit)
            unit.items.append(item)
            unit.seconds += cost
        elif cost >= HEAVY_SECONDS:
            heavy.append(_Unit([item], cost))
        else:
            light.append(item)
    chunks = [_Chunk[T](size) for size in chunk_sizes(len(items), max(1, workers))]
    for unit in sorted(heavy, key=lambda u: -u.seconds):  # stable: ties keep their order
        room = [c for c in chunks if c.count + len(unit.items) <= c.size] or chunks
        min(room, key=lambda c: c.seconds).heavy.append(unit)
    rest = iter(light)
    for chunk in chunks:
        while chunk.count < chunk.size and (item := next(rest, None)) is not None:
            chunk.light.append(item)
    chunks[-1].light.extend(rest)
    return [
        item
        for chunk in chunks
        for item in [
            *(i for unit in sorted(chunk.heavy, key=lambda u: -u.seconds) for i in unit.items),
            *chunk.light,
        ]
    ]


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
