"""``hfadapt serve``'s web app: a JSON API and the dashboard (hfadapt.service.dashboard) over
one results database, read-only (hfadapt.service.database). FastAPI, so the API describes
itself: the OpenAPI schema at /openapi.json and its page at /docs.

Errors are JSON with a one-line ``detail``: 404 for a model or sweep that is not recorded (or
a path that does not exist), 400 for a bad value (a page bound, an id that is no number), 503
when the database cannot be read. The dashboard's pages answer the same errors in HTML."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from hfadapt.errors import HfadaptError, InputError, NotFoundError, StoreError
from hfadapt.service.queries import MAX_OFFSET, MAX_PAGE, Results
from hfadapt.untrusted import hide_url_credentials
from hfadapt.version import __version__

__all__ = ["MAX_MODEL_ID", "create_app"]

MAX_MODEL_ID = 300  # characters: Hub ids are at most 96; a recorded local path may be longer


def _line(text: str, limit: int = 400) -> str:
    text = hide_url_credentials(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def status_of(exc: HfadaptError) -> int:
    """The HTTP status of a typed error: 404 not recorded, 400 bad input, 503 database."""
    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, InputError):
        return 400
    if isinstance(exc, StoreError):
        return 503
    return 500


def _validation_line(exc: RequestValidationError) -> str:
    """The first problem of a request's values as one line: ``limit: ... (got 500)``."""
    problems = exc.errors()
    if not problems:
        return "bad request"
    first = problems[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "path", "body"))
    got = first.get("input")
    shown = f" (got {str(got)[:60]!r})" if got is not None else ""
    return f"{where or 'request'}: {first.get('msg', 'invalid')}{shown}"


def wants_html(request: Request) -> bool:
    """A dashboard page (not /api, not the OpenAPI files) asked for by a browser."""
    path = request.url.path
    api = path.startswith("/api/") or path in ("/api", "/openapi.json", "/docs", "/redoc")
    return not api and "text/html" in request.headers.get("accept", "")


def create_app(results: Results) -> FastAPI:
    """The app over ``results`` (whose engine only reads)."""
    from hfadapt.service import dashboard

    app = FastAPI(
        title="hfadapt",
        version=__version__,
        summary="Which Hugging Face embedding models run on IBM Spyre (simulated): verdicts, "
        "adapters and regressions across weekly cycles, read-only.",
    )
    app.state.results = results

    def error(request: Request, status: int, detail: str) -> Response:
        if wants_html(request):
            return dashboard.error_page(status, detail)
        return JSONResponse({"detail": detail}, status_code=status)

    @app.exception_handler(HfadaptError)
    async def _typed(request: Request, exc: HfadaptError) -> Response:
        return error(request, status_of(exc), _line(exc.one_line()))

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        return error(request, 400, _line(_validation_line(exc)))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        detail = exc.detail if isinstance(exc.detail, str) else "error"
        if exc.status_code == 404 and detail == "Not Found":
            detail = f"no such page: {request.url.path} (the API: /docs)"
        return error(request, exc.status_code, _line(detail))

    _api_routes(app)
    app.include_router(dashboard.router)
    return app


def _results(request: Request) -> Results:
    found: Results = request.app.state.results
    return found


def _api_routes(app: FastAPI) -> None:
    @app.get("/api/healthz", tags=["service"])
    def healthz(request: Request) -> dict[str, Any]:
        """Whether the database answers: its name, completed cycles, the newest, sweeps."""
        results = _results(request)
        return {"status": "ok", "database": results.where, **results.counts()}

    @app.get("/api/models/{model_id:path}", tags=["models"])
    def model(
        request: Request,
        model_id: Annotated[
            str, Path(max_length=MAX_MODEL_ID, description="Hub id, e.g. BAAI/bge-small-en-v1.5")
        ],
    ) -> dict[str, Any]:
        """Does this model run? Its latest verdict and evidence level, the adapters applied,
        the violations, the next step, and its verdict in each completed cycle."""
        return _results(request).model(model_id)

    @app.get("/api/sweeps", tags=["sweeps"])
    def sweeps(
        request: Request,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Rows per page.")] = 50,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Rows skipped.")] = 0,
    ) -> dict[str, Any]:
        """The recorded sweeps, newest first, a page at a time (``total`` counts them all)."""
        return _results(request).sweeps(limit, offset)

    @app.get("/api/sweeps/{sweep_id}/diff/{other}", tags=["sweeps"])
    def diff(
        request: Request,
        sweep_id: Annotated[int, Path(ge=1, le=2**62, description="The sweep compared.")],
        other: Annotated[int, Path(ge=1, le=2**62, description="The baseline sweep.")],
    ) -> dict[str, Any]:
        """Sweep ``sweep_id`` against ``other`` as a cycle compares them: regressions, new
        passes, models new to the ranking, new failure fingerprints, environment changes."""
        return _results(request).diff(sweep_id, other)

    @app.get("/api/cycles/{cycle_id}/drafts", tags=["cycles"])
    def cycle_drafts(
        request: Request,
        cycle_id: Annotated[int, Path(ge=1, le=2**62, description="The cycle.")],
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Rows per page.")] = 50,
        offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Rows skipped.")] = 0,
    ) -> dict[str, Any]:
        """What ``hfadapt cycle --draft`` did in this cycle: fingerprints tried, outcomes,
        accepted adapters, attempts and tokens (over every row), and a page of the drafts,
        most downloads blocked first (``total`` counts them all)."""
        return _results(request).cycle_drafts(cycle_id, limit, offset)

    @app.get("/api/cycles/coverage", tags=["cycles"])
    def coverage(request: Request) -> list[dict[str, Any]]:
        """Each completed cycle: models judged, passed, their share, regressions."""
        return _results(request).coverage()
