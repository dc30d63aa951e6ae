"""The run envelope: what one run answers, from the worker through the pool to the client.

``{success, result, type, value, output, error, elapsed_ms}`` (and ``steps`` for a
pipeline). The worker builds it (:meth:`RunEnvelope.ok`, :meth:`RunEnvelope.failure`), sends
it as a plain dict (:meth:`to_wire`), the pool reads it back with :meth:`from_wire` (which
refuses a malformed frame: a worker is not trusted), and the server stamps ``elapsed_ms``
and writes :meth:`to_json`. The OpenAPI document of the agent server is generated from these
classes, so the documented shape is the sent one.

Dataclasses rather than pydantic models: an envelope is built and read on every request of
the hot path, and there is nothing to validate that :meth:`from_wire` does not check.

``cpu_s`` is the CPU time the run took in its worker (user and system, its commands
included), measured by the worker and sent on the wire for the server's CPU budgets of keys;
it is not part of the client's body (nor of the documented shape).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

from pydantic import Field

from conch.sandbox.frames import dumps


@dataclass(slots=True)
class RunError:
    """A failed run: the conch error ``kind`` and ``message``, with its position if known."""

    kind: str
    message: str
    line: int | None = None
    column: int | None = None
    hint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class StepTiming:
    """One pipeline stage: its 1-based index, the type it produced and how long it took."""

    step: int
    type: str
    elapsed_ms: int


@dataclass(slots=True)
class RunEnvelope:
    """The answer of a run. ``result`` is the string rendering of the value (a String as it
    is), ``type`` its conch type name, ``value`` the value as JSON, ``output`` the printed
    lines; ``error`` is set exactly when ``success`` is false."""

    success: bool
    result: str | None = None
    type: str | None = None
    value: Any = None
    output: list[str] = field(default_factory=list)
    error: RunError | None = None
    elapsed_ms: int = 0
    # The server's own (see the module doc): excluded from the body and the OpenAPI document.
    cpu_s: Annotated[float | None, Field(exclude=True)] = None

    @classmethod
    def ok(cls, result: str, type: str, value: Any, output: list[str]) -> RunEnvelope:
        return cls(True, result, type, value, output)

    @classmethod
    def failure(cls, error: RunError, output: list[str] | None = None) -> RunEnvelope:
        return cls(False, error=error, output=output if output is not None else [])

    def to_wire(self) -> dict[str, Any]:
        """The worker's frame: everything but ``elapsed_ms``, which the server measures."""
        return {
            "success": self.success,
            "result": self.result,
            "type": self.type,
            "value": self.value,
            "output": self.output,
            "error": None if self.error is None else self.error.to_json(),
        }

    def to_json(self) -> dict[str, Any]:
        """The client's body."""
        out = self.to_wire()
        out["elapsed_ms"] = self.elapsed_ms
        return out

    def to_json_bytes(self) -> bytes:
        return dumps(self.to_json())

    @staticmethod
    def from_wire(data: Any) -> RunEnvelope:
        """The envelope a worker sent; ``ValueError`` when it is not one."""
        if type(data) is not dict:
            raise ValueError("an envelope must be an object")
        try:
            success = data["success"]
            result = data.get("result")
            type_name = data.get("type")
            output = data.get("output", [])
            error = data.get("error")
            if (
                type(success) is not bool
                or success != (error is None)
                or (result is not None and type(result) is not str)
                or (type_name is not None and type(type_name) is not str)
                or type(output) is not list
            ):
                raise TypeError("fields of the wrong type")
            err = None if error is None else RunError(**error)
            cpu = data.get("cpu_s")
            if cpu is not None and (type(cpu) is not float or not 0 <= cpu < 1e9):
                raise TypeError("cpu_s must be a non-negative float")
            steps = data.get("steps")
            if steps is None:
                return RunEnvelope(
                    success, result, type_name, data.get("value"), output, err, cpu_s=cpu
                )
            timings = [StepTiming(**s) for s in steps]
            return PipelineEnvelope(
                success, result, type_name, data.get("value"), output, err, cpu_s=cpu,
                steps=timings,
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed envelope: {exc}") from None


@dataclass(slots=True)
class PipelineEnvelope(RunEnvelope):
    """A pipeline's envelope: adds the timing of each stage that ran."""

    steps: list[StepTiming] = field(default_factory=list)

    def to_wire(self) -> dict[str, Any]:
        out = RunEnvelope.to_wire(self)
        out["steps"] = [
            {"step": s.step, "type": s.type, "elapsed_ms": s.elapsed_ms} for s in self.steps
        ]
        return out
