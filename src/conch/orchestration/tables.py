"""The orchestration tables: agents, tasks, workflows, their steps and the event log.

Times are Unix seconds (floats) so that leases and backoff compare without time-zone
parsing; records render them as ISO-8601 UTC. Created by the ``orchestration`` Alembic
branch (``0002_orchestration``, ``0004_checkpoints``, ``0005_task_threads``,
``0009_orchestration_tenants``), never by ``metadata.create_all``.

Tenants. Agents, tasks and workflows belong to the tenant of the key that made them
(``tenant``; ``None``: the admin's, as everything made before keys); a task or workflow also
keeps the key's id (``key_id``), whose limits its model calls count against.
"""

from __future__ import annotations

import sqlalchemy as sa

from conch.db import metadata


# Column sets that tasks and workflow steps share, because the store treats them alike: it
# records a run's outcome, times it, and leases it to one server at a time (renewing and
# reclaiming task and step leases in the same way).
def _outcome() -> list[sa.Column[object]]:
    return [sa.Column("result", sa.JSON, nullable=True), sa.Column("error", sa.JSON, nullable=True)]


def _span() -> list[sa.Column[object]]:
    return [
        sa.Column("started_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
    ]


def _lease() -> list[sa.Column[object]]:
    return [
        sa.Column("owner", sa.String, nullable=True),  # the server instance running it
        sa.Column("lease_until", sa.Float, nullable=True),
    ]


def _keyed_by_id(name: str, *columns: sa.Column[object] | sa.Index) -> sa.Table:
    """A table of records each named by a string ``id`` (generated, or the agent's name)."""
    return sa.Table(name, metadata, sa.Column("id", sa.String, primary_key=True), *columns)


agents = _keyed_by_id(
    "orch_agents",
    sa.Column("description", sa.String, nullable=False, default=""),
    sa.Column("system_prompt", sa.Text, nullable=False, default=""),
    sa.Column("tools", sa.JSON, nullable=False),
    sa.Column("model", sa.String, nullable=False),
    sa.Column("source", sa.String, nullable=False),  # registered | marketplace
    sa.Column("version", sa.String, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    # The agent's approval policy (conch.orchestration.approvals), over the server's.
    sa.Column("approvals", sa.JSON, nullable=True),
    sa.Column("tenant", sa.String, nullable=True),
)

tasks = _keyed_by_id(
    "orch_tasks",
    sa.Column("goal", sa.Text, nullable=False),
    sa.Column("tools", sa.JSON, nullable=False),
    sa.Column("max_steps", sa.Integer, nullable=False),
    sa.Column("agent", sa.String, nullable=False),
    sa.Column("model", sa.String, nullable=False),
    sa.Column("status", sa.String, nullable=False, index=True),
    sa.Column("steps", sa.JSON, nullable=False),
    *_outcome(),
    sa.Column("usage", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    *_span(),
    sa.Column("origin", sa.String, nullable=False),  # api | workflow | builtin
    *_lease(),
    # Human approval: the task's resolved policy, how long a person has to decide, the calls
    # waiting for a decision (status ``waiting``) and when the wait times out.
    sa.Column("approvals", sa.JSON, nullable=True),
    sa.Column("approval_timeout_s", sa.Float, nullable=True),
    sa.Column("pending", sa.JSON, nullable=True),
    sa.Column("wait_until", sa.Float, nullable=True),
    # Threads and forks: the thread the task continues, the task (and its checkpoint step) it
    # was forked from, the messages its conversation starts from before its goal; and the
    # tool-call protocol it ran with (native | json).
    sa.Column("thread_id", sa.String, nullable=True, index=True),
    sa.Column("forked_from", sa.String, nullable=True),
    sa.Column("fork_checkpoint", sa.Integer, nullable=True),
    sa.Column("history", sa.JSON, nullable=True),
    sa.Column("protocol", sa.String, nullable=True),
    sa.Column("tenant", sa.String, nullable=True),
    sa.Column("key_id", sa.String, nullable=True),
    sa.Index("ix_orch_tasks_tenant", "tenant", "created_at"),
    # The session its tool calls run in (conch.sessions): given, or its thread's
    sa.Column("session", sa.String, nullable=True),
)

workflows = _keyed_by_id(
    "orch_workflows",
    sa.Column("name", sa.String, nullable=False),
    sa.Column("status", sa.String, nullable=False, index=True),
    sa.Column("definition", sa.JSON, nullable=False),
    sa.Column("error", sa.JSON, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float, nullable=True),
    sa.Column("tenant", sa.String, nullable=True),
    sa.Column("key_id", sa.String, nullable=True),
    sa.Index("ix_orch_workflows_tenant", "tenant", "created_at"),
)

workflow_steps = sa.Table(
    "orch_workflow_steps",
    metadata,
    sa.Column("workflow_id", sa.String, primary_key=True),
    sa.Column("id", sa.String, primary_key=True),
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("status", sa.String, nullable=False),
    # Dependencies not yet succeeded: a pending step is claimable when this reaches 0.
    sa.Column("blocked", sa.Integer, nullable=False),
    *_outcome(),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("max_attempts", sa.Integer, nullable=False),
    *_span(),
    sa.Column("not_before", sa.Float, nullable=False, default=0.0),
    *_lease(),
    sa.Column("task_id", sa.String, nullable=True),
    sa.Index("ix_orch_steps_claim", "status", "blocked", "not_before"),
)

# A task's checkpoint: every model reply, every tool call as it starts and as it completes,
# every approval asked for and decided, in order (``seq`` per task). A task resumes from it
# after its server died: the loop is replayed with the recorded replies and results.
checkpoints = sa.Table(
    "orch_checkpoints",
    metadata,
    sa.Column("task_id", sa.String, primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("kind", sa.String, nullable=False),  # model | ask | decision | call | result
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

events = sa.Table(
    "orch_events",
    metadata,
    sa.Column("stream", sa.String, primary_key=True),  # "task:<id>" | "workflow:<id>"
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("event", sa.String, nullable=False),
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)
