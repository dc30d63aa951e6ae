"""Rows of the orchestration tables as the API shows them: tasks, workflows and their steps.

Times are stored as Unix seconds and shown as ISO-8601 UTC with milliseconds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from conch.orchestration import tables as t


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_record(row: Any) -> dict[str, Any]:
    duration = None
    if row.started_at is not None and row.finished_at is not None:
        duration = int((row.finished_at - row.started_at) * 1000)
    return {
        "id": row.id,
        "goal": row.goal,
        "tools": row.tools,
        "max_steps": row.max_steps,
        "agent": row.agent,
        "model": row.model,
        "status": row.status,
        "steps": row.steps,
        "result": row.result,
        "error": row.error,
        "created_at": iso(row.created_at),
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
        "duration_ms": duration,
        "usage": row.usage,
        "pending": row.pending or [],
        "approvals": row.approvals or {},
        "approval_timeout_s": row.approval_timeout_s,
        "approval_deadline": iso(row.wait_until),
        "thread_id": row.thread_id,
        "forked_from": row.forked_from,
        "fork_checkpoint": row.fork_checkpoint,
        "protocol": row.protocol,
        "tenant": row.tenant,
        # Only where there is one: a task without a session answers as it always did.
        **({"session": row.session} if row.session is not None else {}),
    }


def step_record(row: Any, definition: dict[str, Any] | None = None) -> dict[str, Any]:
    status = row.status
    if status == "running" and getattr(row, "task_status", None) == "waiting":
        # Its agent task waits for a person's approval.
        status = "waiting"
    out = {
        "id": row.id,
        "status": status,
        "result": row.result,
        "error": row.error,
        "attempts": row.attempts,
        "started_at": iso(row.started_at),
        "finished_at": iso(row.finished_at),
    }
    if row.task_id is not None:
        out["task_id"] = row.task_id
    if definition is not None:
        out["definition"] = definition
    return out


def workflow_record(wf: Any, steps: Any) -> dict[str, Any]:
    # Each step carries its definition as submitted (depends_on, run | task, retries…),
    # so a reader can draw the DAG and re-submit the workflow from the record alone.
    defs = {d.get("id"): d for d in (wf.definition or {}).get("steps", []) if isinstance(d, dict)}
    return {
        "id": wf.id,
        "name": wf.name,
        "status": wf.status,
        "inputs": (wf.definition or {}).get("inputs", {}),
        "steps": [step_record(s, defs.get(s.id)) for s in steps],
        "error": wf.error,
        "created_at": iso(wf.created_at),
        "finished_at": iso(wf.finished_at),
        "tenant": wf.tenant,
    }


def steps_with_task_status() -> sa.Select[Any]:
    """Workflow steps with the status of their agent task (a running step whose task waits
    for an approval shows as ``waiting``)."""
    s, tk = t.workflow_steps, t.tasks
    return sa.select(s, tk.c.status.label("task_status")).select_from(
        s.outerjoin(tk, tk.c.id == s.c.task_id)
    )
