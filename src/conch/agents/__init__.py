"""The agents' old home, kept only for the ``agent`` builtin (see ``registry``)."""
