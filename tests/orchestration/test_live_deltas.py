"""A task's event stream with ``?deltas=true``: the model's turns as they are generated
(text, thinking text, tool calls as they form, elapsed time and tokens), live only, for the
subscribers that asked; the model is asked to stream only while someone watches. Against a
real agent server and the scripted model, which streams as OpenAI does."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest

from conch.orchestration.live import FEED_LIMIT, RESTREAM_S, Live
from testsupport.scripted_model import USAGE, ScriptedModel, call, final, native, tool
from testsupport.servers import Server, finished, wait_for

pytestmark = pytest.mark.timeout(120)

API = "/api/v1/orchestration"
MODEL = "live-tools"  # the scripted model lists "tools" for it: native tool calls

Event = tuple[str, str | None, Any]  # (name, id or None, data)


class Reader:
    """A task's event stream read in a thread as it comes: ``(event, id, data)``."""

    def __init__(self, server: Server, path: str, headers: dict[str, str] | None = None) -> None:
        self.events: list[Event] = []
        self.connected = threading.Event()
        self.error: BaseException | None = None
        self._url, self._headers = server.url + path, headers or {}
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self.connected.wait(30), "the event stream did not answer"

    def _read(self) -> None:
        try:
            with httpx.stream("GET", self._url, headers=self._headers, timeout=60) as r:
                assert r.status_code == 200, r.read()
                self.connected.set()
                name, id_, data = "message", None, ""
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("id: "):
                        id_ = line[4:]
                    elif line.startswith("data: "):
                        data = line[6:]
                    elif not line and data:
                        self.events.append((name, id_, json.loads(data)))
                        name, id_, data = "message", None, ""
        except BaseException as exc:
            self.error = exc
            self.connected.set()

    def join(self, timeout: float = 60) -> list[Event]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the event stream did not end"
        assert self.error is None, self.error
        return self.events


def create(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    r = c.post(f"{API}/tasks", json=body)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def asked_first(scripted: ScriptedModel, goal: str) -> None:
    """Until the task's first model request has come in (so its turn is under way)."""
    deadline = time.monotonic() + 30
    while not scripted.requests_for(goal):
        assert time.monotonic() < deadline, "the task did not ask the model"
        time.sleep(0.01)


def live(events: list[Event], name: str, step: int | None = None) -> list[dict[str, Any]]:
    return [d for n, _i, d in events if n == name and (step is None or d.get("step") == step)]


def stored(events: list[Event]) -> list[Event]:
    return [e for e in events if e[1] is not None]


def test_json_task_streams_its_turns_to_a_watcher(server: Server, scripted: ScriptedModel) -> None:
    answer = final("two")
    goal = scripted.script_by_position(
        "live: count two",
        # Asked before anyone watches, and held long enough for the watcher to join after
        # RESTREAM_S: it is not asked again, and not streamed.
        {"delay_first": RESTREAM_S + 3, "content": tool("len", value=[1, 2])},
        {"content": answer, "reasoning": "The list has two items.", "stream_delay": 0.01},
    )
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["len"], "max_steps": 3})
        path = f"{API}/tasks/{task['id']}/events"
        asked_first(scripted, goal)
        time.sleep(RESTREAM_S + 0.5)
        watcher = Reader(server, path + "?deltas=true")
        plain = Reader(server, path)
        events, without = watcher.join(), plain.join()
        record = wait_for(c, f"{API}/tasks/{task['id']}", finished)
    assert record["status"] == "succeeded", record

    # The stored events are all there, numbered as ever; live ones carry no number.
    assert [(n, i) for n, i, _d in stored(events)] == [
        ("start", "1"), ("step", "2"), ("step", "3"), ("complete", "4"),
    ]  # fmt: skip
    assert stored(events) == without  # a subscriber that did not ask gets no live events
    names = [n for n, _i, _d in events]
    # Joined during the first turn: told it is under way (not streamed), and of its end.
    first = live(events, "model_start", 0)
    assert first and first[0]["streamed"] is False and first[0]["turn"] == 0
    assert first[0]["started_at"].endswith("Z") and first[0]["task_elapsed_ms"] >= 0
    assert not live(events, "delta", 0)
    end0 = live(events, "model_end", 0)[0]
    assert end0["usage"] == USAGE and end0["elapsed_ms"] >= 1000 * RESTREAM_S
    # The second turn streams: its thinking and its text, as generated, before its step.
    start1 = live(events, "model_start", 1)[0]
    assert start1["streamed"] is True and start1["turn"] == 1
    deltas = live(events, "delta", 1)
    text = "".join(d["text"] for d in deltas if d["type"] == "text")
    thinking = "".join(d["text"] for d in deltas if d["type"] == "thinking")
    assert text == answer and thinking == "The list has two items."
    assert [d["tokens"] for d in deltas] == list(range(1, len(deltas) + 1))
    assert all(d["elapsed_ms"] >= 0 and d["turn"] == 1 for d in deltas)
    assert deltas[-1]["elapsed_ms"] >= 10 * (len(deltas) - 1) - 5  # paced as generated
    end1 = live(events, "model_end", 1)[0]
    assert end1["tokens"] == len(deltas) and end1["usage"] == USAGE
    assert end1["task_elapsed_ms"] >= end1["elapsed_ms"]
    order = [(n, d.get("step", d.get("index"))) for n, _i, d in events if n != "delta"]
    assert (
        order.index(("model_end", 1)) < order.index(("step", 1)) < order.index(("complete", None))
    )
    assert names.index("model_start") < names.index("delta")
    # The model was asked to stream only while someone watched.
    asked = scripted.requests_for(goal)
    assert [r.get("stream", False) for r in asked] == [False, True]
    assert asked[1]["stream_options"] == {"include_usage": True}
    # Nothing live is stored: the steps are as a task no one watched records them.
    assert record["steps"][1]["args"] == {"final": "two"}
    assert record["steps"][1]["usage"] == USAGE


