"""Images in chat, through the OpenAI, Anthropic and Ollama clients against a real server.

The vision model is the bundled SmolLM2 with a tiny random CLIP projector built for the test
(testsupport/tiny_mmproj.py: LLaVA's MLP projector, 16 tokens an image): what it says about
an image is noise, but the image's tokens are evaluated, so ``prompt_tokens`` grows by 16. The
bundled SmolLM2 without a projector refuses images with a 400 naming the field.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import anthropic
import ollama
import openai
import pytest

from conch import db
from conch.inference.models.store import ModelStore
from tests.web.conftest import RunningServer, start_server
from testsupport.tiny_mmproj import png_bytes, write_random_mmproj

TEXT_MODEL = "smollm2-135m-instruct"
VISION = "smol-vision"
IMAGE_TOKENS = 16  # (32 / 8) ** 2 patches of the tiny projector
PNG = png_bytes()
B64 = base64.b64encode(PNG).decode()
DATA_URL = f"data:image/png;base64,{B64}"


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    data = tmp_path_factory.mktemp("vision-data")
    running, server, thread = start_server(data, n_parallel=2, n_ctx=1024, max_queue=8)
    store = ModelStore(running.settings)
    bundled = store.get(TEXT_MODEL)
    assert bundled is not None
    mmproj = write_random_mmproj(data / "mmproj-tiny-f32.gguf", text_embd=576)
    store.register(bundled.model_copy(update={"id": VISION, "mmproj": str(mmproj)}))
    yield running
    server.should_exit = True
    thread.join(timeout=30)
    db.dispose_all()


def _openai_parts(url: str) -> list[dict[str, object]]:
    return [{"type": "text", "text": "What is in this picture?"}, {"type": "image_url", "image_url": {"url": url}}]


def test_capabilities_list_vision(vision_server: RunningServer) -> None:
    with vision_server.client() as c:
        assert "vision" in c.get(f"/v1/models/{VISION}").json()["capabilities"]
        assert "vision" not in c.get(f"/v1/models/{TEXT_MODEL}").json()["capabilities"]
    shown = ollama.Client(host=vision_server.url).show(VISION)
    assert "vision" in (shown.capabilities or [])
    assert "vision" not in (ollama.Client(host=vision_server.url).show(TEXT_MODEL).capabilities or [])


def test_openai_image_tokens_are_evaluated(vision_server: RunningServer) -> None:
    client = vision_server.openai()
    text = client.chat.completions.create(model=VISION, max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}]}])
    image = client.chat.completions.create(model=VISION, max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": _openai_parts(DATA_URL)}])
    assert text.usage is not None and image.usage is not None
    assert image.usage.prompt_tokens == text.usage.prompt_tokens + IMAGE_TOKENS
    assert image.usage.completion_tokens >= 1
    # Streamed, twice (the second reuses the first's cells, image included): the same greedy text.
    again = [client.chat.completions.create(model=VISION, max_tokens=4, temperature=0, stream=True,
                                            messages=[{"role": "user", "content": _openai_parts(DATA_URL)}])
             for _ in range(2)]
    texts = ["".join(ch.choices[0].delta.content or "" for ch in s if ch.choices) for s in again]
    assert texts[0] == texts[1] == image.choices[0].message.content


def test_file_url_in_data_dir(vision_server: RunningServer) -> None:
    path = Path(vision_server.settings.data_dir) / "picture.png"
    path.write_bytes(PNG)
    client = vision_server.openai()
    out = client.chat.completions.create(model=VISION, max_tokens=2, temperature=0,
                                         messages=[{"role": "user", "content": _openai_parts(path.as_uri())}])
    assert out.usage is not None and out.usage.prompt_tokens > IMAGE_TOKENS
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=VISION, max_tokens=2, messages=[
            {"role": "user", "content": _openai_parts("file:///etc/hostname")}])
    assert err.value.body["param"] == "messages[0].content[1].image_url.url"  # type: ignore[index]
    assert "outside the data directory" in err.value.body["message"]  # type: ignore[index]


def test_openai_refusals(vision_server: RunningServer) -> None:
    client = vision_server.openai()
    cases = [
        (TEXT_MODEL, DATA_URL, "no vision projector"),
        (VISION, "https://example.com/cat.png", "allow_network"),
        (VISION, "data:image/png;base64,@@not-base64@@", "not valid base64"),
        (VISION, "data:image/png;base64," + base64.b64encode(b"plain text").decode(), "not an image"),
    ]
    for model, url, why in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=model, max_tokens=2,
                                           messages=[{"role": "user", "content": _openai_parts(url)}])
        body = err.value.body
        assert body["param"] == "messages[0].content[1].image_url.url", body  # type: ignore[index]
        assert why in body["message"], body  # type: ignore[index]
    # The server keeps serving.
    ok = client.chat.completions.create(model=VISION, max_tokens=2, messages=[
        {"role": "user", "content": _openai_parts(DATA_URL)}])
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_anthropic_image_blocks(vision_server: RunningServer) -> None:
    client = anthropic.Anthropic(base_url=vision_server.url, api_key="anything", max_retries=0, timeout=120)

    def ask(model: str, source: dict[str, str]) -> anthropic.types.Message:
        return client.messages.create(model=model, max_tokens=3, messages=[{"role": "user", "content": [
            {"type": "image", "source": source},  # type: ignore[misc,list-item]
            {"type": "text", "text": "Describe it."}]}])

    text = client.messages.create(model=VISION, max_tokens=3, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Describe it."}]}])
    msg = ask(VISION, {"type": "base64", "media_type": "image/png", "data": B64})
    assert msg.usage.input_tokens == text.usage.input_tokens + IMAGE_TOKENS
    refusals = [
        (TEXT_MODEL, {"type": "base64", "media_type": "image/png", "data": B64}, "messages[0].content[0].source.data"),
        (VISION, {"type": "base64", "media_type": "image/png", "data": "%%%"}, "messages[0].content[0].source.data"),
        (VISION, {"type": "url", "url": "https://example.com/a.png"}, "messages[0].content[0].source.url"),
    ]
    for model, source, field in refusals:
        with pytest.raises(anthropic.BadRequestError) as err:
            ask(model, source)
        assert err.value.body["type"] == "error"  # type: ignore[index]
        assert field in err.value.body["error"]["message"], err.value.body  # type: ignore[index]


def test_ollama_images(vision_server: RunningServer) -> None:
    client = ollama.Client(host=vision_server.url, timeout=120)
    opts = {"temperature": 0, "num_predict": 3}
    text = client.chat(model=VISION, messages=[{"role": "user", "content": "Describe it."}], options=opts)
    chat = client.chat(model=VISION, messages=[{"role": "user", "content": "Describe it.", "images": [PNG]}],
                       options=opts)
    assert chat.prompt_eval_count == (text.prompt_eval_count or 0) + IMAGE_TOKENS
    plain = client.generate(model=VISION, prompt="Describe it.", options=opts)
    gen = client.generate(model=VISION, prompt="Describe it.", images=[PNG], options=opts)
    assert gen.prompt_eval_count == (plain.prompt_eval_count or 0) + IMAGE_TOKENS
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model=TEXT_MODEL, messages=[{"role": "user", "content": "x", "images": [PNG]}], options=opts)
    assert err.value.status_code == 400 and "messages[0].images[0]" in err.value.error
    with vision_server.client() as c:
        r = c.post("/api/generate", json={"model": VISION, "prompt": "x", "images": ["not base64!"], "stream": False})
        assert r.status_code == 400 and "images[0]" in r.json()["error"] and "base64" in r.json()["error"]
