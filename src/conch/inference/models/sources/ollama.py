"""An Ollama registry (OCI distribution protocol): the manifest, then layers by digest.

The model layer is the GGUF file; its sha256 must equal the digest it was fetched by. The
chat template, parameters and system prompt layers are small text files kept next to it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

import httpx

from conch.inference.models.files import ProgressCallback
from conch.inference.models.sources import errors
from conch.inference.models.sources.base import (
    FetchRequest,
    FetchResult,
    report,
)
from conch.inference.models.sources.http_download import TIMEOUT, download

NAME = "ollama"
DEFAULT_REGISTRY = "https://registry.ollama.ai"

MANIFEST_ACCEPT = ", ".join(
    (
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.manifest.v1+json",
    )
)
MODEL_MEDIA = "application/vnd.ollama.image.model"
# media type -> file name in the model directory
TEXT_LAYERS = {
    "application/vnd.ollama.image.template": "template",
    "application/vnd.ollama.image.params": "params.json",
    "application/vnd.ollama.image.system": "system",
    "application/vnd.ollama.image.license": "license",
}


def parse_name(name: str, revision: str | None) -> tuple[str, str]:
    """``llama3.2:1b`` -> (``library/llama3.2``, ``1b``); an explicit revision wins over the tag."""
    repo, tag = name, None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = name.rsplit(":", 1)
    if "/" not in repo:
        repo = f"library/{repo}"
    if not repo or any(part in ("", ".", "..") for part in repo.split("/")):
        raise errors.BadRequest(f"invalid Ollama model name {name!r}")
    return repo, revision or tag or "latest"


def _digest_hex(digest: str) -> str:
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or len(hexpart) != 64:
        raise errors.SourceUnreachable(f"registry sent an unsupported digest {digest!r}")
    return hexpart


def fetch(request: FetchRequest, staging_dir: Path, progress: ProgressCallback | None) -> FetchResult:
    registry = (request.registry or DEFAULT_REGISTRY).rstrip("/")
    repo, tag = parse_name(request.name or request.model_id, request.revision)
    manifest_url = f"{registry}/v2/{repo}/manifests/{tag}"
    report(progress, "pulling manifest")
    with httpx.Client(timeout=TIMEOUT, follow_redirects=True) as http:
        try:
            resp = http.get(manifest_url, headers={"Accept": MANIFEST_ACCEPT})
        except httpx.TransportError as exc:
            raise errors.SourceUnreachable(f"cannot reach Ollama registry {registry}: {exc}")
        if resp.status_code == 404:
            raise errors.NotFound(f"{repo}:{tag} not found in the Ollama registry {registry}")
        if resp.status_code >= 400:
            raise errors.SourceUnreachable(
                f"Ollama registry {registry} answered {resp.status_code} for {manifest_url}"
            )
        try:
            manifest: dict[str, Any] = resp.json()
        except ValueError:
            raise errors.SourceUnreachable(f"Ollama registry {registry} sent a manifest that is not JSON")
        manifest_digest = hashlib.sha256(resp.content).hexdigest()
        layers = manifest.get("layers") or []
        model_layers = [layer for layer in layers if layer.get("mediaType") == MODEL_MEDIA]
        if not model_layers:
            raise errors.BadRequest(f"{repo}:{tag} has no model layer ({MODEL_MEDIA})")
        model_layer = model_layers[0]
        digest = _digest_hex(model_layer["digest"])
        size = int(model_layer.get("size") or 0) or None
        gguf_name = f"{repo.rsplit('/', 1)[-1]}-{tag}.gguf".replace(":", "-")
        part = None
        if request.resume_dir is not None:
            part = request.resume_dir / f"{digest}.part"
        status = f"pulling {digest[:12]}"
        got = download(
            f"{registry}/v2/{repo}/blobs/sha256:{digest}",
            staging_dir / gguf_name,
            part=part,
            sha256=digest,
            size=size,
            progress=progress,
            status=status,
        )
        files = [gguf_name]
        extra: dict[str, Any] = {"registry": registry, "name": f"{repo}:{tag}"}
        for layer in layers:
            fname = TEXT_LAYERS.get(layer.get("mediaType", ""))
            if fname is None:
                continue
            ldigest = _digest_hex(layer["digest"])
            download(
                f"{registry}/v2/{repo}/blobs/sha256:{ldigest}",
                staging_dir / fname,
                sha256=ldigest,
            )
            files.append(fname)
            if fname == "template":
                extra["chat_template_go"] = (staging_dir / fname).read_text(errors="replace")
            elif fname == "params.json":
                with contextlib.suppress(ValueError):
                    extra["params"] = json.loads((staging_dir / fname).read_text())
    if got != digest:
        raise errors.VerificationFailed(f"model layer digest mismatch: expected {digest}, got {got}")
    report(progress, "verifying sha256 digest", size or 0, size or 0)
    return FetchResult(
        files=sorted(files),
        # The tag as resolved now: a tag moves, the manifest's digest does not.
        revision=f"{tag}@sha256:{manifest_digest}",
        format="gguf",
        path=gguf_name,
        sha256=got,
        extra=extra,
    )
