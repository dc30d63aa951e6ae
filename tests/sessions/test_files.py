"""The files of a session on a real file system: round trips, limits enforced while the bytes
arrive, and a workspace a hostile program has filled with links, fifos and hard links."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from conch.sessions.errors import (
    FileConflict,
    FileNotFound,
    InvalidPath,
    QuotaExceeded,
    UploadTooLarge,
)
from conch.sessions.files import SessionFiles, content_type, split_path
from conch.sessions.layout import SessionDirs

KB = 1024


@pytest.fixture()
def dirs(tmp_path: Path) -> SessionDirs:
    return SessionDirs(tmp_path / "sessions")


@pytest.fixture()
def files(dirs: SessionDirs) -> SessionFiles:
    dirs.create("s1")
    return SessionFiles(dirs.workspace("s1"), dirs.tmp("s1"), quota_bytes=1024 * KB,
                        upload_bytes=768 * KB)  # fmt: skip


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    """What a program would like the server to reach: a directory and a file outside."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text("the server's secret")
    return d


def chunks(n: int, size: int = 64 * KB, fill: bytes = b"x") -> Iterator[bytes]:
    for _ in range(n):
        yield fill * size


def leftovers(files: SessionFiles) -> list[str]:
    return os.listdir(files.tmp)


# -- paths ----------------------------------------------------------------------------------


def test_paths_follow_the_builtins_rules() -> None:
    assert split_path("a/b.txt") == ("a", "b.txt")
    assert split_path("/a//./b.txt") == ("a", "b.txt")  # "/" is the workspace root
    assert split_path("a/../b") == ("b",)
    assert split_path("") == () and split_path("/") == () and split_path(".") == ()
    for bad in ("..", "../x", "a/../../x", "/../etc/passwd", "a\0b", "x/" + "n" * 256):
        with pytest.raises(InvalidPath) as err:
            split_path(bad)
        assert err.value.status == 400 and err.value.where == "path"
    with pytest.raises(InvalidPath, match="outside the session's workspace"):
        split_path("a/../../x")


def test_content_types_are_the_same_everywhere() -> None:
    assert content_type("sales.csv") == "text/csv"
    assert content_type("a.json") == "application/json"
    assert content_type("notes.md") == "text/markdown"
    assert content_type("x.parquet") == "application/vnd.apache.parquet"
    assert content_type("blob") == "application/octet-stream"


# -- round trips ----------------------------------------------------------------------------


def test_put_get_list_round_trip(files: SessionFiles) -> None:
    data = os.urandom(200 * KB)
    out = files.put("data/in/sales.csv", iter([data[:1000], bytearray(data[1000:5000]),
                                               memoryview(data[5000:])]))  # fmt: skip
    assert out["name"] == "data/in/sales.csv" and out["type"] == "file"
    assert out["size"] == len(data) and out["modified"].endswith("Z")
    with files.get("/data/in/sales.csv") as f:
        assert (f.size, f.content_type, f.name) == (len(data), "text/csv", "sales.csv")
    got = files.get("data/in/sales.csv")
    assert b"".join(got.chunks(chunk_size=7000)) == data
    assert got.file.closed  # streaming to the end closes it
    assert files.list() == [{"name": "data", "type": "dir", "size": 0,
                             "modified": files.list()[0]["modified"]}]  # fmt: skip
    assert [e["name"] for e in files.list("data/in")] == ["data/in/sales.csv"]
    assert files.list("data/in/sales.csv")[0]["size"] == len(data)  # a file: its own entry
    assert files.stat("data")["type"] == "dir"
    # Replacing a file: the new one, whole.
    files.put("data/in/sales.csv", [b"a,b\n1,2\n"])
    assert b"".join(files.get("data/in/sales.csv").chunks()) == b"a,b\n1,2\n"
    assert leftovers(files) == []
    assert files.usage() == 8
    # The server made these for the session: private to its user.
    st = os.stat(files.workspace / "data" / "in" / "sales.csv")
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(files.workspace / "data").st_mode) == 0o700


def test_async_put_from_a_request_body(files: SessionFiles) -> None:
    async def body() -> AsyncIterator[bytes]:
        for i in range(40):
            yield bytes([i]) * (10 * KB)

    out = asyncio.run(files.aput("up.bin", body()))
    assert out["size"] == 400 * KB
    assert b"".join(files.get("up.bin").chunks()) == b"".join(
        bytes([i]) * (10 * KB) for i in range(40)
    )
    assert leftovers(files) == []


