"""The HTML report through Jinja2's autoescaping: a model id, reason or adapter name holding
``<script>`` and ``"`` is text in every place the report shows it (tables, lists, chart labels,
the per-model JSON), and nothing in it becomes an element or ends an attribute."""

from __future__ import annotations

import dataclasses
import json
import re
from html.parser import HTMLParser
from typing import Any

from hfadapt.report.coverage import Report, build_report
from hfadapt.report.html import render_html


def hostile(name: str) -> str:
    return f'{name}<script>alert("{name}")</script>"'


def _swap(value: Any, names: dict[str, str]) -> Any:
    """``value`` with every string naming a model, adapter or fingerprint made hostile."""
    if isinstance(value, str):
        for plain, bad in names.items():
            value = value.replace(plain, bad)
        return value
    if isinstance(value, list):
        return [_swap(v, names) for v in value]
    if isinstance(value, tuple):
        return tuple(_swap(v, names) for v in value)
    if isinstance(value, dict):
        return {k: _swap(v, names) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _swap(getattr(value, f.name), names) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **changes)
    return value


class _Page(HTMLParser):
    """Elements, attribute values, and the text under each table class / list / heading."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[str] = []
        self.text_by_place: dict[str, list[str]] = {}
        self.scripts: list[str] = []
        self._place: list[str] = ["page"]
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes += [v or "" for _, v in attrs]
        found = dict(attrs)
        if tag in ("table", "ul", "svg", "p"):
            self._place.append(f"{tag}.{found.get('data-chart') or found.get('class') or ''}")
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        if tag in ("table", "ul", "svg", "p") and len(self._place) > 1:
            self._place.pop()
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)
        else:
            self.text_by_place.setdefault(self._place[-1], []).append(data)


def test_hostile_ids_reasons_and_adapter_names_are_text_everywhere(report_engine: Any) -> None:
    report = build_report(report_engine, against=1)
    names = {m: hostile(m) for m in ("m/one", "m/two", "m/three", "m/four", "m/six", "m/seven")}
    names |= {"a1": hostile("a1"), "a2": hostile("a2"), "qwen3": hostile("qwen3")}
    bad: Report = _swap(report, names)
    bad.ineffective = [(hostile("a1"), 1, 100)]
    bad.other_failures = [("verification_failed", hostile("reason"), 1, 60)]
    page = render_html(bad)

    # nothing became markup: two script elements (the page's own and the JSON rows), no alert
    assert len(re.findall(r"<script", page, re.I)) == 2, re.findall(r"<script[^>]*>", page)
    assert "<script>alert" not in page and 'alert("' not in page.replace("\\u003c", "")
    parsed = _Page()
    parsed.feed(page)
    assert parsed.tags.count("script") == 2, parsed.tags.count("script")

    # every place a hostile string is shown, it is the whole string, as text
    shown = {
        place: sum("".join(texts).count(s) for s in {*names.values(), hostile("reason")})
        for place, texts in parsed.text_by_place.items()
    }
    expected = {
        "table.fingerprints": 4,  # "e.g." models of F1, F2, F3
        "table.diff": 2,  # m/two and m/four changed (and m/five, not renamed)
        "table.adapters": 2,  # a1, a2
        "table.types": 1,  # qwen3
        "table.other": 1,  # the reason
        "table.blockers": 1,  # m/seven, custom_code
        "p.ineffective": 2,  # the adapter's name, twice
        "svg.model-types": 1,  # qwen3: the tooltip (the label shown is cut short)
    }
    wrong = {p: (shown.get(p, 0), n) for p, n in expected.items() if shown.get(p, 0) < n}
    assert not wrong, f"place: (shown, expected at least) {wrong}; all places {shown}"
    lists = [p for p in shown if p.startswith("ul.") and shown[p]]
    assert lists, f"no agreement list shows a hostile id: {shown}"

    # the per-model rows: JSON whose strings decode to the hostile ids, with no raw "<" in it
    data = parsed.scripts[-1]
    assert "<" not in data and ">" not in data, data[:300]
    rows = json.loads(data)
    ids = {row["model_id"] for row in rows}
    assert set(names[m] for m in names if m.startswith("m/")) <= ids, ids

    # a quote never ends an attribute early: an attribute naming a hostile string holds all of it
    every = {*names.values(), hostile("reason")}
    cut = [a for a in parsed.attributes if "alert" in a and a not in every]
    assert not cut, cut
    assert any(a in every for a in parsed.attributes), "no filter option names a hostile type"
    assert page.count("alert(&#34;") >= sum(expected.values()), page.count("alert(&#34;")
