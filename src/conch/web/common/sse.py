"""Server-Sent Events for both servers: the one event encoder, and a response that cancels
its producer when the client goes away.

:class:`EventStreamResponse` sends the chunks of an async iterator as they come and, at the
same time, listens for the client going away; when it does, the iterator is cancelled (so a
run producing nothing for a while is still stopped at once) and closed, which lets the
producer clean up — for a sandbox run, kill its worker.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from conch.web.common.responses import compact_json

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    (b"connection", b"keep-alive"),
]


def encode_event(data: Any, *, event: str | None = None, id: int | str | None = None) -> bytes:
    """One event: optional ``event:`` and ``id:`` lines, then ``data:`` — compact JSON, or a
    string as it is (OpenAI's ``[DONE]``); a multi-line string becomes several ``data:``
    lines, as the SSE format requires. Every streamed token goes through here: the common
    case (no ``id``) is one JSON encoding and one string."""
    if isinstance(data, str):
        payload = data.replace("\n", "\ndata: ")
    else:
        payload = compact_json(data)  # JSON escapes line breaks inside strings: always one line
    if id is not None:
        event_line = f"event: {event}\n" if event is not None else ""
        return f"{event_line}id: {id}\ndata: {payload}\n\n".encode()
    if event is not None:
        return f"event: {event}\ndata: {payload}\n\n".encode()
    return f"data: {payload}\n\n".encode()


# The end of an OpenAI stream.
DONE = encode_event("[DONE]")


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        super().__init__(status_code=200)
        self.chunks = chunks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        group.cancel_scope.cancel()
                        return

            group.start_soon(watch)
            try:
                await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                async for chunk in self.chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:
                pass  # the client went away while we were writing
            finally:
                aclose = getattr(self.chunks, "aclose", None)
                if aclose is not None:
                    with anyio.CancelScope(shield=True):
                        await aclose()
                group.cancel_scope.cancel()