def test_hidden_files_listed_unless_asked_not_to(files: SessionFiles) -> None:
    files.put(".env", [b"K=V"])
    files.put("a.txt", [b"a"])
    assert [e["name"] for e in files.list()] == [".env", "a.txt"]
    assert [e["name"] for e in files.list(".", all=False)] == ["a.txt"]


def test_delete_like_rm(files: SessionFiles) -> None:
    files.put("d/e/f.txt", [b"1"])
    files.put("empty/.keep", [b""])
    files.delete("empty/.keep")
    files.delete("empty")  # now empty
    with pytest.raises(FileConflict, match="directory not empty: d"):
        files.delete("d")
    files.delete("d", recursive=True)
    assert files.list() == []
    with pytest.raises(FileNotFound):
        files.delete("d")
    with pytest.raises(InvalidPath, match="workspace root"):
        files.delete("/")
    with pytest.raises(FileNotFound):
        files.get("nothing.txt")
    with pytest.raises(FileNotFound):
        files.list("nothing")
    files.put("f", [b"x"])
    with pytest.raises(FileConflict, match="not a directory"):
        files.put("f/g", [b"x"])
    files.put("dir/x", [b"x"])
    with pytest.raises(FileConflict, match="is a directory"):
        files.put("dir", [b"x"])
    with pytest.raises(FileConflict, match="is a directory"):
        files.get("dir")


# -- limits ---------------------------------------------------------------------------------


def test_an_upload_over_the_limit_is_refused_as_it_streams(files: SessionFiles) -> None:
    with pytest.raises(UploadTooLarge) as err:
        files.put("big.bin", chunks(1), size_hint=800 * KB)  # announced: refused at once
    assert err.value.status == 413 and err.value.kind == "LimitError"
    assert "session_upload_mb" in err.value.message

    consumed = 0

    def counted() -> Iterator[bytes]:
        nonlocal consumed
        for c in chunks(100):
            consumed += 1
            yield c

    with pytest.raises(UploadTooLarge):
        files.put("big.bin", counted())  # no length announced: refused when it crosses
    assert consumed == 13  # 12 x 64 KiB is the limit; the 13th chunk crossed it
    assert leftovers(files) == [] and files.list() == []


def test_the_quota_is_refused_mid_stream_and_nothing_is_left(files: SessionFiles) -> None:
    files.put("old.bin", chunks(8))  # 512 KiB of the 1 MiB quota
    files.put("keep.bin", chunks(4, fill=b"k"))  # 256 KiB more
    with pytest.raises(QuotaExceeded) as err:
        files.put("new.bin", chunks(6))  # 384 KiB: crosses at the 5th chunk
    assert err.value.status == 413 and "session_disk_mb" in err.value.message
    assert leftovers(files) == []
    assert sorted(e["name"] for e in files.list()) == ["keep.bin", "old.bin"]
    # Replacing a file counts what it replaces: 512 KiB over 512 KiB fits.
    files.put("old.bin", chunks(8, fill=b"n"))
    assert b"".join(files.get("old.bin").chunks()) == b"n" * 512 * KB
    # A replacement that would not fit leaves the old file as it was.
    with pytest.raises(QuotaExceeded):
        files.put("keep.bin", chunks(12))
    assert b"".join(files.get("keep.bin").chunks()) == b"k" * 256 * KB
    # Announced too large for the quota: refused before a byte is read.
    with pytest.raises(QuotaExceeded):
        files.put("x.bin", iter(()), size_hint=300 * KB)
    assert leftovers(files) == []


def test_uploads_in_flight_count_against_the_quota(files: SessionFiles) -> None:
    files.put("base.bin", chunks(4))  # 256 KiB
    first = files.begin_put("one.bin")
    for c in chunks(8):  # 512 KiB, not yet committed: 768 KiB in all
        first.write(c)
    with pytest.raises(QuotaExceeded):
        files.put("two.bin", chunks(5))  # 320 KiB would pass 1 MiB
    assert first.commit()["size"] == 512 * KB
    assert leftovers(files) == []


# -- a hostile workspace --------------------------------------------------------------------


