"""The images of a chat request: taken out of its messages, checked against the model, read.

An image part (OpenAI's ``image_url``; Anthropic's ``image`` blocks and Ollama's ``images``
arrive translated into it) becomes a ``{"type": "image"}`` part, and its bytes go into
``ChatSpec.images`` in order. Where an image may come from (docs/inference.md, "Images"):

- a ``data:`` URL with base64 data, as every client sends by default;
- a ``file://`` URL of a file inside conch's data directory (nothing else on the disk);
- an ``http(s)://`` URL only with ``allow_network`` on, and then never a private, loopback or
  link-local address unless ``network_allow`` names it (as the ``http_*`` builtins).

Every refusal is a 400 naming the request field the image came from.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from conch.config import Settings
from conch.inference.engines.base import ImageInput
from conch.inference.serving.errors import InvalidRequest

# The most one image may take (decoded): llama-server reads whatever it is given; a bound
# keeps one request from holding the server's memory.
MAX_IMAGE_BYTES = 20 << 20


@dataclass
class ImageRef:
    url: str
    where: str  # the request field, as the client's API names it


def take_images(messages: list[dict[str, Any]]) -> list[ImageRef]:
    """Replace the image parts of ``messages`` (dumped OpenAI messages) with ``{"type": "image"}``
    parts; return what they referred to, in order. Only user messages may hold images."""
    refs: list[ImageRef] = []
    for i, m in enumerate(messages):
        content = m.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            if part.get("type") != "image_url":
                continue
            where = part.get("source_param") or f"messages[{i}].content[{j}].image_url.url"
            if m.get("role") != "user":
                raise InvalidRequest(f"'{where}': only user messages may hold images, not {m.get('role')} messages",
                                     where=where)
            detail = (part.get("image_url") or {}).get("detail")
            if detail == "low":
                raise InvalidRequest("'detail: low' is not supported: llama.cpp reads every image at its "
                                     "projector's own resolution ('auto' and 'high' do)", where=where.replace(
                                         ".url", ".detail") if where.endswith("image_url.url") else where,
                                     code="unsupported_parameter")
            refs.append(ImageRef(str(part["image_url"]["url"]), where))
            content[j] = {"type": "image"}
    return refs


def refuse_without_projector(model: str, refs: list[ImageRef]) -> None:
    raise InvalidRequest(
        f"'{refs[0].where}' is an image, but the model '{model}' cannot read images: it has no vision "
        "projector (mmproj). Download a vision "
        "model with its mmproj file, or set model_overrides.<id>.mmproj (docs/inference.md, \"Images\")",
        where=refs[0].where, code="unsupported_parameter")


async def read_images(refs: list[ImageRef], settings: Settings) -> list[ImageInput]:
    return [ImageInput(await _read(ref, settings), ref.where) for ref in refs]


async def _read(ref: ImageRef, settings: Settings) -> bytes:
    url, where = ref.url.strip(), ref.where
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        header, sep, data = url.partition(",")
        if not sep or not header.endswith(";base64"):
            raise InvalidRequest(f"'{where}' must be a base64 data URL (data:image/png;base64,...)", where=where)
        return _b64(data, where)
    if scheme == "file":
        return _file(url, settings, where)
    if scheme in ("http", "https"):
        if not settings.allow_network:
            raise InvalidRequest(
                f"'{where}' is a remote URL, which the server fetches only with allow_network = true; "
                "send the image as a base64 data URL", where=where, code="unsupported_parameter")
        return await _fetch(url, settings, where)
    raise InvalidRequest(f"'{where}' must be a data: URL, a file:// URL inside the data directory, "
                         "or (with allow_network) an http(s) URL", where=where)


def decode_base64(data: str, where: str) -> bytes:
    """Base64 image data (Anthropic's and Ollama's fields) -> bytes; 400 naming ``where``."""
    return _b64(data, where)


def _b64(data: str, where: str) -> bytes:
    try:
        raw = base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"'{where}' is not valid base64", where=where) from None
    if not raw:
        raise InvalidRequest(f"'{where}' is empty", where=where)
    if len(raw) > MAX_IMAGE_BYTES:
        raise InvalidRequest(f"'{where}' is larger than {MAX_IMAGE_BYTES >> 20} MB", where=where)
    return raw


def _file(url: str, settings: Settings, where: str) -> bytes:
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise InvalidRequest(f"'{where}' names a file on another host", where=where)
    root = Path(settings.data_dir).resolve()
    path = Path(unquote(parts.path)).resolve()
    if not path.is_relative_to(root):
        raise InvalidRequest(f"'{where}' is outside the data directory ({root}); only files there may be read",
                             where=where)
    try:
        if path.stat().st_size > MAX_IMAGE_BYTES:
            raise InvalidRequest(f"'{where}' is larger than {MAX_IMAGE_BYTES >> 20} MB", where=where)
        return path.read_bytes()
    except OSError as exc:
        raise InvalidRequest(f"'{where}' could not be read: {exc.strerror or exc}", where=where) from None


async def _fetch(url: str, settings: Settings, where: str) -> bytes:
    import httpx

    from conch.lang.netpolicy import NetworkPolicy

    host = urlsplit(url).hostname or ""
    policy = NetworkPolicy(True, settings.network_allow)
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise InvalidRequest(f"'{where}': {host} could not be resolved ({exc})", where=where) from None
    for info in infos:
        ip = str(info[4][0])
        if not policy.allowed(host, ip):
            raise InvalidRequest(f"'{where}': {host} ({ip}) is a private, loopback or link-local address, which "
                                 "the server refuses (network_allow lists exceptions)", where=where)
    try:
        async with httpx.AsyncClient(timeout=settings.http_timeout_s, follow_redirects=False) as client, \
                client.stream("GET", url) as resp:
            if resp.status_code != 200:
                raise InvalidRequest(f"'{where}': fetching it answered HTTP {resp.status_code}", where=where)
            out = bytearray()
            async for block in resp.aiter_bytes():
                out += block
                if len(out) > MAX_IMAGE_BYTES:
                    raise InvalidRequest(f"'{where}' is larger than {MAX_IMAGE_BYTES >> 20} MB", where=where)
            return bytes(out)
    except httpx.HTTPError as exc:
        raise InvalidRequest(f"'{where}' could not be fetched: {exc}", where=where) from None
