"""Ollama's API (``/api/chat``, ``/api/generate``, ``/api/embed`` …) <-> conch's OpenAI shapes.

Requests become OpenAI chat / embeddings request bodies; chat chunks become Ollama's NDJSON
objects (:class:`OllamaStream`, which also folds them into the single object a
``"stream": false`` request gets). Model records become ``/api/tags``, ``/api/show`` and
``/api/ps`` entries.

``options``: sampling options are mapped to the chat request (``num_predict`` -> ``max_tokens``,
``top_k``, ``min_p``, ``typical_p``, ``repeat_penalty`` and ``repeat_last_n`` as llama.cpp
sampling extensions); options that only steer how Ollama loads a model on its own hardware
(``num_gpu``, ``num_thread``, ``use_mmap`` …) are ignored, as are options Ollama itself ignores;
sampling conch cannot do (``mirostat``, ``tfs_z`` other than the neutral value) is refused, and
``num_ctx`` above the server's context size is refused (a smaller one is honoured trivially).
Unknown option names are ignored, as Ollama does.

``logprobs`` / ``top_logprobs`` (0-20, read only with ``logprobs``, as Ollama does) ask the chat
(or completion) request for its token log-probabilities; each NDJSON object carries the entries
of its tokens in a top-level ``logprobs`` array (``{token, logprob, bytes, top_logprobs}``), and
a ``"stream": false`` answer all of them.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from conch.inference.api.dialect import TranslationError, refuse

# Options that map one-to-one onto chat request fields (conch's name on the right); the Ollama
# provider (remote/ollama.py) maps the same fields back into options.
SAMPLING_OPTIONS = {
    "temperature": "temperature", "top_p": "top_p", "seed": "seed", "stop": "stop",
    "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
    # llama.cpp sampling, accepted by conch's chat request as extensions (as llama-server does).
    "top_k": "top_k", "min_p": "min_p", "typical_p": "typical_p",
    "repeat_penalty": "repeat_penalty", "repeat_last_n": "repeat_last_n",
}
# How Ollama loads the model on its hardware; conch's server settings decide those.
LOAD_OPTIONS = ("num_batch", "num_gpu", "main_gpu", "low_vram", "use_mmap", "use_mlock", "num_thread",
                "numa", "vocab_only", "f16_kv", "num_keep", "penalize_newline", "logits_all", "embedding_only")
# Sampling conch does not implement: accepted only at the value that means "off".
NEUTRAL_OPTIONS: dict[str, Any] = {"mirostat": 0, "tfs_z": 1.0}
# Ollama's own defaults where they differ from conch's (temperature 0.8, not 0.7).
DEFAULTS = {"temperature": 0.8}

# Ollama's done_reason for each chat finish_reason, and back (what the Ollama provider reads:
# Ollama has no reason for tool calls, and a turn that ended otherwise is a plain stop).
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}
FINISH_REASONS = {"stop": "stop", "length": "length"}


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def error_body(message: str) -> dict[str, Any]:
    """Ollama's error shape: ``{"error": "message"}``."""
    return {"error": message}


# -- requests --------------------------------------------------------------------------------
def _options(options: Any, n_ctx: int | None) -> dict[str, Any]:
    if options is None:
        return dict(DEFAULTS)
    if not isinstance(options, dict):
        raise TranslationError("'options' must be an object", "options")
    out: dict[str, Any] = dict(DEFAULTS)
    for key, value in options.items():
        param = f"options.{key}"
        if value is None:
            continue
        if key in SAMPLING_OPTIONS:
            out[SAMPLING_OPTIONS[key]] = value
        elif key == "num_predict":
            if not isinstance(value, int) or isinstance(value, bool) or value == 0 or value < -2:
                raise TranslationError(f"'{param}' must be a positive integer, -1 (no limit) or -2 (fill the context)", param)
            if value > 0:
                out["max_tokens"] = value
        elif key == "num_ctx":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TranslationError(f"'{param}' must be a positive integer", param)
            if n_ctx is not None and value > n_ctx:
                raise refuse(param, f"asks for {value} tokens of context; this server runs models with "
                             f"{n_ctx} (set `n_ctx` in conch's configuration)")
        elif key in NEUTRAL_OPTIONS:
            if value != NEUTRAL_OPTIONS[key]:
                raise refuse(param, f"is not supported by conch (only {NEUTRAL_OPTIONS[key]!r}, which turns it off)")
        elif key in ("mirostat_tau", "mirostat_eta") or key in LOAD_OPTIONS:
            continue
        # Anything else is unknown; Ollama ignores those too (with a warning in its log).
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    return out


