"""JSON as both servers write it: compact, non-ASCII text as it is, by one encoder built once
(``json.dumps`` with options other than its defaults builds a new encoder on every call)."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(compact_json(data), status_code=status, media_type="application/json", headers=headers)
