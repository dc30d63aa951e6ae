"""The real `conch` executable, run as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CONCH = Path(sys.executable).parent / "conch"

pytestmark = pytest.mark.skipif(not CONCH.exists(), reason="pip install -e . for the script")


def conch(
    *args: str, env: dict[str, str], cwd: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONCH), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        input=stdin,
        timeout=60,
    )


def test_c_prints_the_rendered_result(env: dict[str, str]) -> None:
    r = conch("-c", "range(1, 4) | sum", env=env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "6\n", "")
    r = conch("-c", '"a,b,c" | split(",") | join("-")', env=env)
    assert r.stdout == "a-b-c\n"
    r = conch("-c", "{a: 1, b: [true, null]}", env=env)
    assert json.loads(r.stdout) == {"a": 1, "b": [True, None]}


def test_c_null_prints_nothing_and_print_goes_to_stdout(env: dict[str, str]) -> None:
    r = conch("-c", "let x = 1", env=env)
    assert (r.returncode, r.stdout) == (0, "")
    r = conch("-c", 'print("hi")', env=env)
    assert (r.returncode, r.stdout) == (0, "hi\n")


def test_a_table_is_json_when_not_a_tty(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("abc")
    r = conch(
        "-c",
        'ls() | where(fn(f) => f.name == "f.txt") | map(fn(f) => f.size)',
        env=env,
        cwd=tmp_path,
    )
    assert json.loads(r.stdout) == [3]
    r = conch("-c", "[{a: 1}, {a: 2}]", env=env)
    assert json.loads(r.stdout) == [{"a": 1}, {"a": 2}]


def test_conch_error_exit_1_with_caret(env: dict[str, str]) -> None:
    r = conch("-c", "let x = 1\nx / 0", env=env)
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0].startswith("ZeroDivisionError")
    assert lines[1] == "  2 | x / 0"
    assert lines[2].rstrip().endswith("^")


def test_unknown_name_has_a_hint(env: dict[str, str]) -> None:
    r = conch("-c", "lenght([1])", env=env)
    assert r.returncode == 1
    assert r.stderr.startswith("NameError")
    assert "hint:" in r.stderr


def test_syntax_error_exit_2_with_caret(env: dict[str, str]) -> None:
    r = conch("-c", "let x = (1 + )", env=env)
    assert r.returncode == 2
    lines = r.stderr.splitlines()
    assert lines[0].startswith("SyntaxError")
    assert lines[1] == "  1 | let x = (1 + )"
    assert lines[2] == "    |              ^"


def test_file_errors_exit_1(env: dict[str, str], tmp_path: Path) -> None:
    r = conch("-c", 'cat("missing.txt")', env=env, cwd=tmp_path)
    assert r.returncode == 1 and r.stderr.startswith("FileNotFoundError")


def test_run_binds_args(env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "greet.conch"
    script.write_text('#!/usr/bin/env conch\nlet who = args | join(" ")\n"hello ${who}"\n')
    r = conch("run", str(script), "big", "world", env=env)
    assert (r.returncode, r.stdout) == (0, "hello big world\n")
    r = conch("run", str(script), env=env)
    assert r.stdout == "hello \n"
    r = conch("-c", "args", "x", "y", env=env)
    assert json.loads(r.stdout) == ["x", "y"]


def test_run_errors_name_the_file_and_line(env: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "bad.conch"
    script.write_text("let a = 1\nlet b = a + nope\n")
    r = conch("run", str(script), env=env)
    assert r.returncode == 1
    assert str(script) in r.stderr
    assert "  2 | let b = a + nope" in r.stderr
    r = conch("run", str(tmp_path / "absent.conch"), env=env)
    assert r.returncode == 1 and "cannot read" in r.stderr


def test_run_through_typer_for_help(env: dict[str, str]) -> None:
    r = conch("run", "--help", env=env)
    assert r.returncode == 0 and "args" in r.stdout


def test_version(env: dict[str, str]) -> None:
    r = conch("version", env=env)
    assert r.returncode == 0 and r.stdout.startswith("conch ")
    assert conch("--version", env=env).stdout == r.stdout


def test_config_show_honours_env_and_file(env: dict[str, str], tmp_path: Path) -> None:
    r = conch("config", "show", "--json", env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["port"] == 3000
    assert data["data_dir"] == env["CONCH_DATA_DIR"]

    toml = tmp_path / "conch.toml"
    toml.write_text('port = 4100\nmodels_port = 9191\napi_key = "sekrit"\n')
    r = conch("--config", str(toml), "config", "show", "--json", env=env)
    data = json.loads(r.stdout)
    assert (data["port"], data["models_port"]) == (4100, 9191)
    assert data["api_key"] == "***"
    assert data["config_file"] == str(toml)

    r = conch("--config", str(toml), "config", "show", "--json", env={**env, "CONCH_PORT": "4200"})
    data = json.loads(r.stdout)
    assert (data["port"], data["models_port"]) == (4200, 9191)

    r = conch("config", "show", env={**env, "CONCH_PORT": "4300"})
    assert r.returncode == 0 and "4300" in r.stdout


def test_usage_errors(env: dict[str, str]) -> None:
    assert conch("-c", env=env).returncode == 2
    assert conch("no-such-command", env=env).returncode == 2


def test_fast_path_does_not_import_the_ui_libraries(env: dict[str, str]) -> None:
    code = (
        "import sys; sys.argv = ['conch', '-c', '1 + 1']\n"
        "from conch.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('typer', 'rich', 'prompt_toolkit', 'click', 'pydantic') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.stdout.splitlines() == ["2", "[]"], r.stderr


def test_a_program_naming_builtins_imports_only_their_module(env: dict[str, str]) -> None:
    code = (
        "import sys; sys.argv = ['conch', '-c', '[len([1]), [3, 1, 2] | sort | sum, {a: 1.5}]']\n"
        "from conch.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = ('yaml', 'inspect', 'dataclasses', 'typing', 're', 'json', 'pathlib',\n"
        "         'decimal', 'datetime', 'random', 'functools', 'conch.lang.builtins.filesystem',\n"
        "         'conch.lang.builtins.data', 'conch.lang.builtins.strings')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.stdout.splitlines() == ['[1,6,{"a":1.5}]', "[]"], r.stderr


def test_up_refuses_a_non_loopback_bind_without_a_key(env: dict[str, str]) -> None:
    r = conch("up", "--host", "0.0.0.0", "--port", "0", "--models-port", "0", env=env)
    assert r.returncode == 2, r.stderr
    assert "API key" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "command", [("tasks", "list"), ("workflows", "list"), ("marketplace", "list")]
)
def test_agent_server_commands_say_when_the_server_is_not_running(
    env: dict[str, str], command: tuple[str, ...]
) -> None:
    r = conch(*command, "--url", "http://127.0.0.1:9", env=env)
    assert r.returncode == 2, r.stderr
    assert "cannot reach the agent server at http://127.0.0.1:9" in r.stderr
    assert "conch serve" in r.stderr


def test_a_program_ends_the_process_with_its_output_and_files_complete(env: dict[str, str], tmp_path: Path) -> None:
    """`conch -c` and `conch run` leave without the interpreter's teardown (cli.main._exit_now):
    nothing the program wrote may be lost by it."""
    r = conch("-c", 'write("big.txt", range(0, 50000) | map(fn(x) => str(x)) | join("\\n")); range(0, 20000)',
              env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == list(range(20000))
    assert (tmp_path / "big.txt").read_text().splitlines() == [str(x) for x in range(50000)]
    script = tmp_path / "s.conch"
    script.write_text('print("before"); 1 / 0\n')
    r = conch("run", str(script), env=env, cwd=tmp_path)
    assert (r.returncode, r.stdout) == (1, "before\n")
    assert "ZeroDivisionError" in r.stderr
