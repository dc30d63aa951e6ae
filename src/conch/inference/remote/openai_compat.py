"""OpenAI and every OpenAI-compatible endpoint (vLLM, llama.cpp's server, LM Studio, another
conch), through the official ``openai`` client.

The request conch validated is passed on field for field (the upstream speaks the same
protocol), so nothing is dropped; the answer comes back as the upstream sent it, with
``model`` set to the id the client asked conch for.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx as plain_httpx
import httpx2 as httpx  # the transport the openai client is built on
import openai

from conch.inference.remote import errors
from conch.inference.remote.base import CONCH_ONLY_FIELDS, Provider, Timeouts

OPENAI_URL = "https://api.openai.com/v1"


def _create_params(method: Any) -> frozenset[str]:
    return frozenset(inspect.signature(method).parameters) - {"extra_body", "extra_headers",
                                                                "extra_query", "timeout"}


class OpenAICompatProvider(Provider):
    kind = "openai_compatible"
    # The ``openai`` client runs on httpx2; streams go over plain httpx.
    transport_timeouts = (httpx.TimeoutException, plain_httpx.TimeoutException)

    def __init__(self, id: str, url: str, api_key: str | None, timeouts: Timeouts,
                 kind: str = "openai_compatible", key_required: bool = False) -> None:
        super().__init__(id, url, timeouts)
        self.kind = kind
        self._key = api_key
        self._key_required = key_required
        self.client = openai.AsyncOpenAI(
            base_url=self.url,
            # Local OpenAI-compatible servers ignore the key; the client insists on one.
            api_key=api_key or "unused",
            max_retries=0,  # a retry would hide an outage and break the configured timeout
            timeout=httpx.Timeout(timeouts.read_s, connect=timeouts.connect_s),
        )
        self._http: plain_httpx.AsyncClient | None = None
        self._chat_params = _create_params(self.client.chat.completions.create)
        self._embed_params = _create_params(self.client.embeddings.create)

    def configured(self) -> bool:
        return bool(self._key) or not self._key_required

    def unavailable_reason(self) -> str:
        return (f"provider '{self.id}' has no API key (set OPENAI_API_KEY or "
                f"openai_api_key in conch.toml)")

    def _split(self, body: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
        args: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in body.items():
            if key in CONCH_ONLY_FIELDS or value is None:
                continue
            (args if key in known else extra)[key] = value
        if extra:
            args["extra_body"] = extra
        return args

    async def list_models(self, timeout: float | None = None) -> list[str]:
        self._require_configured()
        client = self.client.with_options(timeout=timeout) if timeout else self.client
        try:
            page = await client.models.list()
            return [m.id for m in page.data]
        except openai.OpenAIError as exc:
            raise self._error(exc, timeout) from None

    async def chat(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        self._require_configured()
        args = self._split(body, self._chat_params)
        try:
            completion = await self.client.chat.completions.create(model=model, **args)
        except openai.OpenAIError as exc:
            raise self._error(exc) from None
        out: dict[str, Any] = completion.to_dict()
        out["model"] = f"{self.id}:{model}"
        return out

    async def chat_stream(self, model: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Streams go over a plain HTTP client, not the ``openai`` one: the upstream speaks the
        protocol conch speaks, so its chunks are relayed as they are (only ``model`` changes),
        without the client's per-request parameter transform and per-chunk model parsing,
        which cost time to first token and tokens/s (docs/benchmarks.md, Providers)."""
        self._require_configured()
        payload = {k: v for k, v in body.items() if k not in CONCH_ONLY_FIELDS and v is not None}
        payload.update(model=model, stream=True)
        http = self._stream_client()
        request = http.build_request("POST", f"{self.url}/chat/completions", json=payload)
        try:
            response = await http.send(request, stream=True)
        except plain_httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        if response.status_code >= 400:
            try:
                raw = await response.aread()
            finally:
                await response.aclose()
            try:
                data = json.loads(raw)
            except ValueError:
                data = None
            raise errors.status_error(self.id, response.status_code, data, raw.decode("utf-8", "replace")[:500])
        return self._relay(response, f"{self.id}:{model}")

    def _stream_client(self) -> plain_httpx.AsyncClient:
        if self._http is None:
            headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
            self._http = plain_httpx.AsyncClient(
                headers=headers, trust_env=False,
                timeout=plain_httpx.Timeout(self.timeouts.read_s, connect=self.timeouts.connect_s),
                limits=plain_httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return self._http

    async def _relay(self, response: plain_httpx.Response, model: str) -> AsyncIterator[dict[str, Any]]:
        done = False
        try:
            async for line in response.aiter_lines():
                # After [DONE] the body is read to its end: a response closed early takes its
                # connection with it, and the next request would pay for a new one.
                if done or not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if isinstance(chunk, dict) and "error" in chunk and "choices" not in chunk:
                    err = chunk["error"]
                    message = err.get("message") if isinstance(err, dict) else str(err)
                    raise errors.ProviderUnreachable(self.id, f"failed mid-stream: {message}")
                chunk["model"] = model
                yield chunk
        except plain_httpx.HTTPError as exc:  # the body broke off between events
            raise self._transport_error(exc) from None
        except ValueError:
            raise errors.ProviderUnreachable(self.id, "sent a stream event that is not JSON") from None
        finally:
            await response.aclose()

    async def embed(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        self._require_configured()
        args = self._split(body, self._embed_params)
        # Unless asked for base64, ask for floats: the client otherwise requests base64 and
        # decodes it, which an upstream without base64 support (some servers) refuses.
        args.setdefault("encoding_format", "float")
        try:
            result = await self.client.embeddings.create(model=model, **args)
        except openai.OpenAIError as exc:
            raise self._error(exc) from None
        out: dict[str, Any] = result.to_dict()
        out["model"] = f"{self.id}:{model}"
        return out

    async def aclose(self) -> None:
        await self.client.close()
        if self._http is not None:
            await self._http.aclose()

    # -- errors ------------------------------------------------------------------------------
    def _error(self, exc: openai.OpenAIError, timeout: float | None = None) -> errors.ProviderError:
        if isinstance(exc, openai.APITimeoutError):
            return self._timed_out(timeout)
        if isinstance(exc, openai.APIConnectionError):
            cause = exc.__cause__
            detail = f" ({type(cause).__name__})" if cause is not None else ""
            return errors.ProviderUnreachable(self.id, f"cannot reach {self.url}{detail}")
        if isinstance(exc, openai.APIStatusError):
            return errors.status_error(self.id, exc.status_code, exc.body, exc.message)
        if isinstance(exc, openai.APIError):  # an error event inside a stream
            return errors.ProviderUnreachable(self.id, exc.message)
        return errors.ProviderUnreachable(self.id, str(exc))

