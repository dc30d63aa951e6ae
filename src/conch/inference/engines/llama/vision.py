"""Images in prompts: llama.cpp's multimodal library (libmtmd) over a model's projector (``mmproj``).

A vision model is a text model plus a projector GGUF that turns an image into embeddings in the
text model's space. :class:`Projector` opens the projector for a loaded text model, as
llama-server's ``--mmproj`` does; :meth:`Projector.prompt` splits a rendered chat prompt at its
media markers (``<__media__>``) into text and image chunks (``mtmd_tokenize``), and the
scheduler evaluates the image chunks of a request on its own sequence before its text
(:meth:`Projector.eval_chunk`; docs/inference.md, "Images").

In the scheduler's token lists an image chunk stands as that many *placeholder* ids: one
negative number per image, derived from the SHA-256 of the image's bytes. The KV pool's
prefix reuse compares token lists, so two prompts share cells through an image only when the
image bytes are the same; placeholders never reach ``llama_decode`` (a request's text is
decoded only after its last image).
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from conch.inference.engines.base import MEDIA_MARKER, ChatInputError, EngineError, ImageInput

# What llama.cpp decodes in-process (stb_image); anything else is refused before libmtmd sees
# it, which would otherwise try it as audio, then hand it to ffprobe/ffmpeg as a video or WebP.
_FORMATS = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
            (b"BM", "BMP"))
IMAGE_FORMATS = "JPEG, PNG, GIF or BMP"


def image_format(data: bytes) -> str | None:
    """The format of an image llama.cpp decodes in-process, by its magic bytes; None otherwise."""
    return next((name for magic, name in _FORMATS if data.startswith(magic)), None)


def placeholder(digest: str) -> int:
    """The negative id an image's tokens stand as (60 bits of its hash: never a real token)."""
    return -1 - int(digest[:15], 16)


@dataclass
class Chunk:
    start: int  # index of its first token in the prompt's token list
    end: int
    image: bool
    ptr: int  # the mtmd_input_chunk (owned by the prompt's chunk list)


@dataclass(eq=False)
class MediaPrompt:
    """A prompt with images: its token list (placeholders for image tokens) and its chunks.

    Owns the native chunk list; freed when the last job holding it is gone."""

    tokens: list[int]
    chunks: list[Chunk]
    n_images: int
    projector: Projector
    _native: Any = field(default=None, repr=False)

    @property
    def end(self) -> int:
        """Where the last image ends: tokens before it are evaluated by the projector's path."""
        return max(c.end for c in self.chunks if c.image)

    def chunk_at(self, index: int) -> Chunk:
        for c in self.chunks:
            if c.start <= index < c.end:
                return c
        raise IndexError(index)

    def __del__(self) -> None:
        native, self._native = self._native, None
        if native:
            self.projector.mtmd.mtmd_input_chunks_free(native)


