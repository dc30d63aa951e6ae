"""The conch language: compile a program once, run it many times."""

from conch.lang.interpreter import Program, Stage, compile_program, compile_stage, run

TYPE_CHECKING = False
if TYPE_CHECKING:
    from conch.lang.session import Session


def __getattr__(name: str) -> object:
    # imported on first use: a one-off program (``conch -c``) does not load sessions
    if name == "Session":
        from conch.lang.session import Session

        return Session
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Program", "Session", "Stage", "compile_program", "compile_stage", "run"]
