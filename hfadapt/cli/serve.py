"""``hfadapt serve``: the read-only web app over the results database (the JSON API, its
OpenAPI page, the dashboard) on 127.0.0.1 unless told otherwise. Thin: open the database
(hfadapt.service.database), build the app (hfadapt.service.api), run it under uvicorn."""

from __future__ import annotations

import socket
from typing import Annotated

import typer
from rich.markup import escape

from hfadapt.cli._app import DbOption, app, err_console
from hfadapt.errors import UsageError

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything is served: a port in use or a host that is
    not this machine's is one line (exit 2), not a server's traceback."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as exc:
        raise UsageError(f"--host {host!r} cannot be listened on: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.set_inheritable(True)
    return sock


@app.command()
def serve(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            metavar="ADDRESS",
            help="Address to listen on. Anything but loopback exposes the API without "
            "authentication: put a reverse proxy with auth in front (docs/service.md).",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", min=1, max=65535, metavar="N", help="TCP port.")
    ] = 8000,
    db: DbOption = None,
) -> None:
    """Serve the results database read-only: a JSON API (/api/..., described at /docs and
    /openapi.json) and a dashboard (/) of coverage across cycles, the latest regressions,
    failure fingerprints, and a page per model. Ctrl-C stops it."""
    import uvicorn

    from hfadapt.service.api import create_app
    from hfadapt.service.database import open_results
    from hfadapt.service.queries import Results

    engine = open_results(db)
    try:
        sock = _listen(host, port)
        results = Results(engine)
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(results),
                log_config=None,
                log_level="warning",
                access_log=False,
                lifespan="off",
            )
        )
        shown = f"[{host}]" if ":" in host else host
        err_console.print(
            f"serving http://{escape(shown)}:{port}/ (API: /docs) read-only over "
            f"{escape(results.where)}; Ctrl-C stops",
            highlight=False,
            soft_wrap=True,
        )
        if host not in LOOPBACK:
            err_console.print(
                f"note: listening on {escape(host)}, not loopback: anyone who reaches this port "
                "reads the results (no authentication; docs/service.md says how to put it "
                "behind a proxy)",
                highlight=False,
                soft_wrap=True,
            )
        server.run(sockets=[sock])
    finally:
        engine.dispose()