class Projector:
    """The projector of one loaded model (libmtmd's context)."""

    def __init__(self, path: str, model: Any, *, n_threads: int, use_gpu: bool) -> None:
        from llama_cpp import mtmd_cpp

        self.mtmd = mtmd_cpp
        self.path = path
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        params.media_marker = MEDIA_MARKER.encode()
        self._ctx = mtmd_cpp.mtmd_init_from_file(path.encode(), model, params)
        if not self._ctx:
            raise EngineError(f"the projector {path} could not be loaded by llama.cpp (libmtmd): "
                              "see the server log; is it the mmproj of this model?")
        if not mtmd_cpp.mtmd_support_vision(self._ctx):
            self.close()
            raise EngineError(f"the projector {path} reads no images (an audio-only projector)")
        # M-RoPE models (Qwen2-VL) place an image on fewer positions than it has tokens.
        self.mrope = bool(mtmd_cpp.mtmd_decode_use_mrope(self._ctx))
        # mtmd_tokenize runs on request threads while the worker encodes (as llama-server's
        # HTTP threads do); the lock only keeps two tokenizations apart.
        self._lock = threading.Lock()

    def close(self) -> None:
        if self._ctx:
            self.mtmd.mtmd_free(self._ctx)
            self._ctx = None

    def prompt(self, text: str, images: list[ImageInput], *, add_special: bool) -> MediaPrompt:
        """The chunks of ``text`` with ``images`` in place of its markers (raises
        ``ChatInputError`` naming the image that could not be read)."""
        m = self.mtmd
        bitmaps: list[Any] = []
        digests: list[str] = []
        native = None
        try:
            for image in images:
                if image_format(image.data) is None:
                    kind = "a WebP image" if image.data[8:12] == b"WEBP" else "not an image"
                    raise ChatInputError(f"'{image.where}' is {kind}: images must be {IMAGE_FORMATS}", image.where)
                buf = (ctypes.c_uint8 * len(image.data)).from_buffer_copy(image.data)
                with self._lock:
                    bitmap = m.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(image.data), False)
                if not bitmap:
                    raise ChatInputError(f"'{image.where}' could not be decoded as an image (a truncated or "
                                         f"corrupt {image_format(image.data)} file?)", image.where)
                digest = hashlib.sha256(image.data).hexdigest()
                m.mtmd_bitmap_set_id(bitmap, digest.encode())
                bitmaps.append(bitmap)
                digests.append(digest)
            native = m.mtmd_input_chunks_init()
            raw = text.encode("utf-8")
            inp = m.mtmd_input_text(raw, len(raw), add_special, True)
            arr = (m.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            with self._lock:
                rc = m.mtmd_tokenize(self._ctx, native, ctypes.byref(inp), arr, len(bitmaps))
            if rc == 1:
                raise ChatInputError(f"the prompt has {text.count(MEDIA_MARKER)} image markers "
                                     f"('{MEDIA_MARKER}' in the text counts) for {len(images)} images", "messages")
            if rc != 0:
                raise ChatInputError(f"the images could not be preprocessed (libmtmd status {rc})",
                                     images[0].where if images else "messages")
            tokens: list[int] = []
            chunks: list[Chunk] = []
            for i in range(m.mtmd_input_chunks_size(native)):
                ptr = m.mtmd_input_chunks_get(native, i)
                kind = m.mtmd_input_chunk_get_type(ptr)
                start = len(tokens)
                if kind == m.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t(0)
                    ids = m.mtmd_input_chunk_get_tokens_text(ptr, ctypes.byref(n))
                    tokens.extend(ids[k] for k in range(n.value))
                elif kind == m.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    chunk_id = (m.mtmd_input_chunk_get_id(ptr) or b"").decode() or hashlib.sha256(
                        str(i).encode()).hexdigest()
                    tokens.extend([placeholder(hashlib.sha256(chunk_id.encode()).hexdigest())]
                                  * int(m.mtmd_input_chunk_get_n_tokens(ptr)))
                else:
                    raise ChatInputError("only images are supported in prompts, not audio", "messages")
                chunks.append(Chunk(start, len(tokens), kind == m.MTMD_INPUT_CHUNK_TYPE_IMAGE, ptr))
            if chunks and chunks[-1].image:
                raise ChatInputError("an image must be followed by text in the prompt", "messages")
            out = MediaPrompt(tokens, chunks, len(images), self, native)
            native = None  # the prompt owns it now
            return out
        finally:
            if native:
                m.mtmd_input_chunks_free(native)
            for bitmap in bitmaps:
                m.mtmd_bitmap_free(bitmap)

    def eval_chunk(self, lctx: Any, chunk: Chunk, pos: int, seq: int, n_batch: int) -> int:
        """Encode an image chunk and decode its embeddings into ``seq`` from position ``pos``
        (the worker thread); returns the position after it."""
        new_pos = ctypes.c_int32(0)
        rc = self.mtmd.mtmd_helper_eval_chunk_single(self._ctx, lctx, chunk.ptr, pos, seq, n_batch, False,
                                                     ctypes.byref(new_pos))
        if rc != 0:
            raise EngineError(f"the image could not be evaluated (libmtmd status {rc})")
        return int(new_pos.value)
