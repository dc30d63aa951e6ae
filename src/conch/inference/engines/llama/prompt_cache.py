"""The prompt cache on disk: long prompt prefixes' KV state kept across restarts.

An idle sequence keeps its cells as a cached prefix in memory (``kv_pool``); this keeps the
long ones (system prompts, agent tool lists: ``min_tokens`` and more) on disk too, so a
restarted server skips their prefill. One file per entry under
``<data_dir>/kv-cache/<model>-<fingerprint>/<hash of the tokens>.kv``: a header, the token
ids, and the sequence's state as ``llama_state_seq_get_data`` writes it. The tokens are those
of the cells a prefill computed exactly (``KVPool.seq_exact``); the state may hold more cells
(an answer's), which a restore cuts off.

The fingerprint holds everything that makes a state foreign: the model file (path, size,
modification time), the context's size, KV type, flash attention, micro-batch and GPU
layers, and the llama-cpp-python version. A file whose header names another fingerprint, a
truncated file or one whose checksum does not match is ignored with one log line and deleted:
restoring it could change outputs, and an output must never change because of the cache.

Writes go through a temporary file and ``os.replace`` on a writer thread, so a reader never
sees half a file; the worker thread only copies the state out of the KV cache (a memcpy).
The files together stay under ``max_bytes`` (all models' directories counted), the least
recently used deleted first; a restore or a release finding its prefix already saved counts
as a use.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import re
import struct
import threading
import time
import zlib
from array import array
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conch.inference.engines.base import EngineStats
from conch.inference.engines.llama.backend import init_backend

log = logging.getLogger(__name__)

FORMAT = 1
MAGIC = b"CONCHKV1"
_HEAD = struct.Struct("<8sI")  # magic, length of the JSON header
SUFFIX = ".kv"
# Saves waiting for the writer thread at most; a release beyond it does not save (the
# state is held in memory until written).
MAX_PENDING = 2
# A temporary file this old was left by a process that died while writing.
STALE_TMP_S = 3600.0


class _Bad(Exception):
    """A file that must not be restored (its reason goes to the log)."""


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix (slice comparisons run in C, not per token)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def model_identity(path: str) -> dict[str, Any]:
    """What identifies a model file without reading it: a changed file is another model."""
    st = os.stat(path)
    return {"path": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


@dataclass
class Entry:
    path: Path
    tokens: list[int]  # what the first len(tokens) cells hold; only they are ever used
    n_cells: int  # cells in the state (a restore needs room for all of them)
    size: int = 0
    pending: bool = True  # not on disk yet (the writer thread has it)


class PromptCache:
    def __init__(
        self,
        root: Path,
        *,
        model_id: str,
        model_path: str,
        config: dict[str, Any],
        max_bytes: int,
        min_tokens: int,
        stats: EngineStats,
    ) -> None:
        import llama_cpp

        self.root = Path(root)
        self.max_bytes = max_bytes
        self.min_tokens = max(1, min_tokens)
        self.stats = stats
        fingerprint = {"format": FORMAT, "llama_cpp_python": llama_cpp.__version__,
                       "model": model_identity(model_path), **config}
        self.fingerprint = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model_id).strip("._")[:64] or "model"
        self.dir = self.root / f"{slug}-{self.fingerprint}"
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._pending = 0
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="conch-kv-save")
        self._load_index()

    # -- index -------------------------------------------------------------------------------
    def _load_index(self) -> None:
        """The entries on disk (headers and tokens only); bad and foreign files are deleted."""
        try:
            names = sorted(os.listdir(self.dir))
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("prompt cache: cannot read %s: %s", self.dir, exc)
            return
        now = time.time()
        for name in names:
            path = self.dir / name
            if ".tmp-" in name:
                try:
                    if now - path.stat().st_mtime > STALE_TMP_S:
                        path.unlink()
                except OSError:
                    pass
                continue
            if not name.endswith(SUFFIX):
                continue
            try:
                with open(path, "rb") as fh:
                    tokens, head, _, total = self._read_head(fh)
                size = path.stat().st_size
                if size != total:
                    raise _Bad(f"{size} bytes where the header promises {total} (truncated?)")
            except _Bad as exc:
                self._discard(path, str(exc))
                continue
            except OSError:
                continue
            self._entries[name] = Entry(path, tokens, int(head["n_cells"]), size, pending=False)

    def _read_head(self, fh: Any) -> tuple[list[int], dict[str, Any], int, int]:
        """Tokens, header, offset of the tokens and expected file size; ``_Bad`` if unusable."""
        raw = fh.read(_HEAD.size)
        if len(raw) < _HEAD.size:
            raise _Bad("truncated header")
        magic, hlen = _HEAD.unpack(raw)
        if magic != MAGIC or hlen > 4096:
            raise _Bad("not a conch prompt cache file")
        try:
            head = json.loads(fh.read(hlen))
            n_tokens, state_bytes, fingerprint = int(head["n_tokens"]), int(head["state_bytes"]), head["fingerprint"]
            int(head["crc32"])
            if not 0 < n_tokens <= int(head["n_cells"]) or state_bytes <= 0:
                raise ValueError("sizes out of range")
        except (ValueError, KeyError, TypeError) as exc:
            raise _Bad(f"bad header ({exc})") from None
        if fingerprint != self.fingerprint:
            raise _Bad(f"saved for another model or context (fingerprint {fingerprint}, "
                       f"this model's is {self.fingerprint})")
        tok = array("i")
        data = fh.read(4 * n_tokens)
        if len(data) != 4 * n_tokens:
            raise _Bad("truncated tokens")
        tok.frombytes(data)
        offset = _HEAD.size + hlen
        return tok.tolist(), head, offset, offset + 4 * n_tokens + state_bytes

    def _discard(self, path: Path, reason: str) -> None:
        log.warning("prompt cache: ignoring and deleting %s: %s", path, reason)
        with contextlib.suppress(OSError):
            path.unlink()
        with self._lock:
            self._entries.pop(path.name, None)

    def __len__(self) -> int:
        return len(self._entries)

    # -- restore -----------------------------------------------------------------------------
    def lookup(self, tokens: list[int]) -> tuple[Entry | None, int]:
        """The saved entry sharing the longest prefix with ``tokens``, and that length."""
        best, best_len = None, 0
        with self._lock:
            for entry in self._entries.values():
                if entry.pending:
                    continue
                n = common_prefix(entry.tokens, tokens)
                if n > best_len:
                    best, best_len = entry, n
        return best, best_len

    def restore(self, ctx: Any, seq: int, entry: Entry, *, pool_empty: bool) -> bool:
        """Load ``entry`` into sequence ``seq`` (all its cells: the caller trims). False when
        it could not be loaded; the sequence is then empty."""
        llama_cpp = init_backend()
        path = entry.path
        try:
            with open(path, "rb") as fh:
                tokens, head, offset, total = self._read_head(fh)
                fh.seek(offset)  # tokens and state: what the checksum covers
                data = bytearray(total - offset)
                got = fh.readinto(data)
                if got != len(data) or fh.read(1):
                    raise _Bad("truncated" if got != len(data) else "longer than its header says")
            if tokens != entry.tokens:
                raise _Bad("its tokens changed on disk")
            if zlib.crc32(data) != int(head["crc32"]):
                raise _Bad("checksum mismatch (corrupt)")
        except _Bad as exc:
            self._discard(path, str(exc))
            return False
        except OSError as exc:  # deleted meanwhile (evicted by another process), unreadable
            log.debug("prompt cache: cannot read %s: %s", path, exc)
            with self._lock:
                self._entries.pop(path.name, None)
            return False
        state_bytes = len(data) - 4 * len(tokens)
        buf = (ctypes.c_uint8 * state_bytes).from_buffer(data, 4 * len(tokens))
        if llama_cpp.llama_state_seq_set_data(ctx.ctx, buf, state_bytes, seq) != state_bytes:
            # llama.cpp left the sequence empty. With other cells in the pool the likely cause is
            # no run of free cells long enough; in an empty pool the file itself is at fault.
            llama_cpp.llama_memory_seq_rm(ctx.memory, seq, -1, -1)
            if pool_empty:
                self._discard(path, "llama.cpp did not accept the state")
            else:
                log.debug("prompt cache: no room to restore %s now", path)
            return False
        self._touch(entry)
        return True

    def _touch(self, entry: Entry) -> None:
        with contextlib.suppress(OSError):
            os.utime(entry.path)

    # -- save --------------------------------------------------------------------------------
    def save(self, ctx: Any, seq: int, cells: list[int], exact: int) -> None:
        """Save sequence ``seq`` (holding ``cells``, the first ``exact`` as a prefill computes
        them) unless the disk already gives all but fewer than ``min_tokens`` of those. Called
        by the worker thread while the sequence is idle."""
        tokens = cells[:exact]
        n = len(tokens)
        if n < self.min_tokens:
            return
        llama_cpp = init_backend()
        with self._lock:
            covered, best = 0, None
            for entry in self._entries.values():
                c = common_prefix(entry.tokens, tokens)
                if c > covered:
                    covered, best = c, entry
            if n - covered < self.min_tokens:
                if best is not None and not best.pending:
                    self._touch(best)  # in use, even if served from memory
                return
            if self._pending >= MAX_PENDING:
                return
            size = int(llama_cpp.llama_state_seq_get_size(ctx.ctx, seq))
            if size <= 0 or size + 4 * n + 4096 > self.max_bytes:
                return
            data = bytearray(size)
            buf = (ctypes.c_uint8 * size).from_buffer(data)
            if llama_cpp.llama_state_seq_get_data(ctx.ctx, buf, size, seq) != size:
                return
            del buf  # the bytearray may be handed on once no ctypes view holds it
            key = hashlib.sha256(array("i", tokens).tobytes()).hexdigest()[:32]
            entry = Entry(self.dir / f"{key}{SUFFIX}", tokens, len(cells))
            self._entries[entry.path.name] = entry
            self._pending += 1
        self._writer.submit(self._write, entry, data)

    def _write(self, entry: Entry, state: bytearray) -> None:
        tmp = entry.path.with_name(f"{entry.path.name}.tmp-{os.getpid()}")
        try:
            tokens = array("i", entry.tokens).tobytes()
            crc = zlib.crc32(state, zlib.crc32(tokens))
            head = json.dumps({"fingerprint": self.fingerprint, "n_tokens": len(entry.tokens),
                               "n_cells": entry.n_cells, "state_bytes": len(state), "crc32": crc}).encode()
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(_HEAD.pack(MAGIC, len(head)))
                fh.write(head)
                fh.write(tokens)
                fh.write(state)
            os.replace(tmp, entry.path)
            entry.size = _HEAD.size + len(head) + len(tokens) + len(state)
        except OSError as exc:
            log.warning("prompt cache: cannot write %s: %s", entry.path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            with self._lock:
                self._entries.pop(entry.path.name, None)
                self._pending -= 1
            return
        superseded: list[Entry] = []
        with self._lock:
            entry.pending = False
            self._pending -= 1
            # An entry whose tokens start this one's gives nothing this one does not.
            for name, other in list(self._entries.items()):
                if other is not entry and not other.pending and len(other.tokens) <= len(entry.tokens) \
                        and entry.tokens[: len(other.tokens)] == other.tokens:
                    superseded.append(self._entries.pop(name))
        for other in superseded:
            with contextlib.suppress(OSError):
                other.path.unlink()
        self.stats.prompt_cache_saved_tokens += len(entry.tokens)
        self._evict()

    def _evict(self) -> None:
        """Delete the least recently used files until all models' files fit ``max_bytes``."""
        files: list[tuple[float, int, Path]] = []
        try:
            dirs = [d for d in self.root.iterdir() if d.is_dir()]
        except OSError:
            return
        for d in dirs:
            try:
                for f in d.iterdir():
                    if f.name.endswith(SUFFIX):
                        st = f.stat()
                        files.append((st.st_mtime, st.st_size, f))
            except OSError:
                continue
        total = sum(size for _, size, _ in files)
        for _, size, f in sorted(files, key=lambda t: t[0]):
            if total <= self.max_bytes:
                break
            try:
                f.unlink()
            except OSError:
                continue
            total -= size
            if f.parent == self.dir:
                with self._lock:
                    self._entries.pop(f.name, None)

    def flush(self) -> None:
        """Wait for the saves handed to the writer thread so far."""
        self._writer.submit(lambda: None).result()

    def close(self) -> None:
        self._writer.shutdown(wait=True)
