"""Key secrets: how they are made, what is stored of them, and how one is recognised.

A secret is ``ck-`` followed by 32 random bytes, URL-safe base64 (43 characters): 256 bits
from the operating system's CSPRNG. Only its SHA-256 is stored, plus an 11-character display
prefix (``ck-`` and 8 characters) so that a person can tell keys apart in a list.

Why a plain SHA-256 and not bcrypt, scrypt or Argon2: a slow KDF exists to make guessing a
*low-entropy* password from its hash expensive. Nobody can enumerate 2^256 candidates (or
the 2^208 left after the prefix) whatever the hash costs, so stretching adds no security; it
would only add ~50-100 ms to every request that misses the cache, on the hot path of both
servers. A fast, unsalted hash also lets authentication find the key by an index lookup on
the hash instead of trying each stored salt (GitHub's and Stripe's tokens are stored the same
way).
"""

from __future__ import annotations

import hashlib
import secrets

SECRET_PREFIX = "ck-"
SECRET_BYTES = 32
DISPLAY_CHARS = 8


def new_secret() -> str:
    """A fresh key secret (``ck-`` + 43 URL-safe characters)."""
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def hash_secret(secret: str) -> str:
    """What is stored of a secret: its SHA-256, hex."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def display_prefix(secret: str) -> str:
    """The part of a secret shown in lists (``ck-AbCd1234``); far too short to guess the rest."""
    return secret[: len(SECRET_PREFIX) + DISPLAY_CHARS]


def looks_like_key(secret: str) -> bool:
    """Whether ``secret`` could be a key made by :func:`new_secret` (cheap pre-check)."""
    return secret.startswith(SECRET_PREFIX) and 20 <= len(secret) <= 200


def new_id(prefix: str) -> str:
    """A record id: ``prefix`` + 16 hex characters."""
    return prefix + secrets.token_hex(8)