def test_planted_links_are_never_followed(files: SessionFiles, outside: Path) -> None:
    ws = files.workspace
    os.symlink(outside, ws / "out")  # a directory outside
    os.symlink(outside / "secret.txt", ws / "secret")  # a file outside
    os.symlink("../../..", ws / "up")
    files.put("real/inner.txt", [b"ok"])
    os.symlink(ws / "real", ws / "inside")  # even a link that stays inside is not followed

    for path in ("out/secret.txt", "secret", "up/etc/passwd", "inside/inner.txt"):
        with pytest.raises(InvalidPath, match="symbolic link"):
            files.get(path)
    with pytest.raises(InvalidPath, match="symbolic link"):
        files.put("out/planted.txt", [b"x"])
    with pytest.raises(InvalidPath, match="symbolic link"):
        files.put("secret", [b"overwritten"])  # the link's target stays as it was
    with pytest.raises(InvalidPath, match="symbolic link"):
        files.put("out/new/deeper.txt", [b"x"])
    for listing in ("out", "up", "out/", "out/sub"):
        with pytest.raises(InvalidPath, match="symbolic link") as err:
            files.list(listing)
        assert err.value.where == "dir"
    with pytest.raises(InvalidPath, match="symbolic link"):
        files.delete("out/secret.txt")
    with pytest.raises(InvalidPath, match="symbolic link"):
        files.delete("up/tmp", recursive=True)
    assert os.listdir(outside) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "the server's secret"

    # Listing shows the links as links (lstat), without following them.
    entries = {e["name"]: e["type"] for e in files.list()}
    assert entries == {"inside": "symlink", "out": "symlink", "real": "dir", "secret": "symlink",
                       "up": "symlink"}  # fmt: skip
    # Deleting a link removes the link only.
    files.delete("out")
    files.delete("secret")
    assert (outside / "secret.txt").read_text() == "the server's secret"
    assert leftovers(files) == []


def test_a_link_swapped_in_during_an_upload_is_replaced_not_followed(
    files: SessionFiles, outside: Path
) -> None:
    up = files.begin_put("report.txt")
    up.write(b"the upload")
    os.symlink(outside / "secret.txt", files.workspace / "report.txt")  # planted meanwhile
    with pytest.raises(InvalidPath, match="symbolic link"):
        up.commit()
    assert (outside / "secret.txt").read_text() == "the server's secret"
    assert leftovers(files) == []


def test_special_files_are_not_served(files: SessionFiles) -> None:
    os.mkfifo(files.workspace / "pipe")
    with pytest.raises(InvalidPath, match="not a regular file"):
        files.get("pipe")  # refused without blocking on the fifo
    assert files.list() == [{"name": "pipe", "type": "file", "size": 0,
                             "modified": files.list()[0]["modified"]}]  # fmt: skip
    files.delete("pipe")
    assert files.list() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own files as another user")
def test_only_the_sessions_own_files_are_served(dirs: SessionDirs, tmp_path: Path) -> None:
    """With the session's programs running as another user, a file not theirs (a hard link
    planted to a root-only file, say) is refused, and what the API writes is theirs."""
    nobody = (65534, 65534)
    owned = SessionDirs(tmp_path / "owned", owner=nobody)
    owned.create("s2")
    files = SessionFiles(owned.workspace("s2"), owned.tmp("s2"), owner=nobody)
    assert os.stat(owned.workspace("s2")).st_uid == 65534
    target = tmp_path / "root-only"
    target.write_text("root's")
    os.chmod(target, 0o600)
    os.link(target, owned.workspace("s2") / "linked")
    with pytest.raises(InvalidPath, match="belongs to uid 0"):
        files.get("linked")
    files.put("sub/mine.txt", [b"mine"])
    for p in ("sub", "sub/mine.txt"):
        st = os.stat(owned.workspace("s2") / p)
        assert (st.st_uid, st.st_gid) == nobody
    assert b"".join(files.get("sub/mine.txt").chunks()) == b"mine"
    files.delete("linked")  # the name goes, the file it pointed at stays
    assert target.read_text() == "root's"


def test_usage_counts_hard_links_once_and_never_follows_links(
    files: SessionFiles, outside: Path
) -> None:
    files.put("a/one.bin", [b"x" * 1000])
    os.link(files.workspace / "a" / "one.bin", files.workspace / "two.bin")
    os.symlink(outside, files.workspace / "out")
    assert files.usage() == 1000 + len(str(outside))  # a link's size is its target's name


def _nest(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "wb") as f:
            f.write(b"x")
    finally:
        os.close(fd)


def test_a_tree_nested_without_end(files: SessionFiles) -> None:
    """A program can nest directories deeper than Python recurses: measuring such a workspace
    is refused with a clear error (an upload cannot be checked against the quota), and
    deleting the tree still works."""
    (files.workspace / "deep").mkdir()
    _nest(files.workspace / "deep", 1200)
    with pytest.raises(FileConflict, match="more than 256 deep"):
        files.put("x.txt", [b"x"])
    assert leftovers(files) == []
    files.delete("deep", recursive=True)
    assert files.list() == []
    files.put("x.txt", [b"x"])