def _format(fmt: Any) -> dict[str, Any] | None:
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": fmt}}
    raise TranslationError("'format' must be \"json\" or a JSON Schema object", "format")


def _logprobs(body: dict[str, Any]) -> int | None:
    """How many alternatives per token the request asks for, or None when it asks for no logprobs."""
    want, top = body.get("logprobs"), body.get("top_logprobs")
    if want is not None and not isinstance(want, bool):
        raise TranslationError("'logprobs' must be a boolean", "logprobs")
    if top is not None:
        if not isinstance(top, int) or isinstance(top, bool):
            raise TranslationError("'top_logprobs' must be an integer", "top_logprobs")
        if not 0 <= top <= 20:
            raise TranslationError("top_logprobs must be between 0 and 20", "top_logprobs")  # Ollama's words
    # Ollama's runner computes log-probabilities only when asked for them; top_logprobs alone is inert.
    return (top or 0) if want else None


def _common(body: dict[str, Any], n_ctx: int | None) -> dict[str, Any]:
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise TranslationError("model is required", "model")
    if body.get("think"):
        raise refuse("think", "is not supported: conch's local models do not think")
    chat: dict[str, Any] = {"model": body["model"], **_options(body.get("options"), n_ctx)}
    top = _logprobs(body)
    if top is not None:
        chat["logprobs"] = True
        chat["top_logprobs"] = top
    fmt = _format(body.get("format"))
    if fmt is not None:
        chat["response_format"] = fmt
    if body.get("keep_alive") is not None:
        chat["keep_alive"] = body["keep_alive"]
    chat["stream"] = True
    chat["stream_options"] = {"include_usage": True}
    return chat


def _message(i: int, msg: Any) -> dict[str, Any]:
    param = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise TranslationError(f"'{param}' must be an object", param)
    role = msg.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise TranslationError(f"'{param}.role' must be system, user, assistant or tool", f"{param}.role")
    out: dict[str, Any] = {"role": role, "content": msg.get("content") or ""}
    if msg.get("images"):
        out["content"] = [*_image_parts(msg["images"], f"{param}.images"), {"type": "text", "text": out["content"]}]
    if role == "assistant" and msg.get("tool_calls"):
        calls = []
        for k, call in enumerate(msg["tool_calls"]):
            fn = call.get("function") or {}
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    raise TranslationError(f"'{param}.tool_calls[{k}].function.arguments' is not valid JSON",
                                           f"{param}.tool_calls[{k}].function.arguments")
            calls.append({"id": str(call.get("id") or f"call_{i}_{k}"), "type": "function",
                          "function": {"name": fn.get("name", ""), "arguments": json.dumps(args)}})
        out["tool_calls"] = calls
        out["content"] = out["content"] or None
    if role == "tool":
        # Ollama names the tool rather than the call; chat form wants a call id.
        out["tool_call_id"] = str(msg.get("tool_call_id") or msg.get("tool_name") or "")
    return out


def _image_parts(images: Any, param: str) -> list[dict[str, Any]]:
    """Ollama's base64 ``images`` as OpenAI ``image_url`` parts, ahead of the text as Ollama
    places them; a bad item's error names ``param[k]``."""
    if not isinstance(images, list):
        raise TranslationError(f"'{param}' must be an array of base64 strings", param)
    parts = []
    for k, data in enumerate(images):
        if not isinstance(data, str) or not data:
            raise TranslationError(f"'{param}[{k}]' must be a base64 string", f"{param}[{k}]")
        parts.append({"type": "image_url", "image_url": {"url": f"data:image/*;base64,{data}"},
                      "source_param": f"{param}[{k}]"})
    return parts


