"""A throwaway PostgreSQL cluster in a temporary directory (PostgreSQL 15's server binaries
from /usr/lib/postgresql/15/bin); tests that need it skip when the binaries are absent."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from testsupport.servers import free_port

BIN = Path(os.environ.get("CONCH_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _as_cluster_user(cmd: list[str]) -> list[str]:
    # initdb refuses to run as root: run the cluster as the postgres account then.
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


@contextmanager
def postgres_cluster(tmp: Path) -> Iterator[str]:
    """Start a cluster; yields its SQLAlchemy URL."""
    if not (BIN / "initdb").exists() or not (BIN / "pg_ctl").exists():
        pytest.skip(f"PostgreSQL server binaries not found in {BIN}")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: cannot start PostgreSQL")
    pytest.importorskip("psycopg")
    # Not under pytest's tmp_path: its parents are private to the current user.
    root = Path(tempfile.mkdtemp(prefix="conch-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    port = free_port()
    subprocess.run(
        _as_cluster_user(
            [str(BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        ),
        check=True,
        capture_output=True,
    )
    opts = f"-h 127.0.0.1 -p {port} -k {root} -c fsync=off -c max_connections=200"
    subprocess.run(
        _as_cluster_user(
            [
                str(BIN / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(root / "log"),
                "-o",
                opts,
                "-w",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )
    try:
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + 30
        import psycopg

        while True:
            try:
                psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres").close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield url
    finally:
        subprocess.run(
            _as_cluster_user([str(BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]),
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)
