"""The agent and code-execution server: one router module per resource, built by ``app.py``."""
