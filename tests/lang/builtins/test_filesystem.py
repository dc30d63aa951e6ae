"""Filesystem builtins on a tree built per test, including escapes out of the workspace."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import conch.lang.builtins.filesystem  # noqa: F401  (registers the builtins)
from conch.lang.builtins.registry import REGISTRY
from conch.lang.context import Context, using
from conch.lang.errors import ConchError


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    return REGISTRY[name].fn(*args, **kwargs)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    """A workspace with files, a nested directory, and symlinks escaping to a sibling
    directory holding a secret."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (outside / "deep").mkdir()
    (outside / "deep" / "more.txt").write_text("secret too\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("alpha\nbeta\ngamma\n")
    (ws / "b.json").write_text('{"k": [1, 2]}')
    (ws / ".hidden").write_text("h")
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "main.py").write_text("print('secret?')\n")
    (ws / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (ws / "out_dir").symlink_to(outside)
    (ws / "out_file").symlink_to(outside / "secret.txt")
    (ws / "src" / "escape").symlink_to("../../outside")
    (ws / "in_link").symlink_to("a.txt")
    with using(Context(workspace=ws)):
        yield ws


def kind_of(exc: pytest.ExceptionInfo[ConchError]) -> str:
    return exc.value.kind


# -- reading and listing -------------------------------------------------------------------


def test_ls_entries_and_order(tree: Path) -> None:
    rows = call("ls")
    assert [r["name"] for r in rows] == ["a.txt", "b.json", "in_link", "out_dir", "out_file", "src"]
    assert list(rows[0]) == ["name", "type", "size", "modified"]
    by_name = {r["name"]: r for r in rows}
    assert by_name["a.txt"] == {**by_name["a.txt"], "type": "file", "size": 17}
    assert by_name["src"]["type"] == "dir" and by_name["src"]["size"] == 0
    assert by_name["out_dir"]["type"] == "symlink"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rows[0]["modified"])


def test_ls_all_subdir_file_and_glob(tree: Path) -> None:
    assert ".hidden" in [r["name"] for r in call("ls", all=True)]
    assert [r["name"] for r in call("ls", "src")] == ["src/escape", "src/main.py", "src/pkg"]
    assert [r["name"] for r in call("ls", "a.txt")] == ["a.txt"]
    assert [r["name"] for r in call("ls", "*.json")] == ["b.json"]


def test_cat_open_head_tail_wc(tree: Path) -> None:
    assert call("cat", "a.txt") == "alpha\nbeta\ngamma\n"
    assert call("cat", "in_link") == "alpha\nbeta\ngamma\n"
    assert call("open", "b.json") == {"k": [1, 2]}
    assert call("open", "b.json", raw=True) == '{"k": [1, 2]}'
    assert call("head", "a.txt", 2) == "alpha\nbeta"
    assert call("tail", "a.txt", 1) == "gamma"
    assert call("head", "x\ny\nz", 1) == "x"
    assert call("tail", [1, 2, 3], 2) == [2, 3]
    assert call("wc", "a.txt") == {"lines": 3, "words": 3, "bytes": 17}


def test_open_formats(tree: Path) -> None:
    call("write", "t.csv", [{"name": "a", "n": "x"}, {"name": "b", "n": "y"}])
    assert call("open", "t.csv") == [{"name": "a", "n": "x"}, {"name": "b", "n": "y"}]
    call("write", "c.yaml", {"a": [1, 2], "b": "s"})
    assert call("open", "c.yaml") == {"a": [1, 2], "b": "s"}
    call("write", "c.yml", "k: v\n")
    assert call("open", "c.yml") == {"k": "v"}
    call("write", "p.toml", {"tool": {"name": "conch"}})
    assert call("open", "p.toml") == {"tool": {"name": "conch"}}
    call("write", "e.jsonl", [{"n": 1}, {"n": 2}])
    assert call("open", "e.jsonl") == [{"n": 1}, {"n": 2}]
    call("write", "bad.json", "{nope")
    with pytest.raises(ConchError) as exc:
        call("open", "bad.json")
    assert exc.value.kind == "ValueError" and "bad.json" in exc.value.message