def test_a_watcher_that_joins_at_once_sees_the_first_turn(
    server: Server, scripted: ScriptedModel
) -> None:
    """A client that creates a task and opens its stream at once: the first model request,
    begun before anyone watched, is asked again, streamed (the same turn: nothing recorded
    twice)."""
    goal = scripted.script_by_position(
        "live: watched from the start",
        {"delay_first": 10, "content": tool("len", value=[1, 2]), "stream_delay": 0.005},
        {"content": final("two"), "stream_delay": 0.005},
    )
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["len"], "max_steps": 3})
        asked_first(scripted, goal)
        started = time.monotonic()
        events = Reader(server, f"{API}/tasks/{task['id']}/events?deltas=true").join()
        took = time.monotonic() - started
        record = wait_for(c, f"{API}/tasks/{task['id']}", finished)
    assert record["status"] == "succeeded", record
    assert took < 8  # the held first request was dropped, not waited for
    starts = live(events, "model_start")
    assert [(d["step"], d["turn"], d["streamed"]) for d in starts] == [(0, 0, True), (1, 1, True)]
    text = "".join(d["text"] for d in live(events, "delta", 0) if d["type"] == "text")
    assert text == tool("len", value=[1, 2])
    assert [d["step"] for d in live(events, "model_end")] == [0, 1]
    asked = scripted.requests_for(goal)
    assert [r.get("stream", False) for r in asked] == [False, True, True]
    assert asked[0]["messages"] == asked[1]["messages"]  # the same turn, asked again
    assert len(record["steps"]) == 2 and record["steps"][0]["observation"] == "2"
    assert record["usage"]["total_tokens"] == 2 * USAGE["total_tokens"]


def test_native_tool_call_forms_live(server: Server, scripted: ScriptedModel) -> None:
    scripted.tool_models.add(MODEL)
    goal = scripted.script_by_position(
        "live: native calls",
        native(call("len", value=[1]), delay_first=RESTREAM_S + 3),
        native(call("len", value=[1, 2, 3]), reasoning="Count them.", stream_delay=0.005),
        {"content": "three", "stream_delay": 0.005},
    )
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["len"], "max_steps": 4, "model": MODEL})
        asked_first(scripted, goal)
        time.sleep(RESTREAM_S + 0.5)
        events = Reader(server, f"{API}/tasks/{task['id']}/events?deltas=true").join()
        record = wait_for(c, f"{API}/tasks/{task['id']}", finished)
    assert record["status"] == "succeeded" and record["result"] == "three", record
    assert record["protocol"] == "native"
    calls = [d for d in live(events, "delta", 1) if d["type"] == "tool_call"]
    assert calls[0]["name"] == "len" and calls[0]["id"].startswith("call_")
    assert calls[0]["index"] == 0 and calls[0]["arguments"] == ""
    assert all("name" not in d for d in calls[1:])
    assert json.loads("".join(d["arguments"] for d in calls)) == {"value": [1, 2, 3]}
    thinking = [d["text"] for d in live(events, "delta", 1) if d["type"] == "thinking"]
    assert "".join(thinking) == "Count them."
    final_text = [d["text"] for d in live(events, "delta", 2) if d["type"] == "text"]
    assert "".join(final_text) == "three"
    # The call formed live is the call that ran.
    assert record["steps"][1]["calls"][0]["args"] == {"value": [1, 2, 3]}
    assert record["steps"][1]["observation"] == "3"
    asked = scripted.requests_for(goal)
    assert [r.get("stream", False) for r in asked] == [False, True, True]


def test_reconnect_gets_stored_events_only(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script(
        "live: reconnect", tool("len", value=[1]), {"content": final("one"), "stream_delay": 0.005}
    )
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["len"], "max_steps": 3})
        wait_for(c, f"{API}/tasks/{task['id']}", finished)
        path = f"{API}/tasks/{task['id']}/events?deltas=true"
        resumed = Reader(server, path, headers={"Last-Event-ID": "2"}).join()
        again = Reader(server, path).join()
    assert [(n, i) for n, i, _d in resumed] == [("step", "3"), ("complete", "4")]
    assert all(i is not None for _n, i, _d in again) and len(again) == 4


