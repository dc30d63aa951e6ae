"""The conch language: compile a program once, run it many times."""

from conch.lang.interpreter import Program, Session, Stage, compile_program, compile_stage, run

__all__ = ["Program", "Session", "Stage", "compile_program", "compile_stage", "run"]
