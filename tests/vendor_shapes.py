"""Validate objects field by field against the vendors' own pydantic types.

The SDKs' response types are the vendors' published schemas in code (generated from their
OpenAPI documents: ``openai.types``, ``anthropic.types``; ``ollama._types`` for Ollama). Their
models accept unknown keys, so :func:`strict` also walks the validated object and fails on any
key the vendor's type does not define: a misspelt field is caught, not carried along.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, TypeAdapter


def _known(model: BaseModel) -> set[str]:
    names = set()
    for name, info in type(model).model_fields.items():
        names.add(name)
        if info.alias:
            names.add(info.alias)
    return names


def _walk(value: Any, raw: Any, path: str, allow: Iterable[str]) -> None:
    allowed = set(allow)
    if isinstance(value, BaseModel):
        assert isinstance(raw, Mapping), f"{path}: expected an object, got {raw!r}"
        unknown = set(raw) - _known(value) - {k.rsplit(".", 1)[-1] for k in allowed if k.rsplit(".", 1)[0] == path}
        assert not unknown, f"{path or 'object'}: keys {sorted(unknown)} are not in {type(value).__name__}"
        for name, info in type(value).model_fields.items():
            key = info.alias or name
            if key in raw:
                _walk(getattr(value, name), raw[key], f"{path}.{key}" if path else key, allowed)
    elif isinstance(value, (list, tuple)) and isinstance(raw, list):
        for i, (v, r) in enumerate(zip(value, raw, strict=True)):
            _walk(v, r, f"{path}[]", allowed)
            del i


def strict(kind: Any, obj: dict[str, Any], allow: Iterable[str] = ()) -> Any:
    """``kind`` (a pydantic model or a union type) validates ``obj``; no unknown keys anywhere.

    ``allow`` lists dotted paths of keys the vendor documents but its SDK type omits
    (e.g. ``"models[].name"``).
    """
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        value = kind.model_validate(obj)
    else:
        value = TypeAdapter(kind).validate_python(obj)
    _walk(value, obj, "", allow)
    return value
