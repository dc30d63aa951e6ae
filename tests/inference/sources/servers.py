"""Loopback servers that speak the real HTTP protocols of the services conch downloads from.

- :class:`HubServer`: the Hugging Face Hub routes ``huggingface_hub`` uses
  (``/api/models/{repo}/revision/{rev}`` with ``sha`` and ``siblings``;
  ``/{repo}/resolve/{rev}/{file}`` with ``ETag``, ``X-Repo-Commit``, ``Content-Length`` and
  ``Range``).
- :class:`FileServer`: plain HTTP with ``Range``, able to cut a response after N bytes.
- :class:`OllamaRegistry`: ``/v2/{name}/manifests/{tag}`` and ``/v2/{name}/blobs/{digest}``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = _Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def send_json(self, status: int, body: Any, extra: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_bytes(self, data: bytes, headers: dict[str, str], cut_after: int | None = None,
                   delay: float = 0.0) -> None:
        """Answer with ``data`` honouring ``Range``; optionally drop the connection mid-body."""
        start, end = 0, len(data) - 1
        rng = self.headers.get("Range")
        status = 200
        if rng:
            m = _RANGE.fullmatch(rng.strip())
            if m:
                start = int(m.group(1))
                if m.group(2):
                    end = min(int(m.group(2)), len(data) - 1)
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                status = 206
        body = data[start : end + 1]
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(body)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if self.command == "HEAD":
            return
        if cut_after is not None and cut_after < len(body):
            self.wfile.write(body[:cut_after])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        view = memoryview(body)
        step = 1 << 16 if delay else 1 << 20
        try:
            for i in range(0, len(body), step):
                self.wfile.write(view[i : i + step])
                if delay:
                    time.sleep(delay)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


# -- Hugging Face Hub -------------------------------------------------------------------------


@dataclass
class HubRepo:
    files: dict[str, bytes]
    commit: str = ""
    branches: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.commit:
            h = hashlib.sha1()
            for name in sorted(self.files):
                h.update(name.encode() + hashlib.sha256(self.files[name]).digest())
            self.commit = h.hexdigest()
        self.branches.setdefault("main", self.commit)


class HubServer:
    def __init__(self, repos: dict[str, HubRepo]) -> None:
        self.repos = repos
        self.requests: list[tuple[str, str]] = []

    def resolve(self, repo: str, rev: str) -> str | None:
        r = self.repos.get(repo)
        if r is None:
            return None
        if rev in r.branches:
            return r.branches[rev]
        return r.commit if rev == r.commit else None

    @contextmanager
    def run(self) -> Iterator[str]:
        hub = self

        class Handler(_Handler):
            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                path = unquote(urlsplit(self.path).path)
                hub.requests.append((self.command, path))
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path)
                if m:
                    return self.model_info(m.group(1), m.group(2))
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if m:
                    return self.resolve_file(m.group(1), m.group(2), m.group(3))
                self.send_json(404, {"error": "Not Found"})

            def model_info(self, repo: str, rev: str) -> None:
                if repo not in hub.repos:
                    return self.send_json(401, {"error": "Repository not found"},
                                          {"X-Error-Code": "RepoNotFound"})
                sha = hub.resolve(repo, rev)
                if sha is None:
                    return self.send_json(404, {"error": f"Invalid rev id: {rev}"},
                                          {"X-Error-Code": "RevisionNotFound"})
                files = hub.repos[repo].files
                siblings = []
                for name, data in sorted(files.items()):
                    sib: dict[str, Any] = {"rfilename": name, "size": len(data),
                                           "blobId": hashlib.sha1(data).hexdigest()}
                    if name.endswith((".safetensors", ".gguf")):
                        sib["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                      "pointerSize": 134}
                    siblings.append(sib)
                self.send_json(200, {"_id": repo, "id": repo, "modelId": repo, "sha": sha,
                                     "private": False, "siblings": siblings, "tags": []})

            def resolve_file(self, repo: str, rev: str, name: str) -> None:
                sha = hub.resolve(repo, rev)
                if sha is None:
                    return self.send_json(404, {"error": "Revision not found"},
                                          {"X-Error-Code": "RevisionNotFound"})
                data = hub.repos[repo].files.get(name)
                if data is None:
                    return self.send_json(404, {"error": "Entry not found"},
                                          {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": sha})
                lfs = name.endswith((".safetensors", ".gguf"))
                etag = hashlib.sha256(data).hexdigest() if lfs else hashlib.sha1(data).hexdigest()
                headers = {"ETag": f'"{etag}"', "X-Repo-Commit": sha,
                           "Content-Type": "application/octet-stream"}
                if lfs:
                    headers["X-Linked-Etag"] = f'"{etag}"'
                    headers["X-Linked-Size"] = str(len(data))
                self.send_bytes(data, headers)

        with serving(Handler) as url:
            yield url


# -- plain HTTP -------------------------------------------------------------------------------


class FileServer:
    """Serves ``files``; ``cut[name] = n`` drops the first response for it after n bytes."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.cut: dict[str, int] = {}
        self.ranges: list[str | None] = []
        self.gate: threading.Event | None = None  # when set, bodies wait for it
        self.chunk_delay = 0.0  # seconds between 64 KiB chunks (a slow link)

    @contextmanager
    def run(self) -> Iterator[str]:
        fs = self

        class Handler(_Handler):
            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                name = unquote(urlsplit(self.path).path).lstrip("/")
                data = fs.files.get(name)
                if data is None:
                    return self.send_json(404, {"error": "not found"})
                fs.ranges.append(self.headers.get("Range"))
                cut = fs.cut.pop(name, None)
                if fs.gate is not None:
                    fs.gate.wait(30)
                self.send_bytes(data, {"Content-Type": "application/octet-stream"}, cut_after=cut,
                                delay=fs.chunk_delay)

        with serving(Handler) as url:
            yield url


