"""What a session may ask for: its TTL, run limits and permissions, checked against the server's.

A session may lower the server's limits and permissions, never raise them: a request over
the server's value is a ``400`` naming the field (``limits.steps``, ``allow_network``), not a
value quietly capped. What the session gets is fixed when it is made (the row's ``limits``
holds all five, the requested ones and the server's for the rest); a run applies the lower
of those and the server's limits at run time (:func:`run_limits`), so a server restarted with
lower limits lowers every session's too.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

from conch.config import Settings
from conch.sessions.errors import InvalidRequest

# A session's limit -> the server setting it lowers (the names of conch.lang.context.Limits).
LIMIT_SETTINGS: dict[str, str] = {
    "wall_time_s": "wall_time_s",
    "steps": "max_steps",
    "recursion": "max_recursion",
    "output_bytes": "max_output_bytes",
    "collection_size": "max_collection_size",
}
# The longest TTL a session may ask for (a year): past it expiry times stop being useful, and
# a huge number would overflow the timestamps answers render.
MAX_TTL_S = 365 * 86_400.0


def server_limits(settings: Settings) -> dict[str, float | int]:
    """The server's run limits, named as a session names them."""
    return {key: getattr(settings, name) for key, name in LIMIT_SETTINGS.items()}


def _number(key: str, value: Any) -> float | int:
    where = f"limits.{key}"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{where} must be a number, not {type(value).__name__}", where=where)
    if key != "wall_time_s" and not (isinstance(value, int) or float(value).is_integer()):
        raise InvalidRequest(f"{where} must be a whole number, not {value!r}", where=where)
    if not math.isfinite(value) or value <= 0:
        raise InvalidRequest(f"{where} must be greater than 0, not {value!r}", where=where)
    return float(value) if key == "wall_time_s" else int(value)


def session_limits(
    requested: Mapping[str, Any] | None, settings: Settings
) -> dict[str, float | int]:
    """All five limits of a new session: those ``requested`` (each at most the server's), the
    server's for the rest. ``InvalidRequest`` names the first field at fault."""
    out = server_limits(settings)
    if requested is None:
        return out
    if not isinstance(requested, Mapping):
        raise InvalidRequest("limits must be an object", where="limits")
    for key, value in requested.items():
        if key not in out:
            close = difflib.get_close_matches(str(key), list(out), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidRequest(
                f"limits.{key} is not a limit{hint}; the limits are " + ", ".join(out),
                where=f"limits.{key}",
            )
        if value is None:
            continue
        number = _number(key, value)
        if number > out[key]:
            raise InvalidRequest(
                f"limits.{key} is {number}, over the server's {out[key]}: a session may lower "
                "the server's limits, never raise them",
                where=f"limits.{key}",
            )
        out[key] = number
    return out


def run_limits(stored: Mapping[str, Any], settings: Settings) -> dict[str, float | int]:
    """The limits a run of the session gets: the lower of the session's and the server's now."""
    out = server_limits(settings)
    for key, value in stored.items():
        if key in out and isinstance(value, int | float) and value < out[key]:
            out[key] = value
    return out


def session_permissions(
    allow_network: bool | None, allow_process: bool | None, settings: Settings
) -> tuple[bool, bool]:
    """``(allow_network, allow_process)`` of a new session: the server's unless lowered; asking
    for a permission the server does not give is ``InvalidRequest``."""
    out = []
    for name, value in (("allow_network", allow_network), ("allow_process", allow_process)):
        server = bool(getattr(settings, name))
        if value is None:
            out.append(server)
            continue
        if not isinstance(value, bool):
            raise InvalidRequest(f"{name} must be true or false", where=name)
        if value and not server:
            raise InvalidRequest(
                f"{name}: this server does not allow it ({name} is off), and a session may "
                "lower the server's permissions, never raise them",
                where=name,
            )
        out.append(value)
    return out[0], out[1]


def session_ttl(ttl_s: Any, settings: Settings) -> float:
    """The TTL of a new session: ``ttl_s``, or ``session_ttl_s`` when it is None."""
    if ttl_s is None:
        return float(settings.session_ttl_s)
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not math.isfinite(ttl_s):
        raise InvalidRequest("ttl_s must be a number of seconds", where="ttl_s")
    if ttl_s <= 0 or ttl_s > MAX_TTL_S:
        raise InvalidRequest(
            f"ttl_s must be more than 0 and at most {int(MAX_TTL_S)} (a year), not {ttl_s!r}",
            where="ttl_s",
        )
    return float(ttl_s)
