"""``POST /api/v1/analyse``: the language server's front end over HTTP (the studio's editor
marks errors before Run). Nothing is executed."""

from __future__ import annotations

from tests.web.agent_fixtures import *  # noqa: F403
from tests.web.agent_fixtures import AgentServer

ANALYSE = "/api/v1/analyse"


def test_diagnostics_with_exact_ranges(agent_server: AgentServer) -> None:
    code = 'let total = 1\nlet x = totl + 1\nupper("a", "b", "c")\nlet y = (1 + )\n'
    with agent_server.client() as c:
        body = c.post(ANALYSE, json={"code": code}).json()
    problems = {d["kind"]: d for d in body["diagnostics"]}
    name = problems["NameError"]
    assert (name["line"], name["column"], name["end_line"], name["end_column"]) == (2, 9, 2, 13)
    assert 'did you mean "total"?' in (name["hint"] or "")
    assert problems["TypeError"]["line"] == 3 and "upper" in problems["TypeError"]["message"]
    assert problems["SyntaxError"]["line"] == 4
    assert body["completions"] == [] and body["hover"] is None


def test_completions_hover_and_signature_at_the_cursor(agent_server: AgentServer) -> None:
    with agent_server.client() as c:
        done = c.post(ANALYSE, json={"code": "let items = [1]\nite", "line": 2, "column": 4}).json()
        hover = c.post(ANALYSE, json={"code": "sort_by([], fn(x) => x)", "line": 1,
                                      "column": 3}).json()
        sig = c.post(ANALYSE, json={"code": 'replace("a", ', "line": 1, "column": 14}).json()
    assert "items" in {item["label"] for item in done["completions"]}
    assert "sort_by" in hover["hover"]
    assert sig["signature"]["label"].startswith("replace(")
    assert sig["signature"]["active_parameter"] == 1


def test_nothing_runs_and_bad_bodies_are_400(agent_server: AgentServer) -> None:
    target = agent_server.workspace / "analysed.txt"
    with agent_server.client() as c:
        ok = c.post(ANALYSE, json={"code": 'write("analysed.txt", "ran")'})
        missing = c.post(ANALYSE, json={"line": 1})
        huge = c.post(ANALYSE, json={"code": "1" * 200_001})
        cursor = c.post(ANALYSE, json={"code": "1", "line": 0, "column": 1})
    assert ok.status_code == 200 and ok.json()["diagnostics"] == []
    assert not target.exists()
    for bad, field in ((missing, "code"), (huge, "code"), (cursor, "line")):
        assert bad.status_code == 400, bad.text
        assert field in bad.text
