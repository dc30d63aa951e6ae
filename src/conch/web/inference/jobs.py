"""A model job (download, convert) on a worker thread, its progress streamed to the client.

``POST /v1/models/:id/download`` and ``/convert`` (SSE) and Ollama's ``/api/pull`` (NDJSON)
show a job's progress events while it runs, then its outcome. A client that leaves stops the
job at its next progress report.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from conch.inference.models.files import ProgressCallback
from conch.inference.models.store import ModelRecord

# (progress callback, cancel event) -> the installed model; both None when nobody watches.
Job = Callable[[ProgressCallback | None, threading.Event | None], ModelRecord]


class JobRun:
    """Iterate :meth:`progress` (which starts the job) to its end, then read :meth:`result`;
    call :meth:`stop` when the client is gone or the stream is over."""

    def __init__(self, job: Job) -> None:
        self._job = job
        self._cancel = threading.Event()
        self._task: asyncio.Future[ModelRecord] | None = None

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

        def report(event: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, dict(event))

        self._task = task = asyncio.ensure_future(asyncio.to_thread(self._job, report, self._cancel))
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                yield getter.result()
                continue
            getter.cancel()
            while not queue.empty():
                yield queue.get_nowait()
            return

    def result(self) -> ModelRecord:
        """The installed model, or the job's exception raised."""
        assert self._task is not None, "progress() runs the job"
        return self._task.result()

    def stop(self) -> None:
        self._cancel.set()
