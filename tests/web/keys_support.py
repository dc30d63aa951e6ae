"""What the keys tests of both servers share: an admin key, keys made through the agent
server's API, and each API's error shapes (a refusal reads as that API's own error)."""

from __future__ import annotations

from typing import Any

import httpx

ADMIN_KEY = "admin-key-for-the-keys-tests"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def make_key(agent_url: str, **body: Any) -> tuple[str, str]:
    """A key made through ``POST /api/v1/keys`` as the admin: ``(id, secret)``."""
    body.setdefault("name", "test key")
    body.setdefault("scopes", [])
    r = httpx.post(agent_url + "/api/v1/keys", json=body, headers=ADMIN, timeout=30)
    assert r.status_code == 201, r.text
    data = r.json()
    return data["id"], data["secret"]


def api_of(path: str, server: str = "inference") -> str:
    """Which API's error shape a path of ``server`` (agent, inference) answers in: agent,
    openai, anthropic, ollama, responses."""
    if server == "agent" or path.startswith("/api/v1/"):
        return "agent"
    if path.startswith("/api/") and not path.startswith("/api-docs"):
        return "ollama"
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/responses"):
        return "responses"
    return "openai"


def error_message(api: str, body: Any) -> str:
    """The message of an error body in ``api``'s shape (asserting the shape)."""
    if api == "agent":
        assert body["success"] is False, body
        assert set(body["error"]) >= {"kind", "message"}, body
        return str(body["error"]["message"])
    if api == "ollama":
        assert isinstance(body, dict) and isinstance(body.get("error"), str), body
        return str(body["error"])
    if api == "anthropic":
        assert body["type"] == "error" and set(body["error"]) >= {"type", "message"}, body
        return str(body["error"]["message"])
    # OpenAI's (and the Responses API's): {"error": {"message", "type", "param", "code"}}
    assert set(body["error"]) >= {"message", "type", "code"}, body
    return str(body["error"]["message"])


def error_type(api: str, body: Any) -> str | None:
    """The error's kind as the API names it (agent ``kind``, OpenAI/Anthropic ``type``)."""
    if api == "agent":
        return str(body["error"]["kind"])
    if api == "ollama":
        return None
    return str(body["error"]["type"])