# -- Ollama registry --------------------------------------------------------------------------


class OllamaRegistry:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], bytes] = {}
        self.tamper: set[str] = set()  # digests served with wrong bytes

    def add_blob(self, data: bytes) -> dict[str, Any]:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    def add_model(self, name: str, tag: str, gguf: bytes, template: str | None = None) -> None:
        config = self.add_blob(json.dumps({"model_format": "gguf"}).encode())
        layers = [{"mediaType": "application/vnd.ollama.image.model", **self.add_blob(gguf)}]
        if template is not None:
            layers.append({"mediaType": "application/vnd.ollama.image.template",
                           **self.add_blob(template.encode())})
        layers.append({"mediaType": "application/vnd.ollama.image.params",
                       **self.add_blob(json.dumps({"stop": ["<|im_end|>"]}).encode())})
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
            "layers": layers,
        }
        self.manifests[(name, tag)] = json.dumps(manifest).encode()

    @contextmanager
    def run(self) -> Iterator[str]:
        reg = self

        class Handler(_Handler):
            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                path = unquote(urlsplit(self.path).path)
                m = re.fullmatch(r"/v2/(.+)/manifests/([^/]+)", path)
                if m:
                    body = reg.manifests.get((m.group(1), m.group(2)))
                    if body is None:
                        return self.send_json(404, {"errors": [{"code": "MANIFEST_UNKNOWN"}]})
                    return self.send_bytes(body, {
                        "Content-Type": "application/vnd.docker.distribution.manifest.v2+json",
                        "Docker-Content-Digest": "sha256:" + hashlib.sha256(body).hexdigest(),
                    })
                m = re.fullmatch(r"/v2/(.+)/blobs/(sha256:[0-9a-f]{64})", path)
                if m:
                    data = reg.blobs.get(m.group(2))
                    if data is None:
                        return self.send_json(404, {"errors": [{"code": "BLOB_UNKNOWN"}]})
                    if m.group(2) in reg.tamper:
                        data = data[:-1] + bytes([data[-1] ^ 0xFF])
                    return self.send_bytes(data, {"Content-Type": "application/octet-stream",
                                                  "Docker-Content-Digest": m.group(2)})
                self.send_json(404, {"errors": [{"code": "NAME_UNKNOWN"}]})

        with serving(Handler) as url:
            yield url
