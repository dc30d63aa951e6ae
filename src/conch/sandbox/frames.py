"""The frames between the server and its sandbox workers: a 4-byte big-endian header, then
UTF-8 JSON (never pickle: a subverted worker must not be able to make the server run anything).

A frame is encoded by orjson, several times faster than the standard library on the arrays
that pipelines carry, where orjson is exact: it refuses integers beyond 64 bits and writes
NaN and the infinities as ``null``. So a message that may hold such values is encoded by the
standard library instead (:func:`encode_exact`), and the header's top bit says so. Such a
frame is read by msgspec, which reads integers of any size exactly, and by the standard
library when msgspec refuses it (NaN, the infinities, a lone surrogate). Frames are at most
256 MiB, which leaves that bit free.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import msgspec
import orjson

HEADER = struct.Struct(">I")
MAX_FRAME = 256 * 1024 * 1024
EXACT = 0x8000_0000  # the header's flag: written by the standard library, read exactly

# One encoder, reused for every frame and body: ``json.dumps`` with arguments builds a new
# JSONEncoder on each call, which costs as much as encoding a small envelope.
COMPACT_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(value: Any) -> bytes:
    """Compact JSON of finite values (an envelope for a client), by orjson where it can."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return COMPACT_JSON.encode(value).encode("utf-8")


def encode(message: Any) -> bytes:
    """A frame of values known to be finite (what a worker sends: its values went through
    ``to_json_value``); an integer too large for orjson falls back to :func:`encode_exact`."""
    try:
        data = orjson.dumps(message)
    except TypeError:
        return encode_exact(message)
    return HEADER.pack(len(data)) + data


def encode_exact(message: Any) -> bytes:
    """A frame the standard library writes and reads (NaN, infinities and big integers
    survive): for what came from a client or a model."""
    data = COMPACT_JSON.encode(message).encode("utf-8")
    return HEADER.pack(len(data) | EXACT) + data


def encode_raw(data: bytes) -> bytes:
    """Bytes that already are JSON (a client's request body), as an exact frame."""
    return HEADER.pack(len(data) | EXACT) + data


def split_header(header: int) -> tuple[int, bool]:
    """The body's size and whether it is exact."""
    return header & ~EXACT, bool(header & EXACT)


def decode(body: bytes | bytearray, exact: bool) -> Any:
    """An exact frame is read by msgspec (as fast as orjson, and exact for integers past 64
    bits, which orjson reads as floats) unless it holds what only the standard library reads:
    NaN, the infinities, a lone surrogate."""
    if not exact:
        return orjson.loads(body)
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError:
        return json.loads(body)
