"""The port through which a run reaches what the language does not own: models and agents.

``ai`` needs a chat completion, ``embed`` embedding vectors, ``agent`` an agent loop whose
tool calls are builtin calls of this very run (and, where the host keeps them, a task
record). The language asks for these through the :class:`Host` on the run's
:class:`~conch.lang.context.Context` and never imports what answers: the programs that run
conch (the shell, the agent server's sandbox workers, a Dask worker) implement the port
(``conch.host``) and hand it to the run.

A run without a host (``Context.host`` is None: an application that embeds the language and
gave none) fails these builtins with a ``ProviderError`` that says what is missing
(:func:`require`); nothing is reached behind the program's back.
"""

from __future__ import annotations

from conch.lang.errors import ConchError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, Protocol

    # A builtin call of the run, by name and arguments, as the model's tool call: the
    # envelope ``{success, result}`` or ``{success: false, error: {kind, message}}``.
    ToolCall = Callable[[str, dict[str, Any]], dict[str, Any]]

    class Host(Protocol):
        """What the language needs from the program running it (typing only: the typing
        module is not imported at run time). ``deadline`` is when the run must end, a
        ``time.monotonic()`` value (None: no wall-time limit): a call waits no longer."""

        def chat(self, body: dict[str, Any], deadline: float | None) -> dict[str, Any]:
            """One OpenAI chat completion for ``body`` (a request body of
            ``/v1/chat/completions``; without ``model``, the host's default model). Raises
            :class:`ModelRequestError` when there is no answer."""
            ...

        def embed(self, body: dict[str, Any], deadline: float | None) -> dict[str, Any]:
            """The OpenAI embeddings answer for ``body`` (a request body of
            ``/v1/embeddings``; without ``model``, the host's default embedding model).
            Raises :class:`ModelRequestError` when there is no answer."""
            ...

        def run_agent(self, *, goal: str, tools: list[str] | None, max_steps: int,
                      model: str | None, deadline: float | None,
                      call_tool: ToolCall) -> dict[str, Any]:
            """Run an agent loop to ``goal`` and return ``{id, status, result, steps,
            error}``. ``tools``: the builtins the model may call (None: the host's default
            agent's); ``model``: ``provider:name`` (None: the host's default); every tool
            call goes through ``call_tool``. The host records the run as a task where it
            keeps tasks."""
            ...


class ModelRequestError(Exception):
    """A model request the host could not answer. ``status`` says why, as HTTP does: 400,
    404 and 422 the request (an unknown model, a bad parameter), 504 no answer in time,
    anything else the model's side (unreachable, failing)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def require(host: Host | None, builtin: str, need: str) -> Host:
    """The run's host (``Context.host``), or the error that says ``builtin`` cannot ``need``
    without one."""
    if host is None:
        raise ConchError(
            "ProviderError",
            f"{builtin}: this run has no host to {need}",
            hint="the conch shell and servers give every run one; an application embedding "
            "conch gives it as Context(host=...)",
        )
    return host
