"""The scripted model server speaks the OpenAI chat API: proven with the official client."""

from __future__ import annotations

import openai

from tests.orchestration.scripted_model import ScriptedModel, final


def test_official_openai_client_reads_scripted_replies(scripted: ScriptedModel) -> None:
    goal = scripted.script("proof of protocol", final("hello"))
    client = openai.OpenAI(base_url=scripted.v1, api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model="scripted",
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": goal}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "action", "schema": {"type": "object"}},
        },
    )
    assert reply.choices[0].message.content == final("hello")
    assert reply.usage is not None and reply.usage.total_tokens == 15
    assert scripted.requests_for(goal)[0]["response_format"]["type"] == "json_schema"
