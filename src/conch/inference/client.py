"""How conch programs reach models: ``ai`` and ``embed`` send OpenAI chat and embeddings
requests through one of these.

- :class:`HTTPModels`: the inference server's API at ``models_url``. The agent server's
  sandbox workers always use it: they never load a model themselves.
- :class:`InProcessModels`: the shell's own serving layer (local engines and the providers
  of its configuration, built as the server builds them: ``serving/stack.py``) in a
  background thread, so ``conch -c 'ai("hi")'`` needs no server.

Both are synchronous (programs run synchronously) and raise :class:`ModelCallError` with
the server's status and message.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from conch import errors

if TYPE_CHECKING:
    from conch.inference.serving.stack import ServingStack


class ModelCallError(errors.DomainError):
    """A model call that failed, with the status, message and code the inference server
    answered (the in-process serving layer's errors are reported the same way)."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message, status=status, code=code)


class HTTPModels:
    def __init__(self, base_url: str, timeout_s: float, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else None

    def _post(self, path: str, body: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        import httpx

        url = f"{self.base_url}{path}"
        try:
            # Proxies from the environment are ignored: models_url is the inference server.
            response = httpx.post(url, json=body, headers=self.headers,
                                  timeout=timeout or self.timeout_s, trust_env=False)
        except httpx.TimeoutException:
            raise ModelCallError(504, f"the inference server at {self.base_url} did not answer "
                                      f"within {timeout or self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise ModelCallError(
                502, f"cannot reach the inference server at {self.base_url} ({type(exc).__name__}); "
                     "start it with `conch models serve` or `conch up`, or set models_url") from None
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code >= 400:
            err = data.get("error") if isinstance(data, dict) else None
            message = err.get("message") if isinstance(err, dict) else response.text[:500]
            code = err.get("code") if isinstance(err, dict) else None
            raise ModelCallError(response.status_code, str(message), code)
        if not isinstance(data, dict):
            raise ModelCallError(502, f"the inference server at {self.base_url} answered something "
                                      "that is not JSON")
        return data

    def chat(self, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self._post("/chat/completions", body, timeout)

    def embed(self, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        return self._post("/embeddings", body, timeout)


class InProcessModels:
    """The serving layer of this process, on an event loop in a daemon thread (created on
    first use, kept for the life of the process, as a REPL session calls ``ai`` often)."""

    _lock = threading.Lock()
    _instances: dict[str, InProcessModels] = {}

    def __init__(self, settings: Any) -> None:
        import asyncio

        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="conch-models", daemon=True)
        self.thread.start()
        self.stack: ServingStack = self._call(self._start())

    @classmethod
    def for_settings(cls, settings: Any) -> InProcessModels:
        key = str(settings.data_dir)
        with cls._lock:
            inst = cls._instances.get(key)
            if inst is None:
                inst = cls._instances[key] = cls(settings)
            return inst

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        import asyncio

        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise ModelCallError(504, f"no answer within {timeout:g} s") from None
        except ModelCallError:
            raise
        except errors.DomainError as exc:  # what the server would have answered with
            raise ModelCallError(exc.status, exc.message, exc.code) from None

    async def _start(self) -> ServingStack:
        from conch.inference.serving.stack import ServingStack

        stack = ServingStack(self.settings)
        await stack.start()
        return stack

    def chat(self, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        from conch.inference.api.openai import ChatCompletionRequest

        return self._serve(self.stack.chat.create, _validated(ChatCompletionRequest, body), timeout)

    def embed(self, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        from conch.inference.api.openai import EmbeddingRequest

        return self._serve(self.stack.embeddings.create, _validated(EmbeddingRequest, body), timeout)

    def _serve(self, create: Callable[[Any], Awaitable[dict[str, Any]]], req: Any,
               timeout: float | None) -> dict[str, Any]:
        return dict(self._call(create(req), timeout))


def _validated(model: Any, body: dict[str, Any]) -> Any:
    """``body`` as the request ``model``; invalid, the 400 a caller of the server would get."""
    from pydantic import ValidationError

    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ModelCallError(400, f"invalid request: {where}: {first.get('msg')}") from None
