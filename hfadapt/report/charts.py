"""Small inline-SVG charts for the HTML report: no JavaScript library, no CDN, nothing fetched.
Each function returns one ``<svg>`` element as text; every label is escaped."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

__all__ = ["bars", "cumulative_chart", "fmt_count", "plural", "shorten"]

FONT = 'font-family="system-ui, sans-serif" font-size="12"'
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


def cumulative_chart(
    points: Sequence[tuple[int, float, float]],
    *,
    width: int = 900,
    height: int = 340,
    title: str = "",
) -> str:
    """Share of downloads covered against rank (log scale): every model, and passing ones."""
    left, right, top, bottom = 56, 36, 28, 44
    w, h = width - left - right, height - top - bottom
    n = max((p[0] for p in points), default=1)
    span = math.log10(max(n, 2))

    def x(rank: int) -> float:
        return left + w * (math.log10(max(rank, 1)) / span)

    def y(share: float) -> float:
        return top + h * (1 - share)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" data-chart="cumulative"><title>{escape(title)}</title>',
        f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fafafa" stroke="#ccc"/>',
    ]
    for share in (0.25, 0.5, 0.75, 1.0):
        parts.append(
            f'<line x1="{left}" x2="{left + w}" y1="{y(share):.1f}" y2="{y(share):.1f}" stroke="#e0e0e0"/>'
        )
        parts.append(
            f'<text x="{left - 6}" y="{y(share) + 4:.1f}" text-anchor="end" {FONT}>{share:.0%}</text>'
        )
    decade = 1
    while decade <= n:
        parts.append(
            f'<line x1="{x(decade):.1f}" x2="{x(decade):.1f}" y1="{top}" y2="{top + h}" stroke="#e0e0e0"/>'
        )
        parts.append(
            f'<text x="{x(decade):.1f}" y="{top + h + 16}" text-anchor="middle" {FONT}>{decade:,}</text>'
        )
        decade *= 10
    parts.append(
        f'<text x="{left + w / 2}" y="{height - 6}" text-anchor="middle" {FONT}>rank (log scale)</text>'
    )
    for index, (name, colour) in enumerate((("every model", "#90a4ae"), ("passing", PALETTE[0]))):
        line = " ".join(f"{x(p[0]):.1f},{y(p[1 + index]):.1f}" for p in points)
        if points:
            area = f"{x(points[0][0]):.1f},{y(0):.1f} {line} {x(points[-1][0]):.1f},{y(0):.1f}"
            parts.append(f'<polygon points="{area}" fill="{colour}" fill-opacity="0.15"/>')
            parts.append(
                f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2" data-series="{name}"/>'
            )
        parts.append(
            f'<rect x="{left + 12}" y="{top + 10 + 18 * index}" width="12" height="12" fill="{colour}"/>'
        )
        parts.append(
            f'<text x="{left + 30}" y="{top + 20 + 18 * index}" {FONT}>{escape(name)}</text>'
        )
    if points:
        last = points[-1]
        parts.append(
            f'<text x="{left + w - 4}" y="{y(last[2]) - 6:.1f}" text-anchor="end" {FONT} fill="{PALETTE[0]}">'
            f"{last[2]:.1%} of downloads pass</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


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
) -> str:
    """Horizontal bars: (label, value, text shown after the bar); ``scale`` is the full length
    (default: the largest value). ``beside``: a second value per row, drawn right after the
    first in ``beside_colour`` (a part to be read apart from the first, never added to it)."""
    row_h, gap, top = 20, 6, 6
    height = top * 2 + len(rows) * (row_h + gap)
    extra = list(beside) if beside is not None else [0.0] * len(rows)
    full = scale or max((r[1] + e for r, e in zip(rows, extra, strict=True)), default=1) or 1
    room = width - label_width - 330  # leaves room for the note after the longest bar
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" data-chart="{escape(name)}"><title>{escape(title)}</title>'
    ]
    for i, ((text, value, note), more) in enumerate(zip(rows, extra, strict=True)):
        y0 = top + i * (row_h + gap)
        length = max(0.0, room * value / full)
        second = max(0.0, room * more / full)
        colour = (colours or PALETTE)[i % len(colours or PALETTE)] if colours else PALETTE[4]
        # about 7 px a character at 12 px: a longer label would run past the label column
        limit = max(8, (label_width - 16) // 7)
        shown = shorten(text, limit)
        parts.append(
            f'<text x="{label_width - 8}" y="{y0 + 14}" text-anchor="end" {FONT}><title>{escape(text)}</title>{escape(shown)}</text>'
        )
        parts.append(
            f'<rect x="{label_width}" y="{y0}" width="{length:.1f}" height="{row_h}" fill="{colour}" rx="2"/>'
        )
        if second:
            parts.append(
                f'<rect x="{label_width + length:.1f}" y="{y0}" width="{second:.1f}" height="{row_h}" '
                f'fill="{beside_colour}" rx="2" data-part="beside"/>'
            )
        parts.append(
            f'<text x="{label_width + length + second + 6:.1f}" y="{y0 + 14}" {FONT}>{escape(note)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
