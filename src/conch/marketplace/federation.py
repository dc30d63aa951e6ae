"""The upstream marketplace: another conch server whose agents this one also offers.

Calls are bounded by a short timeout, and after a failure the upstream is left alone for a
few seconds, so that an upstream that is down costs local search one timeout at most now and
then, never every request. Requests carry :data:`HOP_HEADER`, and a server answering one does
not consult its own upstream: two servers pointed at each other do not loop.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import quote

import httpx

HOP_HEADER = "X-Conch-Federation"
_PREFIX = "/api/v1/marketplace"


class UpstreamUnavailable(Exception):
    """The upstream did not answer usefully; the message says why, for the response's note."""


class Upstream:
    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 2.0,
        backoff_s: float = 5.0,
    ) -> None:
        base = url.rstrip("/")
        # Accept the server's base URL or the marketplace's own.
        for suffix in (_PREFIX, "/api/v1"):
            if base.endswith(suffix):
                base = base[: -len(suffix)]
        self.url = base
        headers = {HOP_HEADER: "1", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._client = httpx.Client(base_url=base + _PREFIX, headers=headers, timeout=timeout_s)
        self._backoff_s = backoff_s
        self._down_until = 0.0
        self._down_reason = ""
        self._lock = threading.Lock()

    def close(self) -> None:
        self._client.close()

    def _get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        now = time.monotonic()
        with self._lock:
            if now < self._down_until:
                raise UpstreamUnavailable(
                    f"{self._down_reason} (not retried for {self._down_until - now:.0f} s)"
                )
        try:
            response = self._client.get(path, params=params)
        except httpx.TimeoutException:
            self._failed(f"no answer within {self._client.timeout.read} s")
        except httpx.HTTPError as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            self._failed(f"answered HTTP {response.status_code}")
        try:
            return response.json()
        except ValueError:
            self._failed("answered something that is not JSON")

    def _failed(self, reason: str) -> Any:
        with self._lock:
            self._down_reason = f"upstream {self.url} unreachable: {reason}"
            self._down_until = time.monotonic() + self._backoff_s
        raise UpstreamUnavailable(self._down_reason)

    def search(self, q: str, category: str | None, limit: int) -> dict[str, Any]:
        params: dict[str, Any] = {"q": q, "limit": limit, "offset": 0}
        if category:
            params["category"] = category
        data = self._get("/search", params)
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            self._failed("answered a search without results")
        return data  # type: ignore[no-any-return]

    def agents(self) -> list[dict[str, Any]]:
        data = self._get("/agents")
        if not isinstance(data, list):
            self._failed("answered a list that is not an array")
        return data  # type: ignore[no-any-return]

    def versions(self, name: str) -> list[dict[str, Any]] | None:
        """Every published version of ``name`` upstream, or ``None`` when it has none."""
        data = self._get(f"/agents/{quote(name, safe='')}")
        if data is None:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("versions"), list):
            self._failed("answered an agent without versions")
        return data["versions"]  # type: ignore[no-any-return]
