"""What each route of the inference server needs: open, any key, or a scope
(docs/security.md).

Declared once, here, for the guard (:func:`conch.web.common.auth.guard_routes`) that checks
it after routing; a route this table does not name is admin-only (``/metrics``, provider
validation), and a declaration that names no route stops the server from starting.
"""

from __future__ import annotations

from conch.keys.scopes import INFERENCE, MODELS_WRITE
from conch.web.common.auth import ANY, OPEN, Declarations

_M = "/v1/models/{model_id:path}"

DECLARATIONS = Declarations(
    {
        ("GET", "/v1/health"): OPEN,
        ("GET", "/"): OPEN,
        ("GET", "/api-docs/openapi.json"): ANY,
        ("GET", "/v1/status"): ANY,
        ("GET", "/v1/status/history"): ANY,
        # Generation, embeddings and what they read.
        ("POST", "/v1/chat/completions"): INFERENCE,
        ("POST", "/v1/completions"): INFERENCE,
        ("POST", "/v1/embeddings"): INFERENCE,
        ("POST", "/v1/messages"): INFERENCE,
        ("POST", "/v1/messages/count_tokens"): INFERENCE,
        ("POST", "/v1/responses"): INFERENCE,
        ("GET", "/v1/responses/{response_id}"): INFERENCE,
        ("GET", "/v1/models"): INFERENCE,
        ("GET", _M): INFERENCE,
        ("GET", "/v1/providers"): INFERENCE,
        # Models on disk: pulls, conversions, deletions, the store's space.
        ("POST", f"{_M}/download"): MODELS_WRITE,
        ("POST", f"{_M}/convert"): MODELS_WRITE,
        ("DELETE", _M): MODELS_WRITE,
        ("POST", f"{_M}/load"): MODELS_WRITE,  # stores the model's load settings
        ("GET", "/v1/storage/stats"): MODELS_WRITE,
        ("POST", "/v1/storage/cleanup"): MODELS_WRITE,
        # Ollama's API.
        ("POST", "/api/chat"): INFERENCE,
        ("POST", "/api/generate"): INFERENCE,
        ("POST", "/api/embed"): INFERENCE,
        ("POST", "/api/embeddings"): INFERENCE,
        ("GET", "/api/tags"): INFERENCE,
        ("POST", "/api/show"): INFERENCE,
        ("GET", "/api/ps"): INFERENCE,
        ("GET", "/api/version"): INFERENCE,
        ("POST", "/api/pull"): MODELS_WRITE,
        ("DELETE", "/api/delete"): MODELS_WRITE,
        ("POST", "/api/create"): MODELS_WRITE,
        ("POST", "/api/copy"): MODELS_WRITE,
        ("POST", "/api/push"): MODELS_WRITE,
    },
    prefixes=[
        # The documentation's page and its assets (served with enable_openapi) are public
        # code; the document itself is not.
        ("/swagger-ui", OPEN),
    ],
)
