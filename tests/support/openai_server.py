"""A loopback server that speaks the OpenAI chat-completions API and replays scripted answers
(right, wrong, malformed, slow, rate-limited), recording every request it receives."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

Answer = str | dict[str, Any] | Callable[[dict[str, Any]], Any]


def reply(
    content: str,
    *,
    model: str = "scripted-model",
    prompt_tokens: int = 1200,
    completion_tokens: int = 300,
) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


class ScriptedOpenAI:
    """``script`` is consumed one entry per request: a string is an answer's content; a dict
    may set ``status``, ``headers``, ``body`` (raw JSON), ``delay`` (seconds) or ``content``.
    Each request's headers are kept, so a test can read the SDK's ``x-stainless-retry-count``."""

    def __init__(self) -> None:
        self.script: list[Answer] = []
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "json": body}
                    )
                    entry: Answer = (
                        server.script.pop(0)
                        if server.script
                        else {"status": 500, "body": {"error": {"message": "script exhausted"}}}
                    )
                if callable(entry):
                    entry = entry(body)
                if isinstance(entry, str):
                    entry = {"content": entry}
                if float(entry.get("delay", 0)) > 0:
                    time.sleep(float(entry["delay"]))
                status = int(entry.get("status", 200))
                payload = entry.get("body") or reply(entry.get("content", ""))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in entry.get("headers", {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def start(self) -> ScriptedOpenAI:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def user_messages(self, index: int) -> list[str]:
        return [
            m["content"] for m in self.requests[index]["json"]["messages"] if m["role"] == "user"
        ]


@pytest.fixture(name="openai_server")
def openai_server_fixture() -> Iterator[ScriptedOpenAI]:
    """A running scripted server; import this function into a test module to use it."""
    server = ScriptedOpenAI().start()
    try:
        yield server
    finally:
        server.stop()


def busy(status: int, message: str = "busy", **headers: str) -> dict[str, Any]:
    """An error answer the SDK retries at once: ``retry-after-ms: 1`` (the SDK honours a
    Retry-After only when it is above 0, so 0 would fall back to its 0.5 s backoff)."""
    return {
        "status": status,
        "headers": {"retry-after-ms": "1", **headers},
        "body": {"error": {"message": message}},
    }


def dead_url() -> str:
    """A loopback URL nothing listens on (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"
