"""Small inline-SVG charts for the HTML report: no JavaScript library, no CDN, nothing fetched.
Each function returns a chart's geometry as data (positions, lengths, colours, the texts); the
report's template (``templates/charts.html.j2``) draws it, and autoescaping makes every label
text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Bar",
    "BarChart",
    "CumulativeChart",
    "Series",
    "bars",
    "cumulative_chart",
    "fmt_count",
    "plural",
    "shorten",
]

PALETTE = ("#2e7d32", "#c62828", "#ef6c00", "#6a1b9a", "#1565c0", "#00838f", "#8d6e63", "#546e7a")


def plural(n: int, word: str) -> str:
    """``plural(1, "model")`` -> "1 model", ``plural(3, "model")`` -> "3 models"."""
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut at a word boundary and ending in "…" when
    cut (a single word longer than ``width`` is cut inside, as nothing else fits)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    head = text[: width - 1]
    cut = max(head.rfind(" "), head.rfind("/") + 1 if "/" in head else -1)
    if cut > width // 2:
        head = head[:cut]
    return head.rstrip(" ,;:(") + "…"


def fmt_count(value: float) -> str:
    """12,345 -> "12.3k", 3,400,000 -> "3.4M"."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


@dataclass(frozen=True)
class Series:
    """One line of the cumulative chart: its polyline and the area under it, as SVG points."""

    name: str
    colour: str
    line: str
    area: str
    key_y: int  # where its key square sits


@dataclass(frozen=True)
class CumulativeChart:
    """Share of downloads covered against rank (log scale), laid out in SVG units."""

    title: str
    width: int
    height: int
    left: int
    top: int
    plot_width: int
    plot_height: int
    grid: list[tuple[float, str]]  # y, share label
    decades: list[tuple[float, str]]  # x, rank label
    series: list[Series]
    last: tuple[float, float, str] | None  # x, y, the passing share at the last rank


def cumulative_chart(
    points: Sequence[tuple[int, float, float]],
    *,
    width: int = 900,
    height: int = 340,
    title: str = "",
) -> CumulativeChart:
    """Share of downloads covered against rank (log scale): every model, and passing ones."""
    left, right, top, bottom = 56, 36, 28, 44
    w, h = width - left - right, height - top - bottom
    n = max((p[0] for p in points), default=1)
    span = math.log10(max(n, 2))

    def x(rank: int) -> float:
        return left + w * (math.log10(max(rank, 1)) / span)

    def y(share: float) -> float:
        return top + h * (1 - share)

    decades = []
    decade = 1
    while decade <= n:
        decades.append((x(decade), f"{decade:,}"))
        decade *= 10
    series = []
    for index, (name, colour) in enumerate((("every model", "#90a4ae"), ("passing", PALETTE[0]))):
        line = " ".join(f"{x(p[0]):.1f},{y(p[1 + index]):.1f}" for p in points)
        area = (
            f"{x(points[0][0]):.1f},{y(0):.1f} {line} {x(points[-1][0]):.1f},{y(0):.1f}"
            if points
            else ""
        )
        series.append(Series(name, colour, line, area, top + 10 + 18 * index))
    last = points[-1] if points else None
    return CumulativeChart(
        title=title,
        width=width,
        height=height,
        left=left,
        top=top,
        plot_width=w,
        plot_height=h,
        grid=[(y(s), f"{s:.0%}") for s in (0.25, 0.5, 0.75, 1.0)],
        decades=decades,
        series=series,
        last=(left + w - 4, y(last[2]) - 6, f"{last[2]:.1%} of downloads pass") if last else None,
    )


@dataclass(frozen=True)
class Bar:
    """One row of a bar chart: the full label (a tooltip), the label shown, the bar's length,
    the part drawn beside it, and the note after it."""

    label: str
    shown: str
    y: int
    length: float
    beside: float
    colour: str
    note: str


@dataclass(frozen=True)
class BarChart:
    """Horizontal bars, laid out in SVG units."""

    name: str
    title: str
    width: int
    height: int
    label_width: int
    beside_colour: str
    rows: list[Bar]


def bars(
    rows: Sequence[tuple[str, float, str]],
    *,
    width: int = 960,
    label_width: int = 260,
    scale: float | None = None,
    colours: Sequence[str] | None = None,
    name: str = "bars",
    title: str = "",
    beside: Sequence[float] | None = None,
    beside_colour: str = "#f9a825",
) -> BarChart:
    """Horizontal bars: (label, value, text shown after the bar); ``scale`` is the full length
    (default: the largest value). ``beside``: a second value per row, drawn right after the
    first in ``beside_colour`` (a part to be read apart from the first, never added to it)."""
    row_h, gap, top = 20, 6, 6
    extra = list(beside) if beside is not None else [0.0] * len(rows)
    full = scale or max((r[1] + e for r, e in zip(rows, extra, strict=True)), default=1) or 1
    room = width - label_width - 330  # leaves room for the note after the longest bar
    # about 7 px a character at 12 px: a longer label would run past the label column
    limit = max(8, (label_width - 16) // 7)
    drawn = [
        Bar(
            label=text,
            shown=shorten(text, limit),
            y=top + i * (row_h + gap),
            length=max(0.0, room * value / full),
            beside=max(0.0, room * more / full),
            colour=(colours or PALETTE)[i % len(colours or PALETTE)] if colours else PALETTE[4],
            note=note,
        )
        for i, ((text, value, note), more) in enumerate(zip(rows, extra, strict=True))
    ]
    height = top * 2 + len(rows) * (row_h + gap)
    return BarChart(name, title, width, height, label_width, beside_colour, drawn)