def test_missing_and_directory_errors(tree: Path) -> None:
    with pytest.raises(ConchError) as exc:
        call("cat", "nope.txt")
    assert exc.value.kind == "FileNotFoundError" and "nope.txt" in exc.value.message
    with pytest.raises(ConchError) as exc:
        call("ls", "nope")
    assert exc.value.kind == "FileNotFoundError"
    with pytest.raises(ConchError) as exc:
        call("cat", "src")
    assert exc.value.kind == "IOError"
    with pytest.raises(ConchError) as exc:
        call("rm", "src")
    assert exc.value.kind == "IOError" and exc.value.hint
    with pytest.raises(ConchError) as exc:
        call("write", "no/such/dir.txt", "x")
    assert exc.value.kind == "FileNotFoundError"


def test_os_permission_error(tree: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads everything")
    locked = tree / "locked.txt"
    locked.write_text("x")
    locked.chmod(0)
    with pytest.raises(ConchError) as exc:
        call("cat", "locked.txt")
    assert exc.value.kind == "PermissionError"


# -- escapes ------------------------------------------------------------------------------

ESCAPES = ["out_file", "out_dir/secret.txt", "src/escape/secret.txt", "../outside/secret.txt"]


@pytest.mark.parametrize("path", ESCAPES)
def test_reading_through_escapes_is_refused(tree: Path, path: str) -> None:
    for name in ("cat", "open", "head", "tail", "wc", "exists", "du"):
        with pytest.raises(ConchError) as exc:
            call(name, path)
        assert exc.value.kind == "PermissionError", name
    with pytest.raises(ConchError) as exc:
        call("grep", "secret", path)
    assert exc.value.kind == "PermissionError"


def test_absolute_paths_outside_are_refused(tree: Path) -> None:
    outside = str(tree.parent / "outside" / "secret.txt")
    for name, args in [
        ("cat", ("/etc/passwd",)),
        ("cat", (outside,)),
        ("ls", ("/",)),
        ("ls", ("/etc/*",)),
        ("glob", ("/etc/*",)),
        ("find", ("/etc",)),
        ("write", ("/tmp/conch-should-not-exist", "x")),
        ("cd", ("/",)),
        ("cd", ("..",)),
        ("mkdir", ("../made",)),
    ]:
        with pytest.raises(ConchError) as exc:
            call(name, *args)
        assert exc.value.kind == "PermissionError", (name, args)
    assert not (tree.parent / "made").exists()
    assert not Path("/tmp/conch-should-not-exist").exists()
    # an absolute path inside the workspace is fine
    assert call("cat", str(tree / "a.txt")).startswith("alpha")


def test_listing_through_escapes_is_refused(tree: Path) -> None:
    for path in ("out_dir", "src/escape", "out_dir/*", "src/escape/*.txt", "../outside"):
        with pytest.raises(ConchError) as exc:
            call("ls", path)
        assert exc.value.kind == "PermissionError", path
    with pytest.raises(ConchError):
        call("find", "out_dir")
    with pytest.raises(ConchError):
        call("glob", "out_dir/*")


def test_writing_through_escapes_is_refused(tree: Path) -> None:
    outside = tree.parent / "outside"
    attempts = [
        ("write", ("out_file", "pwned")),
        ("write", ("out_dir/new.txt", "pwned")),
        ("append", ("out_file", "pwned")),
        ("touch", ("out_dir/new.txt",)),
        ("mkdir", ("out_dir/newdir",)),
        ("cp", ("a.txt", "out_dir")),
        ("cp", ("a.txt", "out_file")),
        ("cp", ("out_file", "copy.txt")),
        ("mv", ("a.txt", "out_dir")),
        ("mv", ("a.txt", "src/escape/a.txt")),
        ("rm", ("out_dir/secret.txt",)),
        ("rm", ("src/escape/deep",)),
    ]
    for name, args in attempts:
        with pytest.raises(ConchError) as exc:
            call(name, *args)
        assert exc.value.kind == "PermissionError", (name, args)
    assert sorted(p.name for p in outside.iterdir()) == ["deep", "secret.txt"]
    assert (outside / "secret.txt").read_text() == "secret\n"
    assert (tree / "a.txt").exists()


def test_recursive_walks_skip_escaping_links(tree: Path) -> None:
    found = call("find", ".")
    assert "src/main.py" in found and "src/pkg/mod.py" in found
    assert not any("secret" in p or "escape" in p or p.startswith("out_") for p in found)
    assert "in_link" in found  # a link that stays inside is listed (not entered)
    assert call("find", ".", "*.txt") == ["a.txt"]
    assert not any("secret" in p for p in call("glob", "**/*"))
    assert call("glob", "**/*.txt") == ["a.txt"]
    usage = call("du", ".")
    real_bytes = sum(
        (tree / p).stat().st_size
        for p in ("a.txt", "b.json", ".hidden", "src/main.py", "src/pkg/mod.py")
    )
    assert usage == {"path": ".", "bytes": real_bytes, "files": 5, "dirs": 2}
    assert [r["path"] for r in call("grep", "secret", ".")] == ["src/main.py"]


def test_cp_tree_skips_escaping_links(tree: Path) -> None:
    assert call("cp", "src", "copy") == "copy"
    copied = sorted(p.relative_to(tree / "copy").as_posix() for p in (tree / "copy").rglob("*"))
    assert copied == ["main.py", "pkg", "pkg/mod.py"]
    call("mkdir", "tree2")
    (tree / "tree2" / "inner").symlink_to("../a.txt")
    call("cp", "tree2", "tree3")
    assert os.readlink(tree / "tree3" / "inner") == "../a.txt"
    assert call("cp", "a.txt", "src") == "src/a.txt"
    with pytest.raises(ConchError) as exc:
        call("cp", "src", "src/pkg")
    assert exc.value.kind == "IOError"


def test_rm_removes_links_not_targets(tree: Path) -> None:
    call("rm", "out_file")
    call("rm", "in_link")
    assert (tree.parent / "outside" / "secret.txt").exists()
    assert (tree / "a.txt").exists()
    call("rm", "src", recursive=True)
    assert not (tree / "src").exists()
    assert (tree.parent / "outside" / "deep" / "more.txt").exists()
    with pytest.raises(ConchError) as exc:
        call("rm", ".", recursive=True)
    assert exc.value.kind == "PermissionError"
    with pytest.raises(ConchError) as exc:
        call("rm", "gone")
    assert exc.value.kind == "FileNotFoundError"


def test_stat_does_not_follow_links(tree: Path) -> None:
    s = call("stat", "out_file")
    assert s["type"] == "symlink" and s["name"] == "out_file"
    s = call("stat", "a.txt")
    assert (s["type"], s["size"], s["path"]) == ("file", 17, "a.txt")
    assert s["mode"] == "0644" or len(s["mode"]) == 4
    assert s["permissions"].startswith("-")


# -- writing ------------------------------------------------------------------------------


def test_write_is_atomic_and_keeps_mode(tree: Path) -> None:
    assert call("write", "n.txt", "héllo") == {"path": "n.txt", "bytes": 6}
    assert (tree / "n.txt").read_text() == "héllo"
    (tree / "n.txt").chmod(0o600)
    call("write", "n.txt", "new")
    assert (tree / "n.txt").stat().st_mode & 0o777 == 0o600
    assert not [p for p in tree.iterdir() if p.name.endswith(".tmp")]
    call("write", "r.json", {"a": 1, "b": [1.5, None]})
    assert json.loads((tree / "r.json").read_text()) == {"a": 1, "b": [1.5, None]}
    call("write", "plain", [1, 2])
    assert json.loads((tree / "plain").read_text()) == [1, 2]
    with pytest.raises(ConchError) as exc:
        call("write", "src", "x")
    assert exc.value.kind == "IOError"


def test_append_mkdir_touch_mv(tree: Path) -> None:
    call("append", "log", "a\n")
    assert call("append", "log", {"n": 1}) == {"path": "log", "bytes": 9}
    assert (tree / "log").read_text() == 'a\n{"n": 1}\n'
    assert call("mkdir", "x/y/z") == "x/y/z"
    call("mkdir", "x/y/z")  # exists: fine
    with pytest.raises(ConchError):
        call("mkdir", "a.txt")
    assert call("touch", "x/t") == "x/t"
    assert (tree / "x" / "t").read_bytes() == b""
    before = (tree / "a.txt").stat().st_mtime
    os.utime(tree / "a.txt", (before - 100, before - 100))
    call("touch", "a.txt")
    assert (tree / "a.txt").stat().st_mtime > before - 50
    assert call("mv", "x/t", "x/u") == "x/u"
    assert call("mv", "x/u", "src") == "src/u"
    assert (tree / "src" / "u").exists()
    with pytest.raises(ConchError) as exc:
        call("mv", "src", "src/pkg")
    assert exc.value.kind == "IOError"
    with pytest.raises(ConchError) as exc:
        call("mv", "nope", "x")
    assert exc.value.kind == "FileNotFoundError"


# -- cd, glob, find, grep -------------------------------------------------------------------


def test_cd_and_pwd(tree: Path) -> None:
    assert call("pwd") == tree.as_posix()
    assert call("cd", "src") == (tree / "src").as_posix()
    assert call("pwd") == (tree / "src").as_posix()
    assert call("cat", "pkg/mod.py") == "x = 1\n"
    assert call("cd", "..") == tree.as_posix()
    with pytest.raises(ConchError) as exc:
        call("cd", "out_dir")
    assert exc.value.kind == "PermissionError"
    with pytest.raises(ConchError) as exc:
        call("cd", "a.txt")
    assert exc.value.kind == "IOError"
    call("cd", "src/pkg")
    assert call("cd") == tree.as_posix()


def test_glob_patterns(tree: Path) -> None:
    assert call("glob", "*.txt") == ["a.txt"]
    assert call("glob", "**/*.py") == ["src/main.py", "src/pkg/mod.py"]
    assert call("glob", "src/**/*.py") == ["src/main.py", "src/pkg/mod.py"]
    assert call("glob", "*.{txt,json}") == ["a.txt", "b.json"]
    assert call("glob", ".h*") == [".hidden"]
    assert call("glob", "?.txt") == ["a.txt"]
    assert call("glob", "[ab].*") == ["a.txt", "b.json"]
    assert call("glob", "a.txt") == ["a.txt"]
    assert call("glob", "none*") == []


def test_find_options(tree: Path) -> None:
    assert call("find", "src", "*.py") == ["src/main.py", "src/pkg/mod.py"]
    assert call("find", "*.py") == ["src/main.py", "src/pkg/mod.py"]
    assert call("find", ".", type="dir") == ["src", "src/pkg"]
    assert call("find", ".", type="symlink") == ["in_link"]
    with pytest.raises(ConchError) as exc:
        call("find", ".", type="socket")
    assert exc.value.kind == "ValueError"


def test_grep_forms(tree: Path) -> None:
    assert call("grep", "^b", "a.txt") == [{"path": "a.txt", "line": 2, "text": "beta"}]
    assert call("grep", "A", "a.txt", ignore_case=True)[0]["line"] == 1
    assert call("grep", "x", ["a.txt", "src/pkg/mod.py"]) == [
        {"path": "src/pkg/mod.py", "line": 1, "text": "x = 1"}
    ]
    text = call("cat", "a.txt")
    assert call("grep", text, "mm") == [{"line": 3, "text": "gamma"}]
    assert call("grep", ["ab", "cd"], "c") == [{"line": 2, "text": "cd"}]
    with pytest.raises(ConchError) as exc:
        call("grep", "(", "a.txt")
    assert exc.value.kind == "ValueError"


def test_no_workspace_means_whole_machine(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("free")
    with using(Context(cwd=tmp_path)):
        assert call("cat", str(tmp_path / "f.txt")) == "free"
        assert call("cat", "f.txt") == "free"


def test_effects_are_declared() -> None:
    writes = {"write", "append", "mkdir", "rm", "mv", "cp", "touch"}
    for name in ("ls", "cat", "open", "exists", "stat", "glob", "pwd", "cd", "head", "tail"):
        assert REGISTRY[name].effect == "read", name
    for name in ("wc", "grep", "du"):
        assert REGISTRY[name].effect == "read", name
    for name in writes:
        b = REGISTRY[name]
        members = b.overloads or [b]
        assert any(m.effect == "write" and m.category == "filesystem" for m in members), name


def test_effect_policy_is_enforced(tmp_path: Path) -> None:
    ctx = Context(workspace=tmp_path, allowed_effects=frozenset({"pure", "read"}))
    with using(ctx):
        with pytest.raises(ConchError) as exc:
            call("write", "a.txt", "x")
        assert exc.value.kind == "PermissionError"
        assert call("exists", "a.txt") is False