def test_deltas_is_for_tasks_only(server: Server) -> None:
    with server.client() as c:
        wf = c.post(f"{API}/workflows", json={"steps": [{"id": "a", "run": "1"}]}).json()
        r = c.get(f"{API}/workflows/{wf['id']}/events?deltas=true")
        assert r.status_code == 400 and r.json()["error"]["where"] == "deltas"
        task = create(c, {"goal": "live: bad flag", "tools": [], "max_steps": 1})
        assert c.get(f"{API}/tasks/{task['id']}/events?deltas=maybe").status_code in (400, 422)
        assert c.get(f"{API}/tasks/task_none/events?deltas=true").status_code == 404


def test_unwatched_tasks_never_stream(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script("live: nobody watches", tool("len", value=[1]), final("1"))
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["len"], "max_steps": 3})
        record = wait_for(c, f"{API}/tasks/{task['id']}", finished)
        # A subscriber that did not ask for deltas does not make the model stream either.
        plain = Reader(server, f"{API}/tasks/{task['id']}/events").join()
    assert record["status"] == "succeeded"
    assert len(plain) == 4
    assert all("stream" not in r for r in scripted.requests_for(goal))
    orchestrator = server.orchestrator
    assert not orchestrator.rt.live._feeds and not orchestrator.rt.live._turns


def test_model_server_not_up_yet_is_waited_for(make_server: Any) -> None:
    model = ScriptedModel().start()
    port = model.port
    model.stop()  # nothing listens there now
    goal = model.script("live: model comes up late", tool("len", value=[1, 2]), final("2"))
    srv = make_server(models_url=f"http://127.0.0.1:{port}/v1", model_retry_s=30)
    try:
        with srv.client() as c:
            task = create(c, {"goal": goal, "tools": ["len"], "max_steps": 3})
            watcher = Reader(srv, f"{API}/tasks/{task['id']}/events?deltas=true")
            time.sleep(1.5)
            assert c.get(f"{API}/tasks/{task['id']}").json()["status"] == "running"
            model.start(port)
            record = wait_for(c, f"{API}/tasks/{task['id']}", finished, 60)
            events = watcher.join()
    finally:
        model.stop()
    assert record["status"] == "succeeded" and record["result"] == "2", record
    retries = live(events, "model_retry")
    assert retries and "cannot reach the model server" in retries[0]["error"]
    assert retries[0]["retry_in_ms"] > 0


def test_model_server_that_stays_away_fails_the_task(make_server: Any) -> None:
    model = ScriptedModel().start()
    port = model.port
    model.stop()
    srv = make_server(models_url=f"http://127.0.0.1:{port}/v1", model_retry_s=1.5)
    with srv.client() as c:
        started = time.monotonic()
        task = create(c, {"goal": "live: no model", "tools": [], "max_steps": 2})
        record = wait_for(c, f"{API}/tasks/{task['id']}", finished, 60)
        took = time.monotonic() - started
    assert record["status"] == "failed"
    assert record["error"]["kind"] == "ProviderError"
    assert "model_retry_s" in record["error"]["message"], record["error"]
    assert 1.4 <= took < 20


def test_a_stream_that_fails_midway_fails_the_turn(server: Server, scripted: ScriptedModel) -> None:
    goal = scripted.script_by_position(
        "live: broken stream",
        {"delay_first": 10, "content": tool("len", value=[1])},
        {"content": '{"fin', "stream_error": "the engine failed", "stream_delay": 0.01},
    )
    with server.client() as c:
        task = create(c, {"goal": goal, "tools": ["len"], "max_steps": 3})
        asked_first(scripted, goal)
        events = Reader(server, f"{API}/tasks/{task['id']}/events?deltas=true").join()
        record = wait_for(c, f"{API}/tasks/{task['id']}", finished)
    assert record["status"] == "failed"
    assert record["error"]["kind"] == "ProviderError"
    assert "the engine failed" in record["error"]["message"]
    # Not a server that is not up: asked once, not again.
    asked = [r.get("stream", False) for r in scripted.requests_for(goal)]
    assert asked == [False, True, True]  # the first turn asked again for the watcher
    end = live(events, "model_end", 1)[0]
    assert "the engine failed" in end["error"] and end["tokens"] == 2
    assert [n for n, _i, _d in events][-1] == "error"


def test_a_subscriber_that_falls_behind_is_told() -> None:
    hub = Live()
    assert hub.begin("task:x", 0, 0, None) is None  # no one watches: nothing to stream to
    hub.end("task:x", None, {"completion_tokens": 3})
    feed = hub.subscribe("task:x")
    turn = hub.begin("task:x", 1, 1, None)
    assert turn is not None
    for _ in range(FEED_LIMIT + 10):
        turn.delta({"type": "text", "text": "a"})
    got = feed.take()
    assert len(got) == FEED_LIMIT + 1
    assert got[0][0] == "model_start" and got[-1] == ("delta_gap", {"dropped": 11})
    hub.end("task:x", turn, {"completion_tokens": 3})
    assert feed.take()[0][1]["tokens"] == FEED_LIMIT + 10
    hub.unsubscribe("task:x", feed)
    assert not hub.watched("task:x")
