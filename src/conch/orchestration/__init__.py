"""Orchestration: agent tasks, durable DAG workflows and their events (no HTTP)."""
