"""Response shapes to validate against: pieces of OpenAI's published OpenAPI document
(CreateChatCompletionResponse, CreateChatCompletionStreamResponse, CreateEmbeddingResponse,
Model, ListModelsResponse, DeleteModelResponse, Error), transcribed as JSON Schema with
their required fields and types, tightened by the contract's field tables (id prefix,
constant ``object`` values, ``owned_by: local``).
"""

from __future__ import annotations

from typing import Any

import jsonschema

_USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
    },
}

_TOOL_CALL = {
    "type": "object",
    "required": ["id", "type", "function"],
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
        },
    },
}

CHAT_COMPLETION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string", "pattern": "^chatcmpl-.+"},
        "object": {"const": "chat.completion"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "system_fingerprint": {"type": ["string", "null"]},
        "choices": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["index", "message", "finish_reason"],
                "properties": {
                    "index": {"type": "integer"},
                    "finish_reason": {"enum": ["stop", "length", "tool_calls", "content_filter", "function_call"]},
                    "logprobs": {"type": ["object", "null"]},
                    "message": {
                        "type": "object",
                        "required": ["role", "content"],
                        "properties": {
                            "role": {"const": "assistant"},
                            "content": {"type": ["string", "null"]},
                            "refusal": {"type": ["string", "null"]},
                            "tool_calls": {"type": ["array", "null"], "items": _TOOL_CALL},
                        },
                    },
                },
            },
        },
        "usage": _USAGE,
    },
}

CHAT_CHUNK = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string", "pattern": "^chatcmpl-.+"},
        "object": {"const": "chat.completion.chunk"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "system_fingerprint": {"type": ["string", "null"]},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "delta"],
                "properties": {
                    "index": {"type": "integer"},
                    "finish_reason": {"enum": ["stop", "length", "tool_calls", "content_filter", "function_call", None]},
                    "delta": {
                        "type": "object",
                        "properties": {
                            "role": {"enum": ["assistant", None]},
                            "content": {"type": ["string", "null"]},
                            "tool_calls": {
                                "type": ["array", "null"],
                                "items": {
                                    "type": "object",
                                    "required": ["index"],
                                    "properties": {
                                        "index": {"type": "integer"},
                                        "id": {"type": ["string", "null"]},
                                        "type": {"enum": ["function", None]},
                                        "function": {
                                            "type": ["object", "null"],
                                            "properties": {
                                                "name": {"type": ["string", "null"]},
                                                "arguments": {"type": ["string", "null"]},
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
        "usage": {"anyOf": [{"type": "null"}, _USAGE]},
    },
}

EMBEDDING_RESPONSE = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "model": {"type": "string"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["object", "index", "embedding"],
                "properties": {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer"},
                    "embedding": {"anyOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]},
                },
            },
        },
        "usage": {
            "type": "object",
            "required": ["prompt_tokens", "total_tokens"],
            "properties": {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}},
        },
    },
}

MODEL = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
    },
}

MODEL_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL}},
}

MODEL_DELETED = {
    "type": "object",
    "required": ["id", "object", "deleted"],
    "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "deleted": {"type": "boolean"}},
}

ERROR = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "minLength": 1},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


def check(instance: Any, schema: dict[str, Any]) -> None:
    jsonschema.validate(instance, schema)


def check_error(response: Any, status: int, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    check(body, ERROR)
    if code is not None:
        assert body["error"]["code"] == code, body
    if param is not None:
        assert body["error"]["param"] == param, body
    return dict(body["error"])
