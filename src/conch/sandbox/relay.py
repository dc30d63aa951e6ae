"""The ``model`` effect's way out of a worker's network namespace: a relay to the inference
server, and nowhere else.

A worker in a network namespace of its own cannot reach the host's loopback, where the
inference server usually listens (``models_url``, ``http://127.0.0.1:8080/v1``). So the
server makes a listening socket at that address and port inside the worker's namespace
(:func:`conch.sandbox.netns.listen_inside`) and serves it here, on its own event loop: each
connection the worker opens to it is joined, byte for byte, to a new connection to the
inference server. Nothing else is reachable through it: one address, one port, chosen by
the server's settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

_CHUNK = 65536


class Relay:
    """Serves one worker's listening socket until :meth:`close`."""

    def __init__(self, server: asyncio.AbstractServer, tasks: set[asyncio.Task[None]]) -> None:
        self.server = server
        self.tasks = tasks

    def close(self) -> None:
        self.server.close()
        for task in list(self.tasks):
            task.cancel()


async def serve(listener: socket.socket, host: str, port: int) -> Relay:
    """Relay every connection accepted on ``listener`` to ``host:port``."""
    tasks: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            tasks.add(task)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError:
                return  # the worker sees its connection closed, as a refused one
            try:
                await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
            finally:
                up_writer.close()
        finally:
            writer.close()
            if task is not None:
                tasks.discard(task)

    server = await asyncio.start_server(handle, sock=listener)
    return Relay(server, tasks)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        if writer.can_write_eof():
            writer.write_eof()
