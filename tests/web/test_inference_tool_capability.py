"""The ``tools`` capability end to end: a GGUF whose chat template takes tools is listed with it
by ``/v1/models``, ``/v1/models/{id}`` and Ollama's ``/api/show``, the agent server's
:meth:`ModelClient.protocol` picks the native protocol for it, and its chat endpoint takes
``tools`` and answers ``tool_calls``; the bundled SmolLM2 (a template without tools) keeps JSON
actions. The tool-taking model is the bundled file with one line added to its template."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import gguf
import pytest
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

from conch.inference.models.bundled import find_bundled_gguf
from conch.orchestration.models import ModelClient
from tests.web.conftest import RunningServer

BUNDLED = "smollm2-135m-instruct"
TOOLED = "smollm2-with-tools"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _with_tool_template(src: Path, out: Path) -> Path:
    """A copy of ``src`` whose chat template also lists ``tools`` (the weights are the same)."""
    reader = gguf.GGUFReader(str(src), "r")
    template = str(reader.fields[gguf.Keys.Tokenizer.CHAT_TEMPLATE].contents())
    template = "{% if tools %}{{ '<|im_start|>system\\n' + tools|tojson + '<|im_end|>\\n' }}{% endif %}" + template
    writer = gguf.GGUFWriter(str(out), arch=str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents()),
                             endianess=reader.endianess)
    alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    new = {gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(gguf.GGUFValueType.STRING, template)}
    copy_with_new_metadata(reader, writer, new, [])
    return out


@pytest.fixture()
def tooled_model(inference_server: RunningServer, tmp_path: Path) -> Iterator[dict[str, object]]:
    bundled = find_bundled_gguf()
    assert bundled is not None
    path = _with_tool_template(bundled, tmp_path / "smollm2-tools.gguf")
    with inference_server.client() as c:
        r = c.post(f"/v1/models/{TOOLED}/download", json={"source": "file", "path": str(path)})
        assert r.status_code == 201, r.text
        yield r.json()
        c.delete(f"/v1/models/{TOOLED}")


def test_tools_capability_follows_the_template(inference_server: RunningServer, tooled_model: dict[str, object]) -> None:
    assert tooled_model["capabilities"] == ["chat", "embeddings", "tools"]  # registered with it
    with inference_server.client() as c:
        listed = {m["id"]: m["capabilities"] for m in c.get("/v1/models").json()["data"]}
        assert listed[TOOLED] == ["chat", "embeddings", "tools"]
        assert listed[BUNDLED] == ["chat", "embeddings"]  # SmolLM2's template never mentions tools
        assert c.get(f"/v1/models/{TOOLED}").json()["capabilities"] == ["chat", "embeddings", "tools"]
        assert c.get(f"/v1/models/{BUNDLED}").json()["capabilities"] == ["chat", "embeddings"]
        # Ollama's /api/show says the same.
        assert "tools" in c.post("/api/show", json={"model": TOOLED}).json()["capabilities"]
        assert "tools" not in c.post("/api/show", json={"model": BUNDLED}).json()["capabilities"]

        # The chat endpoint takes tools for it and answers tool calls (forced here: a 135M
        # model rarely calls unforced, which is why the bundled file is not listed with tools),
        # and takes the conversation back with the call and its result.
        r = c.post("/v1/chat/completions", json={
            "model": TOOLED, "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [WEATHER], "tool_choice": "required", "max_tokens": 48, "temperature": 0})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        call = choice["message"]["tool_calls"][0]
        assert call["function"]["name"] == "get_weather" and isinstance(json.loads(call["function"]["arguments"]), dict)
        r = c.post("/v1/chat/completions", json={
            "model": TOOLED, "tools": [WEATHER], "max_tokens": 8, "temperature": 0, "messages": [
                {"role": "user", "content": "What is the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 C"}]})
        assert r.status_code == 200, r.text

    async def protocols() -> tuple[str, str]:
        client = ModelClient(inference_server.v1)
        try:
            return await client.protocol(f"local:{TOOLED}"), await client.protocol(BUNDLED)
        finally:
            await client.close()

    # The agent server picks the native protocol for the model with tools, JSON actions for the other.
    assert asyncio.run(protocols()) == ("native", "json")
