"""conch.host: the language's host for the shell, a sandbox worker and a Dask worker, against a
scripted OpenAI-compatible model server on loopback and a real SQLite database.

The sandbox worker's host, whose task records go to the server, is tested through the agent
server (tests/orchestration/test_agents_tasks.py, tests/lang/builtins/test_ai.py); the shell's
in-process models through ``conch -c`` (tests/lang/builtins/test_ai.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conch.config import Settings, get_settings
from conch.host import ChannelTasks, ConchHost, DatabaseTasks, server_host, shell_host
from conch.lang import run
from conch.lang.context import Context
from conch.lang.errors import ConchError
from conch.lang.host import ModelRequestError
from tests.inference.providers.standins import closed_port_url
from testsupport.scripted_model import ScriptedModel, final, tool

pytestmark = pytest.mark.timeout(120)


def _settings(tmp_path: Path, models_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "data", workspace=tmp_path / "ws", models_url=models_url,
                    default_model="local:scripted-default")


def test_server_host_asks_the_inference_server(scripted: ScriptedModel, tmp_path: Path) -> None:
    host = server_host(_settings(tmp_path, scripted.v1))
    assert isinstance(host, ConchHost) and isinstance(host.tasks, DatabaseTasks)
    answer = host.chat({"messages": [{"role": "user", "content": "say hi"}]}, None)
    assert answer["choices"][0]["message"]["content"] == final("done")
    # A body without a model gets the host's default model.
    assert scripted.requests[-1]["model"] == "local:scripted-default"
    assert run('ai("say hi", model="local:other")', context=Context(host=host)) == final("done")
    assert scripted.requests[-1]["model"] == "local:other"


def test_server_host_unreachable_models(tmp_path: Path) -> None:
    host = server_host(_settings(tmp_path, closed_port_url() + "/v1"))
    assert host is not None
    with pytest.raises(ModelRequestError) as info:
        host.embed({"input": ["x"]}, None)
    assert info.value.status == 502 and "cannot reach the inference server" in info.value.message
    with pytest.raises(ConchError) as err:
        run('ai("x")', context=Context(host=host))
    assert err.value.kind == "ProviderError" and err.value.message.startswith("ai: cannot reach")


def test_a_worker_without_settings_has_no_host() -> None:
    assert server_host(None) is None
    assert isinstance(server_host(Settings(), lambda kind, data: None).tasks, ChannelTasks)  # type: ignore[union-attr]


def test_the_dask_workers_host_records_the_task_in_the_database(
    scripted: ScriptedModel, tmp_path: Path
) -> None:
    """A program calling ``agent`` on a Dask worker (run_on_dask_worker, here in this process):
    the agent reaches the model server, its tool calls run in the program's run, and the task
    is written to the orchestration tables."""
    from conch import db
    from conch.orchestration.store import Stores
    from conch.sandbox.worker import WorkerConfig
    from conch.worker_process import run_on_dask_worker

    settings = _settings(tmp_path, scripted.v1)
    settings.ensure_dirs()
    goal = scripted.script("host: count on dask", tool("len", value=[1, 2, 3, 4]), final("four"))
    config = WorkerConfig(workspace=str(settings.workspace_dir),
                          allowed_effects=["pure", "read", "model"], memory_mb=512,
                          max_recursion=1000, settings_json=settings.model_dump_json())
    code = f'agent({{goal: "{goal}", tools: ["len"], max_steps: 3}})'
    done = run_on_dask_worker(dataclasses.asdict(config),
                              {"mode": "program", "source": code, "limits": {"wall_time_s": 30.0}})
    assert done["success"] is True, done
    value = done["value"]
    assert value["status"] == "succeeded" and value["result"] == "four"
    assert [s["observation"] for s in value["steps"]][:1] == ["4"]
    record = Stores(db.engine_for(settings.effective_database_url)).tasks.get_task(value["id"])
    assert record is not None
    assert (record["status"], record["result"], record["agent"]) == ("succeeded", "four", "default")
    assert record["model"] == "local:scripted-default" and record["tools"] == ["len"]
    assert len(record["steps"]) == 2 and record["usage"]["total_tokens"] == 30


def test_an_agent_call_that_takes_no_step_is_not_recorded(
    scripted: ScriptedModel, tmp_path: Path
) -> None:
    sent: list[tuple[str, dict[str, object]]] = []
    host = server_host(_settings(tmp_path, scripted.v1), lambda kind, data: sent.append((kind, data)))
    out = run('agent({goal: "none", tools: [], max_steps: 0})', context=Context(host=host))
    assert out["status"] == "failed" and out["error"]["kind"] == "LimitError"
    assert sent == []
    goal = scripted.script("host: one step", final("ok"))
    out = run(f'agent({{goal: "{goal}", tools: ["len"], max_steps: 2}})', context=Context(host=host))
    assert out["status"] == "succeeded"
    assert [kind for kind, _ in sent] == ["task.insert", "task.step", "task.finish"]
    assert sent[0][1]["id"] == out["id"] and sent[0][1]["model"] == "local:scripted-default"
    json.dumps(sent)  # what a worker sends the server is plain data


def test_shell_host_reads_the_configuration_when_asked(
    scripted: ScriptedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shell's host reads the settings on first need, not when made (cold start), and an
    explicit models_url sends the shell's model calls to that server; it records nothing."""
    host = shell_host()
    assert host.tasks is None
    monkeypatch.setenv("CONCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("CONCH_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("CONCH_MODELS_URL", scripted.v1)
    monkeypatch.setenv("CONCH_DEFAULT_MODEL", "local:shell-default")
    get_settings.cache_clear()
    try:
        assert run('ai("from the shell")', context=Context(host=host)) == final("done")
        assert scripted.requests[-1]["model"] == "local:shell-default"
        goal = scripted.script("host: shell agent", tool("len", value="abc"), final("3"))
        out = run(f'agent({{goal: "{goal}", tools: ["len"], max_steps: 3}})',
                  context=Context(host=host))
        assert out["status"] == "succeeded" and out["result"] == "3"
    finally:
        get_settings.cache_clear()
