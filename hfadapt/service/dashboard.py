"""The dashboard of ``hfadapt serve``: server-rendered pages (Jinja2, autoescaped; templates in
``templates/``) with nothing fetched from elsewhere (the charts are inline SVG and HTML bars; a
Content-Security-Policy holds every page to that). ``/``: coverage over the cycles, the latest
cycle's regressions, failure fingerprints by downloads. ``/models/{id}``: does this model run,
and if not, why and what to do."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from hfadapt import verdicts
from hfadapt.service.queries import Results

__all__ = ["CSP", "coverage_chart", "error_page", "router"]

TEMPLATES = Path(__file__).parent / "templates"
# Inline styles only: no script, no font, no image but data: URIs, nothing from any host.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'"

router = APIRouter(include_in_schema=False)


@cache
def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["url_id"] = lambda value: quote(str(value), safe="/")
    env.filters["thousands"] = lambda value: f"{int(value or 0):,}"
    env.filters["percent"] = lambda value: f"{100 * float(value or 0):.1f}%"
    return env


def render(template: str, http_status: int = 200, **values: object) -> HTMLResponse:
    html = _env().get_template(template).render(**values)
    return HTMLResponse(html, status_code=http_status, headers={"Content-Security-Policy": CSP})


def error_page(status: int, detail: str) -> HTMLResponse:
    return render("error.html", status, status=status, detail=detail)


# the coverage chart's drawing area, in SVG units
WIDTH, HEIGHT, LEFT, TOP, BOTTOM = 760, 220, 44, 12, 28


def coverage_chart(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The geometry of the pass-share line over the cycles (x: cycle order; y: 0-100 %), with
    a tick under every cycle when there are few, every k-th when there are many."""
    n = len(points)
    span = WIDTH - LEFT - 8
    plot = HEIGHT - TOP - BOTTOM
    step = span / (n - 1) if n > 1 else 0.0
    dots = []
    for i, p in enumerate(points):
        x = LEFT + (i * step if n > 1 else span / 2)
        y = TOP + plot * (1 - float(p["share"]))
        dots.append({**p, "x": round(x, 1), "y": round(y, 1)})
    every = max(1, (n + 11) // 12)
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "top": TOP,
        "bottom": HEIGHT - BOTTOM,
        "dots": dots,
        "line": " ".join(f"{d['x']},{d['y']}" for d in dots),
        "ticks": [d for i, d in enumerate(dots) if i % every == 0 or i == n - 1],
        "grid": [
            {"y": round(TOP + plot * (1 - f), 1), "label": f"{int(f * 100)}%"}
            for f in (0.0, 0.25, 0.5, 0.75, 1.0)
        ],
    }


def _results(request: Request) -> Results:
    found: Results = request.app.state.results
    return found


@router.get("/", response_class=HTMLResponse)
def index(request: Request) -> Response:
    results = _results(request)
    points = results.coverage()
    latest = results.latest_cycle()
    fingerprints = results.fingerprints(latest["sweep"]) if latest else []
    widest = max((f["downloads"] for f in fingerprints), default=0) or 1
    return render(
        "index.html",
        database=results.where,
        points=points,
        chart=coverage_chart(points) if points else None,
        latest=latest,
        fingerprints=fingerprints,
        widest=widest,
    )


@router.get("/models", response_class=HTMLResponse)
def find_model(id: Annotated[str, Query(max_length=300)] = "") -> Response:
    """The search form's target: on to the model's page."""
    wanted = id.strip()
    if not wanted:
        return error_page(400, "type a model id, e.g. BAAI/bge-small-en-v1.5")
    return RedirectResponse(f"/models/{quote(wanted, safe='/')}", status_code=303)


@router.get("/models/{model_id:path}", response_class=HTMLResponse)
def model_page(request: Request, model_id: str) -> Response:
    results = _results(request)
    card = results.model(model_id)  # NotFoundError: the app's handler answers 404 in HTML
    history = card["history"]
    since = None
    if card["regressed"] and len(history) > 1:
        since = {"passed": history[-2], "fails": history[-1]}
    return render(
        "model.html",
        database=results.where,
        card=card,
        runs=card["verdict"] == verdicts.PASS,
        since=since,
    )