def chat_request(body: dict[str, Any], n_ctx: int | None = None) -> dict[str, Any]:
    """An Ollama ``/api/chat`` body -> an OpenAI chat request body (always streamed internally)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise TranslationError("'messages' must be an array", "messages")
    chat = _common(body, n_ctx)
    chat["messages"] = [_message(i, m) for i, m in enumerate(messages)]
    if body.get("tools"):
        chat["tools"] = body["tools"]
    return chat


def generate_request(body: dict[str, Any], n_ctx: int | None = None) -> tuple[str, dict[str, Any]]:
    """An Ollama ``/api/generate`` body -> ("chat", chat body) or ("completion", completion body).

    ``raw`` prompts and prompts with a ``suffix`` (fill-in-the-middle) skip the chat template and
    go to the completion entry point.
    """
    if body.get("template"):
        raise refuse("template", "is not supported: conch formats prompts with the model's own chat template")
    if body.get("context"):
        raise refuse("context", "is not supported (deprecated by Ollama): send the conversation to /api/chat")
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise TranslationError("'prompt' must be a string", "prompt")
    req = _common(body, n_ctx)
    if body.get("raw") or body.get("suffix"):
        if body.get("system"):
            raise refuse("system", "cannot be used with raw or suffix prompts (they skip the chat template)")
        req["prompt"] = prompt
        req.setdefault("max_tokens", None)  # Ollama generates until the model stops, not 16 tokens
        if req.pop("logprobs", False):
            req["logprobs"] = req.pop("top_logprobs")  # the completion request's one integer
        if body.get("suffix"):
            req["suffix"] = body["suffix"]
        if "response_format" in req:
            raise refuse("format", "cannot be used with raw or suffix prompts")
        if body.get("images"):
            raise refuse("images", "cannot be used with raw or suffix prompts (images need the chat template)")
        return "completion", req
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": str(body["system"])})
    if body.get("images"):
        messages.append({"role": "user", "content": [*_image_parts(body["images"], "images"),
                                                     {"type": "text", "text": prompt}]})
    else:
        messages.append({"role": "user", "content": prompt})
    req["messages"] = messages
    return "chat", req


def embed_request(body: dict[str, Any]) -> dict[str, Any]:
    """``/api/embed`` (``input``) or legacy ``/api/embeddings`` (``prompt``) -> an embeddings body."""
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise TranslationError("model is required", "model")
    raw = body.get("input", body.get("prompt"))
    if raw is None or raw == [] or raw == "":
        raise TranslationError("input is required", "input")
    out: dict[str, Any] = {"model": body["model"], "input": raw}
    if body.get("dimensions") is not None:
        out["dimensions"] = body["dimensions"]
    if body.get("keep_alive") is not None:
        out["keep_alive"] = body["keep_alive"]
    return out


# -- responses -------------------------------------------------------------------------------
class OllamaStream:
    """Chat (or completion) chunks in, Ollama NDJSON objects out; also the collected answer.

    ``kind`` is ``"chat"`` (objects carry ``message``) or ``"generate"`` (``response``).
    Durations are nanoseconds, as Ollama reports them.
    """

    def __init__(self, model: str, kind: str = "chat") -> None:
        self.model = model
        self.kind = kind
        self.text: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.unsent = 0  # how many of ``logprobs`` no object has carried yet
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason = "stop"
        self.prompt_tokens = 0
        self.completion_tokens = 0

    def _obj(self, text: str, done: bool, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        obj: dict[str, Any] = {"model": self.model, "created_at": now_iso()}
        if self.kind == "chat":
            obj["message"] = {"role": "assistant", "content": text}
        else:
            obj["response"] = text
        obj["done"] = done
        if logprobs:
            obj["logprobs"] = logprobs
        return obj

    def _unsent(self) -> list[dict[str, Any]]:
        """The entries no object has carried yet: tokens whose text is held back (a possible
        stop string) or is no text at all (a tool call) ride on the next object."""
        entries = self.logprobs[len(self.logprobs) - self.unsent:] if self.unsent else []
        self.unsent = 0
        return entries

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        usage = chunk.get("usage")
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens", 0)
            self.completion_tokens = usage.get("completion_tokens", 0)
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            # Chat chunks carry ``delta``; legacy completion chunks carry ``text``.
            delta = choice.get("delta") or {}
            text = delta.get("content") if "delta" in choice else choice.get("text")
            entries = [_logprob(e) for e in (choice.get("logprobs") or {}).get("content") or []]
            self.logprobs += entries
            self.unsent += len(entries)
            if text:
                self.text.append(text)
                out.append(self._obj(text, False, self._unsent()))
            for call in delta.get("tool_calls") or []:
                slot = self.calls.setdefault(call.get("index", 0), {"name": "", "arguments": ""})
                fn = call.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return out

    def _tool_calls(self) -> list[dict[str, Any]]:
        calls = []
        for index in sorted(self.calls):
            slot = self.calls[index]
            try:
                args = json.loads(slot["arguments"] or "{}")
            except json.JSONDecodeError:
                args = {}
            calls.append({"function": {"name": slot["name"], "arguments": args}})
        return calls

    def final(self, *, total_ns: int, load_ns: int = 0, prompt_ns: int = 0, eval_ns: int = 0,
              collected: bool = False) -> dict[str, Any]:
        """The last object (``done: true`` with statistics); with ``collected`` it carries all
        the text, as a ``"stream": false`` answer does."""
        obj = self._obj("".join(self.text) if collected else "", True,
                        self.logprobs if collected else self._unsent())
        if self.calls and self.kind == "chat":
            obj["message"]["tool_calls"] = self._tool_calls()
        obj.update({
            "done_reason": DONE_REASONS.get(self.finish_reason, "stop"),
            "total_duration": total_ns, "load_duration": load_ns,
            "prompt_eval_count": self.prompt_tokens, "prompt_eval_duration": prompt_ns,
            "eval_count": self.completion_tokens, "eval_duration": eval_ns,
        })
        return obj


def _logprob(entry: dict[str, Any], top: bool = True) -> dict[str, Any]:
    """A chat logprob entry in Ollama's shape; empty ``bytes`` and ``top_logprobs`` are left
    out, as Ollama's ``omitempty`` leaves them."""
    out: dict[str, Any] = {"token": entry["token"], "logprob": entry["logprob"]}
    if entry.get("bytes"):
        out["bytes"] = entry["bytes"]
    alternatives = [_logprob(t, top=False) for t in entry.get("top_logprobs") or []] if top else []
    if alternatives:
        out["top_logprobs"] = alternatives
    return out


