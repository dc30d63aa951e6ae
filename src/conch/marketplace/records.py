"""Manifests: what a publisher sends, how it is checked and normalised, and its digest.

A manifest is ``{name, version, description, system_prompt, tools, model, category, tags,
author}``; its digest is ``sha256:`` of the manifest in the JSON Canonicalization Scheme
(RFC 8785), so any conch server (or anyone else) recomputes the same digest from the same
fields. ``published_at`` and ``downloads`` describe a registry's copy, not the agent, and are
not part of it.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import asdict, dataclass
from typing import Any

import rfc8785
from pydantic import BaseModel, ConfigDict, Field

from conch.marketplace.errors import IntegrityError, invalid

MAX_NAME = 64
MAX_DESCRIPTION = 2_000
MAX_SYSTEM_PROMPT = 20_000
MAX_TOOLS = 64
MAX_MODEL = 200
MAX_CATEGORY = 40
MAX_TAGS = 20
MAX_TAG = 40
MAX_AUTHOR = 100
MAX_VERSION = 64

DEFAULT_CATEGORY = "general"

_SEPARATORS = re.compile(r"[\s._\-]+")
_SLUG = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
_PROVIDER = re.compile(r"^[a-z][a-z0-9_-]*$")


class PublishRequest(BaseModel):
    """The body of ``POST /marketplace/publish``: five required fields, then optional ones.

    Sizes are checked here so that an oversize field is refused before anything else, with
    the field's name in the error."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=MAX_NAME * 2)
    description: str = Field(min_length=1, max_length=MAX_DESCRIPTION)
    system_prompt: str = Field(min_length=1, max_length=MAX_SYSTEM_PROMPT)
    tools: list[str] = Field(max_length=MAX_TOOLS)
    model: str = Field(min_length=1, max_length=MAX_MODEL)
    version: str | None = Field(default=None, max_length=MAX_VERSION)
    category: str | None = Field(default=None, max_length=MAX_CATEGORY)
    tags: list[str] = Field(default_factory=list, max_length=MAX_TAGS)
    author: str | None = Field(default=None, max_length=MAX_AUTHOR)


@dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    description: str
    system_prompt: str
    tools: list[str]
    model: str
    category: str
    tags: list[str]
    author: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def digest(self) -> str:
        return manifest_digest(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        return cls(**{f: data[f] for f in MANIFEST_FIELDS})


MANIFEST_FIELDS = (
    "name",
    "version",
    "description",
    "system_prompt",
    "tools",
    "model",
    "category",
    "tags",
    "author",
)


def manifest_digest(manifest: dict[str, Any]) -> str:
    """``sha256:<hex>`` of the RFC 8785 canonical JSON of the manifest fields."""
    canonical = rfc8785.dumps({f: manifest.get(f) for f in MANIFEST_FIELDS})
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def slug(text: str, field: str, max_length: int) -> str:
    """``text`` as a lowercase slug: compatibility-normalised (NFKC, so full-width and
    ligature look-alikes become plain ASCII), case-folded, runs of spaces, dots, underscores
    and hyphens made one hyphen (as PyPI normalises names). What is left must be ASCII
    letters and digits: other scripts' look-alikes (a Cyrillic ``а``) are refused rather
    than allowed to pass for a Latin name."""
    folded = unicodedata.normalize("NFKC", text).casefold().strip()
    out = _SEPARATORS.sub("-", folded).strip("-")
    if not out:
        raise invalid(f"{field} must contain letters or digits", field)
    if not _SLUG.match(out):
        bad = sorted({ch for ch in out if not (ch.isascii() and (ch.isalnum() or ch == "-"))})
        shown = ", ".join(repr(ch) for ch in bad[:5])
        raise invalid(
            f"{field} {text!r} may only use ASCII letters, digits and - . _ (not {shown})", field
        )
    if len(out) > max_length:
        raise invalid(f"{field} is longer than {max_length} characters", field)
    return out


RESERVED_NAMES = frozenset({"default"})  # the orchestration's built-in agent


def normalise_name(name: str) -> str:
    return slug(name, "name", MAX_NAME)


def publishable_name(name: str) -> str:
    key = normalise_name(name)
    if key in RESERVED_NAMES:
        raise invalid(f"the name {key!r} is reserved", "name")
    return key


def check_model(model: str) -> str:
    """``<provider>:<model>`` (split on the first colon, as the inference server routes it)."""
    provider, sep, rest = model.strip().partition(":")
    if not sep or not rest.strip() or not _PROVIDER.match(provider):
        raise invalid(
            f"model {model!r} must be '<provider>:<model>', e.g. 'local:smollm2-135m-instruct' "
            "or 'ollama:qwen2.5:7b'",
            "model",
        )
    if any(ch.isspace() or unicodedata.category(ch).startswith("C") for ch in rest):
        raise invalid(f"model {model!r} contains spaces or control characters", "model")
    return f"{provider}:{rest}"


def check_tools(tools: list[str]) -> list[str]:
    """Every tool must be a builtin of this server's language; aliases become the builtin's
    own name. Listing one twice is refused rather than silently merged."""
    from conch.lang.builtins.registry import REGISTRY, lookup
    from conch.lang.errors import did_you_mean

    out: list[str] = []
    for i, tool in enumerate(tools):
        builtin = lookup(tool.strip())
        if builtin is None:
            hint = did_you_mean(tool, REGISTRY)
            message = f"unknown tool {tool!r}: tools must be builtin names"
            if hint:
                message += f" ({hint})"
            raise invalid(message, f"tools[{i}]")
        if builtin.name in out:
            raise invalid(f"tool {builtin.name!r} is listed twice", f"tools[{i}]")
        out.append(builtin.name)
    return out


def check_text(value: str, field: str) -> str:
    text = value.strip()
    if not text:
        raise invalid(f"{field} must not be empty", field)
    return text


def build_manifest(req: PublishRequest, version: str) -> Manifest:
    """The normalised manifest of a publish request at ``version`` (already checked)."""
    category = slug(req.category, "category", MAX_CATEGORY) if req.category else DEFAULT_CATEGORY
    tags: list[str] = []
    for i, tag in enumerate(req.tags):
        t = slug(tag, f"tags[{i}]", MAX_TAG)
        if t not in tags:
            tags.append(t)
    author = req.author.strip() or None if req.author is not None else None
    return Manifest(
        name=publishable_name(req.name),
        version=version,
        description=check_text(req.description, "description"),
        system_prompt=check_text(req.system_prompt, "system_prompt"),
        tools=check_tools(req.tools),
        model=check_model(req.model),
        category=category,
        tags=tags,
        author=author,
    )


def verify(manifest: dict[str, Any], digest: str, where: str) -> None:
    """Refuse a record whose manifest does not hash to its digest (tampered or corrupted)."""
    actual = manifest_digest(manifest)
    if actual != digest:
        raise IntegrityError(
            f"{where}: {manifest.get('name')}@{manifest.get('version')} does not match its "
            f"digest (recorded {digest}, computed {actual}); refusing to install it",
        )
