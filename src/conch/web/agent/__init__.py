"""The agent server, one router per resource."""
