"""Filesystem builtins that make, move and remove entries: ``mkdir``, ``touch``, ``rm``,
``mv`` and ``cp``.

Category ``filesystem``: sources and destinations are resolved and checked against the
workspace as :mod:`.filesystem` says; a copied tree keeps its symlinks but those pointing
outside the workspace.
"""

from __future__ import annotations

import os
import posixpath
import stat as _stat

from conch.lang.builtins.filesystem import (
    CAT,
    is_real_dir,
    join_shown,
    not_found,
    resolve,
    resolve_entry,
    translate_os_errors,
    walk,
)
from conch.lang.builtins.registry import Example, builtin
from conch.lang.builtins.types import Bool, String
from conch.lang.context import Context, current
from conch.lang.errors import ConchError

# Other modules are imported where used, typing only by type checkers: see .filesystem.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path


@builtin(
    "mkdir",
    category=CAT,
    effect="write",
    description="Create a directory and any missing parents (no error if it exists). Returns the path.",
    examples=[Example('mkdir("a/b/c"); exists("a/b/c")', True), Example('mkdir("d")', "d")],
)
@translate_os_errors
def mkdir(path: String) -> String:
    real = resolve(path)
    try:
        real.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConchError("IOError", f"exists and is not a directory: {path}") from None
    return path


@builtin(
    "rm",
    category=CAT,
    effect="write",
    description=(
        "Remove a file, a symlink (not what it points to) or an empty directory; "
        "recursive=true removes a directory and everything in it."
    ),
    examples=[
        Example('write("a.txt", "x"); rm("a.txt"); exists("a.txt")', False),
        Example(
            'mkdir("d/e"); write("d/e/f.txt", "x"); rm("d", recursive=true); exists("d")', False
        ),
    ],
)
@translate_os_errors
def rm(path: String, recursive: Bool = False) -> None:
    ctx = current()
    target = resolve_entry(path)
    if ctx.workspace is not None and target == ctx.workspace:
        raise ConchError("PermissionError", "rm: refusing to remove the workspace root")
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        raise not_found(path) from None
    if not _stat.S_ISDIR(st.st_mode):
        os.unlink(target)
        return None
    if recursive:
        import shutil

        # rmtree removes symlinks it meets without following them.
        shutil.rmtree(target)
        return None
    try:
        os.rmdir(target)
    except OSError as exc:
        if exc.errno in (39, 66):  # ENOTEMPTY (Linux, BSD)
            raise ConchError(
                "IOError", f"directory not empty: {path}", hint="rm(path, recursive=true)"
            ) from None
        raise
    return None


def _into(dst: str, src_name: str) -> tuple[Path, str]:
    """The destination of mv/cp: inside ``dst`` when it is a directory. Both the directory
    and the final path are checked against the workspace."""
    ctx = current()
    real = ctx.resolve_path(dst)
    if real.is_dir():
        shown = join_shown(dst, src_name)
        return ctx.resolve_path(real / src_name), shown
    return real, dst


def _source_name(path: str, real: Path) -> str:
    name = posixpath.basename(path.rstrip("/"))
    return real.name if name in ("", ".", "..") else name


@builtin(
    "mv",
    category=CAT,
    effect="write",
    description="Move or rename a file or directory; into a directory when the destination is one. Returns the new path.",
    examples=[
        Example(
            'write("a.txt", "x"); mv("a.txt", "b.txt"); [exists("a.txt"), cat("b.txt")]',
            [False, "x"],
        ),
        Example('write("a.txt", "x"); mkdir("d"); mv("a.txt", "d")', "d/a.txt"),
    ],
)
@translate_os_errors
def mv(src: String, dst: String) -> String:
    ctx = current()
    source = resolve_entry(src)
    if not os.path.lexists(source):
        raise not_found(src)
    if ctx.workspace is not None and source == ctx.workspace:
        raise ConchError("PermissionError", "mv: refusing to move the workspace root")
    target, shown = _into(dst, _source_name(src, source))
    if (
        source.is_dir()
        and not source.is_symlink()
        and (target == source or source in target.parents)
    ):
        raise ConchError("IOError", f"mv: cannot move {src} into itself")
    if target.is_dir():
        raise ConchError("IOError", f"mv: destination exists and is a directory: {shown}")
    import shutil

    shutil.move(os.fspath(source), os.fspath(target))
    return shown


def _copy_tree(src: Path, dst: Path, ctx: Context) -> None:
    import shutil

    dst.mkdir(exist_ok=True)
    for shown, entry, _depth in walk(src, "", ctx):
        if entry.is_symlink():
            # Links pointing outside were skipped by walk; the others are kept as links.
            link = ctx.resolve_path((dst / shown).parent) / entry.name
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(os.readlink(entry.path), link)
            continue
        target = ctx.resolve_path(dst / shown)
        if is_real_dir(entry):
            target.mkdir(exist_ok=True)
        else:
            shutil.copy2(entry.path, target)


@builtin(
    "cp",
    category=CAT,
    effect="write",
    description=(
        "Copy a file, or a directory recursively; into a directory when the destination is "
        "one. Symlinks inside a copied tree stay symlinks; those pointing outside the "
        "workspace are skipped. Returns the new path."
    ),
    examples=[
        Example('write("a.txt", "x"); cp("a.txt", "b.txt"); cat("b.txt")', "x"),
        Example('mkdir("d/e"); write("d/e/f.txt", "y"); cp("d", "d2"); cat("d2/e/f.txt")', "y"),
    ],
)
@translate_os_errors
def cp(src: String, dst: String) -> String:
    ctx = current()
    source = resolve(src)
    if not source.exists():
        raise not_found(src)
    target, shown = _into(dst, _source_name(src, source))
    if source.is_dir():
        if target == source or source in target.parents:
            raise ConchError("IOError", f"cp: cannot copy {src} into itself")
        if target.exists() and not target.is_dir():
            raise ConchError("IOError", f"cp: destination is a file: {shown}")
        _copy_tree(source, target, ctx)
    else:
        if target == source:
            raise ConchError("IOError", f"cp: {src} and {shown} are the same file")
        import shutil

        shutil.copy2(source, target)
    return shown


@builtin(
    "touch",
    category=CAT,
    effect="write",
    description="Create an empty file, or set an existing one's modification time to now. Returns the path.",
    examples=[Example('touch("a.txt"); [exists("a.txt"), cat("a.txt")]', [True, ""])],
)
@translate_os_errors
def touch(path: String) -> String:
    real = resolve(path)
    if real.exists():
        os.utime(real)
    else:
        try:
            with open(real, "ab"):
                pass
        except FileNotFoundError:
            raise not_found(path) from None
    return path
