"""A loopback HTTP server speaking the part of the Hugging Face Hub API that the real
``HfApi.list_models``, ``HfApi.model_info`` and ``hf_hub_download`` use (huggingface_hub 2.x):

* ``GET /api/models?pipeline_tag=&sort=downloads&limit=&expand=...`` paginated with a
  ``Link: <...>; rel="next"`` header, as the Hub does;
* ``GET /api/models/{id}`` and ``/api/models/{id}/revision/{rev}``;
* ``HEAD``/``GET /{id}/resolve/{rev}/{file}`` with ``ETag``, ``X-Repo-Commit`` and
  ``Content-Length``, and the Hub's ``X-Error-Code`` on 404s.

Tests script failures (429, 5xx, HTML, broken JSON) with ``FakeHub.script``. Started and
stopped by the ``fake_hub`` fixture in conftest.py.
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

FE, SS = "feature-extraction", "sentence-similarity"


@dataclass
class FakeModel:
    id: str
    pipeline_tag: str = FE
    downloads: int = 0
    likes: int = 0
    library_name: str | None = "sentence-transformers"
    tags: list[str] | None = None
    config: dict[str, Any] | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    safetensors_total: int | None = None
    gated: bool | str = False
    also_in: tuple[str, ...] = ()  # other listings the Hub returns it in
    drop: frozenset[str] = frozenset()  # listing fields left out of the answer

    @property
    def sha(self) -> str:
        return hashlib.sha1(self.id.encode()).hexdigest()

    def listing_entry(self, expand: list[str]) -> dict[str, Any]:
        full: dict[str, Any] = {
            "_id": self.sha[:24],
            "id": self.id,
            "config": self.config,
            "downloads": self.downloads,
            "likes": self.likes,
            "library_name": self.library_name,
            "safetensors": (
                {"parameters": {"F32": self.safetensors_total}, "total": self.safetensors_total}
                if self.safetensors_total
                else None
            ),
            "sha": self.sha,
            "tags": self.tags
            if self.tags is not None
            else [self.library_name or "transformers", self.pipeline_tag],
            "gated": self.gated,
            "pipeline_tag": self.pipeline_tag,
            "createdAt": "2024-05-01T00:00:00.000Z",
            "siblings": [{"rfilename": name} for name in sorted(self.files)],
        }
        keep = (
            {"_id", "id", *expand}
            if expand
            else {"_id", "id", "downloads", "likes", "tags", "pipeline_tag"}
        )
        return {k: v for k, v in full.items() if k in keep and k not in self.drop and v is not None}


@dataclass
class Scripted:
    """A canned answer for requests whose path starts with ``path`` (and whose query has ``query_has``)."""

    path: str
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    query_has: str | None = None


def generate_models(n: int = 300) -> list[FakeModel]:
    """``n`` ordinary embedding models across both pipeline tags, downloads strictly decreasing
    with the index, then one model for each prefilter rule and each oddity the tests need."""
    kinds = ["bert", "xlm-roberta", "mpnet", "roberta", "qwen3", "modernbert"]
    models = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        models.append(
            FakeModel(
                id=f"org{i % 7}/embed-{i:03d}",
                pipeline_tag=FE if i % 5 < 3 else SS,
                downloads=1_000_000 - i * 1000,
                likes=i % 50,
                config={"model_type": kind, "architectures": [f"{kind.title()}Model"]},
                files={
                    "config.json": json.dumps({"model_type": kind, "hidden_size": 384}).encode(),
                    "model.safetensors": b"\0" * 16,
                    "modules.json": b"[]",
                },
                safetensors_total=22_000_000 + i,
            )
        )
    cfg = {"model_type": "bert", "architectures": ["BertModel"]}
    special = [
        FakeModel(
            "acme/bge-reranker-base", FE, 999_999, config=cfg, files={"model.safetensors": b""}
        ),
        FakeModel(
            "acme/tiny-web-embedder",
            FE,
            999_998,
            config=cfg,
            files={"config.json": b"{}", "onnx/model.onnx": b""},
        ),
        FakeModel(
            "acme/embed-GGUF",
            FE,
            999_997,
            library_name="gguf",
            config=cfg,
            files={"embed.Q4.gguf": b""},
        ),
        FakeModel(
            "acme/embed-4bit",
            FE,
            999_996,
            library_name="mlx",
            config=cfg,
            files={"model.safetensors": b""},
        ),
        FakeModel(
            "acme/embed-lora",
            SS,
            999_995,
            config=cfg,
            files={"adapter_config.json": b"{}", "adapter_model.safetensors": b""},
        ),
        FakeModel(
            "acme/giant-embed",
            FE,
            999_994,
            config={"model_type": "llama", "architectures": ["LlamaModel"]},
            files={"model-00001-of-00030.safetensors": b""},
            safetensors_total=70_000_000_000,
        ),
        FakeModel(
            "acme/sparse-embed",
            FE,
            999_993,
            config={"model_type": "qwen3_moe", "architectures": ["Qwen3MoeModel"]},
            files={"model.safetensors": b""},
        ),
        FakeModel(
            "acme/wav2vec2-feature",
            FE,
            999_992,
            library_name="transformers",
            tags=["transformers", "feature-extraction", "audio"],
            config={"model_type": "wav2vec2", "architectures": ["Wav2Vec2Model"]},
            files={"model.safetensors": b""},
        ),
        FakeModel(
            "acme/custom-embed",
            SS,
            999_991,
            tags=["sentence-transformers", "custom_code"],
            config={
                "model_type": "new",
                "architectures": ["NewModel"],
                "auto_map": {"AutoModel": "modeling.NewModel"},
            },
            files={"model.safetensors": b""},
        ),
        FakeModel(
            "acme/both-listings",
            FE,
            999_990,
            config=cfg,
            files={"model.safetensors": b""},
            also_in=(SS,),
        ),
    ]
    return special + models


# Expected prefilter outcome of generate_models()'s special models.
EXPECTED_EXCLUDED = {
    "reranker": 1,
    "onnx_gguf_mlx_only": 3,
    "adapter_only": 1,
    "over_60b": 1,
    "moe": 1,
    "not_text_embedding": 1,
}


class FakeHub:
    """The server: ``url`` is its endpoint; ``requests`` logs (method, path, query, status)."""

    def __init__(self, models: list[FakeModel] | None = None, page_size: int = 40) -> None:
        self.models = {m.id: m for m in (models if models is not None else generate_models())}
        self.page_size = page_size
        self.scripted: list[Scripted] = []
        self.requests: list[tuple[str, str, dict[str, list[str]], int]] = []
        self.authorizations: list[tuple[str, str]] = []  # (path, Authorization header or "")
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        # A short poll interval: stop() waits for it, once per test.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def start(self) -> FakeHub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def add(self, *models: FakeModel) -> None:
        for m in models:
            self.models[m.id] = m

    def script(self, path: str, *, status: int = 200, body: bytes | str = b"", headers: dict[str, str] | None = None,
               times: int = 1, query_has: str | None = None) -> None:  # fmt: skip
        data = body.encode() if isinstance(body, str) else body
        self.scripted.append(Scripted(path, status, data, dict(headers or {}), times, query_has))

    def listing_requests(
        self, tag: str | None = None
    ) -> list[tuple[str, str, dict[str, list[str]], int]]:
        return [
            r for r in self.requests
            if r[1] == "/api/models" and "pipeline_tag" in r[2] and (tag is None or r[2]["pipeline_tag"] == [tag])
        ]  # fmt: skip

    def _scripted_for(self, path: str, raw_query: str) -> Scripted | None:
        with self._lock:
            for item in self.scripted:
                if path.startswith(item.path) and (
                    item.query_has is None or item.query_has in raw_query
                ):
                    item.times -= 1
                    if item.times <= 0:
                        self.scripted.remove(item)
                    return item
        return None


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
            pass

        def do_GET(self) -> None:
            self._dispatch(head=False)

        def do_HEAD(self) -> None:
            self._dispatch(head=True)

        def _send(
            self,
            status: int,
            body: bytes = b"",
            headers: dict[str, str] | None = None,
            head: bool = False,
        ) -> None:
            self.send_response(status)
            sent = {k.lower() for k in headers or {}}
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if "content-type" not in sent:
                self.send_header("Content-Type", "application/json")
            if "content-length" not in sent:
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            parts = urlsplit(self.path)
            hub.requests.append((self.command, unquote(parts.path), parse_qs(parts.query), status))

        def _json(
            self, status: int, data: Any, headers: dict[str, str] | None = None, head: bool = False
        ) -> None:
            self._send(status, json.dumps(data).encode(), headers, head)

        def _dispatch(self, head: bool) -> None:
            parts = urlsplit(self.path)
            path = unquote(parts.path)
            hub.authorizations.append((path, self.headers.get("Authorization") or ""))
            canned = hub._scripted_for(path, parts.query)
            if canned is not None:
                ctype = (
                    {"Content-Type": "text/html"} if canned.body.lstrip().startswith(b"<") else {}
                )
                self._send(canned.status, canned.body, {**ctype, **canned.headers}, head)
                return
            if path == "/api/models":
                self._listing(parse_qs(parts.query), head)
            elif path.startswith("/api/models/"):
                self._model_info(path[len("/api/models/") :], head)
            elif "/resolve/" in path:
                self._resolve(path, head)
            else:
                self._json(404, {"error": "Not Found"}, head=head)

        def _listing(self, query: dict[str, list[str]], head: bool) -> None:
            tag = query.get("pipeline_tag", [None])[0]
            expand = query.get("expand", [])
            limit = int(query.get("limit", ["1000"])[0])
            start = int(query.get("cursor", ["0"])[0])
            chosen = [
                m
                for m in hub.models.values()
                if tag is None or m.pipeline_tag == tag or tag in m.also_in
            ]
            if query.get("sort", [""])[0] == "downloads":
                chosen.sort(key=lambda m: -m.downloads)
            size = min(limit, hub.page_size)
            page = chosen[start : start + size]
            headers = {}
            if start + size < len(chosen):
                nxt = {k: v for k, v in query.items() if k != "cursor"}
                nxt["cursor"] = [str(start + size)]
                headers["Link"] = f'<{hub.url}/api/models?{urlencode(nxt, doseq=True)}>; rel="next"'
            self._json(200, [m.listing_entry(expand) for m in page], headers, head)

        def _model_info(self, rest: str, head: bool) -> None:
            repo_id = rest.split("/revision/")[0]
            model = hub.models.get(repo_id)
            if model is None:
                self._json(
                    404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head
                )
                return
            info = model.listing_entry(["config", "downloads", "likes", "library_name", "safetensors", "sha",
                                        "tags", "gated", "pipeline_tag", "createdAt", "siblings"])  # fmt: skip
            info["modelId"] = model.id
            self._json(200, info, head=head)

        def _resolve(self, path: str, head: bool) -> None:
            before, _, after = path.lstrip("/").partition("/resolve/")
            _revision, _, filename = after.partition("/")
            model = hub.models.get(before)
            if model is None:
                self._json(
                    404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head
                )
                return
            commit = {"X-Repo-Commit": model.sha}
            if filename not in model.files:
                self._json(
                    404,
                    {"error": "Entry not found"},
                    {"X-Error-Code": "EntryNotFound", **commit},
                    head,
                )
                return
            body = model.files[filename]
            etag = hashlib.sha256(body).hexdigest()
            self._send(
                200,
                body,
                {"ETag": f'"{etag}"', **commit, "Content-Type": "application/octet-stream"},
                head,
            )

    return Handler


def refused_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (connection refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
