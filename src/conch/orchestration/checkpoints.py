"""A task's checkpoint, read back for resuming it.

The orchestrator records, in ``orch_checkpoints``, every step of an agent task as it
completes:

- ``model`` ``{turn, reply, usage, tool_calls?}``: the model's reply to the task's
  ``turn``-th request (a corrective retry is a turn of its own); ``tool_calls`` ``[{id,
  name, arguments}]`` with the native protocol when the reply called tools;
- ``call`` ``{index, call_id, tool, args, effect}``: a tool call starting (its result not
  known yet); ``call_id`` is ``call_{index}`` for the one call of a step, ``call_{index}_{k}``
  for the ``k``-th of several calls of one native model turn;
- ``result`` ``{index, call_id, tool, args, observation, error}``: what the model was told
  it came to (recorded with the step it completes);
- ``ask`` ``{call_id, tool, args, effect, reason}``: the call waits for a person;
- ``decision`` ``{call_id, decision: approve | reject, by, args | message}``: a person's
  (or the approval timeout's) decision on it.

The agent loop makes the same requests in the same order given the same replies and
results, so resuming is replaying: the n-th model request is answered with the n-th
recorded reply, a call with a recorded result is answered with it, and only what never
completed is done (again). :class:`Journal` is that reading; it knows nothing of databases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conch.orchestration.loop import Reply, call_id

__all__ = ["KINDS", "CheckpointError", "Journal", "call_id"]

KINDS = ("model", "call", "result", "ask", "decision")


class CheckpointError(Exception):
    """The checkpoint cannot be read back (the task cannot be resumed from it)."""


@dataclass
class Journal:
    replies: list[Reply] = field(default_factory=list)
    # call_id -> the recorded result entry
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    # call_id -> the call's latest ``call``, ``ask`` or ``decision`` entry, with its kind
    last: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def load(cls, entries: list[tuple[str, Any]]) -> Journal:
        """Read entries ``(kind, data)`` in order; :class:`CheckpointError` if one is not
        what it should be."""
        out = cls()
        for n, (kind, data) in enumerate(entries, start=1):
            try:
                out._add(kind, data)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise CheckpointError(
                    f"checkpoint entry {n} ({kind!r}) is unreadable: {type(exc).__name__}: {exc}"
                ) from None
        return out

    def _add(self, kind: str, data: Any) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        if not isinstance(data, dict):
            raise TypeError("not an object")
        if kind == "model":
            turn = int(data["turn"])
            if turn != len(self.replies):
                raise ValueError(f"model turn {turn} where turn {len(self.replies)} was due")
            usage = data.get("usage") or {}
            if not isinstance(usage, dict):
                raise TypeError("usage is not an object")
            calls = data.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list):
                    raise TypeError("tool_calls is not a list")
                calls = [
                    {"id": str(c.get("id") or ""), "name": str(c["name"]),
                     "arguments": str(c.get("arguments") or "")}
                    for c in calls
                ]  # fmt: skip
            self.replies.append(
                Reply(text=str(data["reply"]), usage=dict(usage), tool_calls=calls or None)
            )
            return
        cid = str(data["call_id"])
        if kind == "result":
            if not isinstance(data["observation"], str):
                raise TypeError("observation is not a string")
            if not isinstance(data["args"], dict):
                raise TypeError("args is not an object")
            self.results[cid] = data
            return
        if kind in ("call", "ask") and not isinstance(data["args"], dict):
            raise TypeError("args is not an object")
        if kind == "decision" and data["decision"] not in ("approve", "reject"):
            raise ValueError(f"unknown decision {data['decision']!r}")
        self.last[cid] = (kind, data)
