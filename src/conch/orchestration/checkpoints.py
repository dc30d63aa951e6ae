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
  (or the approval timeout's) decision on it;
- ``message`` ``{before, content}``: a user message added to the conversation before step
  ``before``'s model request (a fork's added message).

The agent loop makes the same requests in the same order given the same replies and
results, so resuming is replaying: the n-th model request is answered with the n-th
recorded reply, a call with a recorded result is answered with it, and only what never
completed is done (again). :class:`Journal` is that reading; it knows nothing of databases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conch.orchestration.errors import Invalid
from conch.orchestration.protocols import parse_action
from conch.orchestration.turns import Reply, call_id

__all__ = ["KINDS", "CheckpointError", "Journal", "call_id"]

KINDS = ("model", "call", "result", "ask", "decision", "message", "protocol")


class CheckpointError(Exception):
    """The checkpoint cannot be read back (the task cannot be resumed from it)."""


@dataclass
class Journal:
    replies: list[Reply] = field(default_factory=list)
    # call_id -> the recorded result entry
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    # call_id -> the call's latest ``call``, ``ask`` or ``decision`` entry, with its kind
    last: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    # step index -> the user messages added before its model request
    notes: dict[int, list[str]] = field(default_factory=dict)
    # The protocol the server chose for a task that asked for none (``auto``): until the
    # model's first answer, a choice that may still fall back to JSON actions.
    chosen_protocol: str | None = None

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
        if kind == "protocol":
            if data["protocol"] not in ("native", "json"):
                raise ValueError(f"unknown protocol {data['protocol']!r}")
            self.chosen_protocol = data["protocol"]
            return
        if kind == "message":
            if not isinstance(data["content"], str):
                raise TypeError("content is not a string")
            self.notes.setdefault(int(data["before"]), []).append(data["content"])
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


def _step_of(cid: str) -> int:
    """The step of a call id: ``call_{index}`` or ``call_{index}_{k}``."""
    return int(cid.split("_")[1])


def fork(
    steps: list[dict[str, Any]],
    entries: list[tuple[str, Any]],
    checkpoint: int,
    *,
    tool_result: str | None = None,
    message: str | None = None,
    native: bool = False,
) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """What a fork of a task at ``checkpoint`` starts from: the task's steps ``0 ..
    checkpoint-1`` and the checkpoint entries that answer them (their model replies, their
    calls' results, the approvals and messages before them), with the last kept call's
    observation replaced by ``tool_result`` and ``message`` added before the next step's
    model request. Replayed, these answer every model request and tool call of the kept
    steps, so nothing before the fork point is asked or run again. :class:`Invalid` (naming
    the field) when the checkpoint is out of range or does not hold the kept steps.
    ``native``: the task used the native tool-call protocol (one model turn per step, calls
    ``call_{index}_{k}`` when a turn made several; the last of them is the one edited)."""
    turns = _kept_turns(steps, entries, checkpoint, native)
    last_call = call_id(checkpoint - 1)
    if native and checkpoint > 0:
        calls = steps[checkpoint - 1].get("calls") or []
        if calls:
            last_call = str(calls[-1]["call_id"])
    out, edited = _copied(entries, turns, checkpoint, last_call, tool_result)
    kept = [dict(s) for s in steps[:checkpoint]]
    if tool_result is not None:
        if not edited:
            why = (
                "a fork at checkpoint 0 keeps no step"
                if checkpoint == 0
                else f"step {checkpoint - 1} made no tool call whose result could be replaced"
            )
            raise Invalid(f"tool_result: {why}", where="tool_result")
        last = kept[-1]
        calls = [dict(c) for c in last.get("calls") or []]
        if calls:
            calls[-1].update(observation=tool_result, error=None)
            last["calls"] = calls
        if len(calls) <= 1:
            last.update(observation=tool_result, error=None)
    if message is not None:
        out.append(("message", {"before": checkpoint, "content": message}))
    return kept, out


def _kept_turns(
    steps: list[dict[str, Any]], entries: list[tuple[str, Any]], checkpoint: int, native: bool
) -> int:
    """How many model turns the steps a fork keeps took; :class:`Invalid` when the
    checkpoint is out of range or its entries do not hold them."""
    final = bool(steps) and steps[-1].get("action") == "final"
    most = len(steps) - 1 if final else len(steps)
    if not 0 <= checkpoint <= most:
        ends = " (its last step is the final answer)" if final else ""
        raise Invalid(
            f"checkpoint: the task has {len(steps)} recorded steps{ends}: a fork keeps steps "
            f"0..checkpoint-1, with checkpoint from 0 to {most}",
            where="checkpoint",
        )
    try:
        journal = Journal.load(entries)
    except CheckpointError as exc:
        raise Invalid(f"checkpoint: {exc}", where="checkpoint") from None
    # The model turns of the kept steps: one each, two for a step whose first reply was not
    # an action (the loop's corrective retry).
    turns = checkpoint if native else 0
    for _index in range(0 if native else checkpoint):
        if turns < len(journal.replies):
            try:
                parse_action(journal.replies[turns].text)
            except ValueError:
                turns += 1
        turns += 1
    if turns > len(journal.replies):
        raise Invalid(
            f"checkpoint: the task's checkpoint does not hold the model replies of steps "
            f"0..{checkpoint - 1} (it has {len(journal.replies)}): it cannot be forked there",
            where="checkpoint",
        )
    return turns


def _copied(
    entries: list[tuple[str, Any]],
    turns: int,
    checkpoint: int,
    last_call: str,
    tool_result: str | None,
) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
    """The entries of the kept steps (the result of ``last_call`` replaced by
    ``tool_result``), and whether that result was there to replace."""
    out: list[tuple[str, dict[str, Any]]] = []
    edited = False
    for kind, data in entries:
        if kind == "model":
            keep = int(data["turn"]) < turns
        elif kind == "message":
            keep = int(data["before"]) < checkpoint
        elif kind == "protocol":
            keep = True  # the fork runs in its original's protocol, chosen or not alike
        else:
            keep = _step_of(str(data["call_id"])) < checkpoint
        if not keep:
            continue
        data = dict(data)
        if tool_result is not None and kind == "result" and data["call_id"] == last_call:
            data.update(observation=tool_result, error=None, edited=True)
            edited = True
        out.append((kind, data))
    return out, edited
