"""The Hugging Face Hub (or any server that speaks its HTTP API), through ``huggingface_hub``.

The revision (branch, tag or commit) is resolved to a commit first and every file is fetched
at that commit, so a branch moving during the download cannot mix two versions. Files with
an LFS sha256 in the repository listing are checked against it.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from conch.inference.models.files import ProgressCallback, sha256_file
from conch.inference.models.sources import errors
from conch.inference.models.sources.base import (
    TOKENIZER_FILES,
    FetchRequest,
    FetchResult,
    is_mmproj,
    pick_mmproj,
    report,
    staged_result,
)

NAME = "huggingface"
DEFAULT_ENDPOINT = "https://huggingface.co"
PREFERRED_GGUF = ("*q4_k_m*.gguf", "*q4_0*.gguf", "*q8_0*.gguf")
SIDE_FILES = ("config.json", "modules.json", "*.safetensors.index.json", *TOKENIZER_FILES)


def select_files(names: list[str], patterns: list[str] | None) -> list[str]:
    """The files of a repository that make up the model (or those the patterns pick)."""

    def side_files() -> list[str]:
        out = [n for n in names if "/" not in n and any(fnmatch.fnmatch(n, p) for p in SIDE_FILES)]
        out += [n for n in names if n.startswith("1_Pooling/")]
        return out

    if patterns:
        picked = [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]
        if not picked:
            raise errors.NotFound(
                f"no file matches {', '.join(patterns)}; the repository has: "
                + ", ".join(names[:30])
            )
        if any(n.endswith((".safetensors", ".onnx")) for n in picked):
            picked += side_files()
        mmproj = pick_mmproj(names)
        if mmproj and not any(is_mmproj(n) for n in picked) and any(n.endswith(".gguf") for n in picked):
            picked.append(mmproj)  # a GGUF picked by pattern still gets its projector
        return sorted(set(picked))

    # A vision model's projector comes with it, as llama-server's -hf fetches it.
    ggufs = [n for n in names if n.endswith(".gguf") and not is_mmproj(n)]
    mmproj = pick_mmproj(names)
    projector = [mmproj] if mmproj else []
    if len(ggufs) == 1:
        return ggufs + projector
    if ggufs:
        for pat in PREFERRED_GGUF:
            hits = sorted(n for n in ggufs if fnmatch.fnmatch(n.lower(), pat))
            if hits:
                return hits[:1] + projector
        raise errors.BadRequest(
            "the repository has several GGUF files; pick one with `files`, e.g. "
            + ", ".join(sorted(ggufs)[:20])
        )
    weights = [n for n in names if n.endswith(".safetensors") and "/" not in n]
    if weights:
        return sorted(set(weights + side_files()))
    onnx = [n for n in names if n.endswith(".onnx")]
    if onnx:
        return sorted(set(onnx[:1] + side_files()))
    raise errors.BadRequest(
        "the repository has no GGUF, safetensors or ONNX weights; it has: " + ", ".join(names[:30])
    )


def _progress_tqdm(progress: ProgressCallback | None, state: dict[str, int]) -> type:
    """A tqdm class that turns huggingface_hub's byte counts into conch progress reports."""
    from tqdm.auto import tqdm

    class Reporter(tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._seen = 0

        def update(self, n: float | None = 1) -> bool | None:
            step = int(n or 0)
            self._seen += step
            state["completed"] += step
            report(progress, state_status(state), state["completed"], state["total"])
            return None

    return Reporter


def state_status(state: dict[str, Any]) -> str:
    return str(state.get("status", "downloading"))


def _map_error(exc: Exception, what: str) -> Exception:
    from huggingface_hub import errors as hf_errors

    if isinstance(exc, hf_errors.RepositoryNotFoundError | hf_errors.RevisionNotFoundError):
        return errors.NotFound(f"{what}: {str(exc).splitlines()[0]}")
    if isinstance(exc, hf_errors.EntryNotFoundError) and not isinstance(
        exc, hf_errors.LocalEntryNotFoundError
    ):
        return errors.NotFound(f"{what}: {str(exc).splitlines()[0]}")
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return errors.SourceUnreachable(f"{what}: {text}")


def fetch(request: FetchRequest, staging_dir: Path, progress: ProgressCallback | None) -> FetchResult:
    from huggingface_hub import HfApi, hf_hub_download

    repo = request.repo or request.model_id
    if repo.count("/") != 1:
        raise errors.BadRequest(f"a Hugging Face repository is `owner/name`; got {repo!r}")
    endpoint = (request.endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    token = request.token or os.environ.get("HF_TOKEN") or None
    revision = request.revision or "main"
    api = HfApi(endpoint=endpoint, token=token or False)
    report(progress, "resolving revision")
    try:
        info = api.model_info(repo, revision=revision, files_metadata=True, token=token or False)
    except Exception as exc:
        raise _map_error(exc, f"cannot resolve {repo}@{revision} at {endpoint}")
    commit = info.sha or revision
    siblings = {s.rfilename: s for s in (info.siblings or [])}
    chosen = select_files(sorted(siblings), request.files)
    total = sum(int(getattr(siblings[n], "size", None) or 0) for n in chosen)
    state: dict[str, Any] = {"completed": 0, "total": total, "status": "downloading"}
    tqdm_class = _progress_tqdm(progress, state)
    for name in chosen:
        if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
            raise errors.SourceUnreachable(f"the repository listing has an unsafe file name {name!r}")
        state["status"] = f"downloading {name}"
        before = state["completed"]
        report(progress, state["status"], before, total)
        try:
            hf_hub_download(
                repo,
                name,
                revision=commit,
                local_dir=staging_dir,
                endpoint=endpoint,
                token=token or False,
                tqdm_class=tqdm_class,
            )
        except Exception as exc:
            raise _map_error(exc, f"cannot download {name} from {repo}@{commit[:12]}")
        size = int(getattr(siblings[name], "size", None) or 0)
        state["completed"] = before + (size or (staging_dir / name).stat().st_size)
    shutil.rmtree(staging_dir / ".cache", ignore_errors=True)

    report(progress, "verifying sha256", 0, total)
    digests: dict[str, str] = {}
    for name in chosen:
        lfs = getattr(siblings[name], "lfs", None)
        expected = getattr(lfs, "sha256", None) if lfs is not None else None
        if expected is None and isinstance(lfs, dict):
            expected = lfs.get("sha256")
        if expected:
            got = digests[name] = sha256_file(staging_dir / name)
            if got != expected:
                raise errors.VerificationFailed(f"sha256 mismatch for {name}: expected {expected}, got {got}")
    extra = {"repo": repo, "endpoint": endpoint, "requested_revision": revision}
    result = staged_result(staging_dir, commit, extra, digests)
    report(progress, "verifying sha256", total, total)
    return result
