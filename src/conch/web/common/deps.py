"""Getters for the domain objects an app put on ``app.state``, for ``Depends``.

Both servers build their domain objects once in ``create_app`` and put each on ``app.state``
under a fixed name; a route reaches one through a getter made here, so no route reads
``app.state`` itself and every getter reads it the same way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

from fastapi import Request

T = TypeVar("T")


def state_getter(attr: str, kind: type[T]) -> Callable[[Request], Awaitable[T]]:
    """A dependency returning ``request.app.state.<attr>`` as a ``kind``. A coroutine
    function: FastAPI runs a plain one on a worker thread, a hop every request would pay."""

    async def get(request: Request) -> T:
        return cast(T, getattr(request.app.state, attr))

    get.__name__ = get.__qualname__ = f"get_{attr}"
    return get