def embed_response(model: str, embeddings: dict[str, Any], total_ns: int, load_ns: int = 0) -> dict[str, Any]:
    data = sorted(embeddings["data"], key=lambda d: d["index"])
    return {"model": model, "embeddings": [d["embedding"] for d in data], "total_duration": total_ns,
            "load_duration": load_ns, "prompt_eval_count": (embeddings.get("usage") or {}).get("prompt_tokens", 0)}


# -- models ----------------------------------------------------------------------------------
def details(record: Any) -> dict[str, Any]:
    arch = record.architecture or ""
    return {"parent_model": record.converted_from or "", "format": record.format, "family": arch,
            "families": [arch] if arch else None, "parameter_size": str(record.extra.get("parameter_size", "")),
            "quantization_level": (record.quantization or "").upper()}


def capabilities(record: Any, fim: bool = False) -> list[str]:
    """Ollama's capability names for a record's conch capabilities."""
    caps = []
    if "chat" in record.capabilities:
        caps.append("completion")
        # As /v1/models says: a chat model whose template takes tools (gguf_info.template_uses_tools).
        if "tools" in record.capabilities:
            caps.append("tools")
        if fim:
            caps.append("insert")
    if "embeddings" in record.capabilities:
        caps.append("embedding")
    if "vision" in record.capabilities:
        caps.append("vision")
    return caps


def tag_entry(record: Any) -> dict[str, Any]:
    return {"name": record.id, "model": record.id, "modified_at": iso(record.created), "size": record.size_bytes,
            "digest": record.sha256 or "", "details": details(record)}


def ps_entry(record: Any, expires_at: float | None, *, size: int | None = None, size_vram: int = 0,
             context_length: int | None = None) -> dict[str, Any]:
    """A loaded model as Ollama's ``/api/ps`` lists it: ``size`` is its memory (the footprint the
    budget counts), ``size_vram`` the part on a GPU, ``context_length`` the context it was loaded
    with (the file's training context when not given)."""
    entry = tag_entry(record)
    del entry["modified_at"]
    if size is not None:
        entry["size"] = size
    entry["expires_at"] = iso(expires_at) if expires_at is not None else "9999-12-31T23:59:59Z"
    entry["size_vram"] = size_vram
    ctx = context_length or record.context_length
    if ctx:
        entry["context_length"] = ctx
    return entry


def show_entry(record: Any, *, template: str = "", fim: bool = False) -> dict[str, Any]:
    info: dict[str, Any] = {"general.architecture": record.architecture or ""}
    if record.architecture and record.context_length:
        info[f"{record.architecture}.context_length"] = record.context_length
    return {"modelfile": f"# conch model {record.id}\nFROM {record.path}\n", "parameters": "",
            "template": template, "details": details(record), "model_info": info,
            "capabilities": capabilities(record, fim), "modified_at": iso(record.created)}


def pull_progress(event: dict[str, Any], model: str) -> dict[str, Any]:
    """A conch download progress report ``{status, completed, total, file?}`` as Ollama's."""
    out: dict[str, Any] = {"status": str(event.get("status") or f"pulling {model}")}
    if event.get("file"):
        out["status"] = f"pulling {event['file']}"
        out["digest"] = str(event["file"])
    if event.get("total"):
        out["total"] = int(event["total"])
        out["completed"] = int(event.get("completed") or 0)
    return out
