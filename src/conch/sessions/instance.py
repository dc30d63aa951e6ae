"""This server's name as a holder of sessions' leases, kept across its restarts.

A session's lease names the server instance running it (``lease_owner``). A server killed
with SIGKILL leaves its leases behind, and with a fresh name each start, the server that
replaces it would wait for them to run out (``orchestration_lease_s``) before it could run
those sessions again. So the name lives in the data directory (``sessions.instance``), and
the process using it holds an exclusive ``flock`` on that file for as long as it runs: the
kernel drops the lock when the process dies, however it dies, and the next server started on
the same data directory takes the lock and the name, and with it, at once, the leases its
predecessor held. A second live server on the same data directory cannot take the lock and
gets a name of its own: two live processes never share one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
from pathlib import Path

from conch.config import make_data_dir

FILE = "sessions.instance"
_NAME = re.compile(r"srv_[0-9a-f]{16}")


class Instance:
    """This server's name (``id``); :meth:`close` lets the next server have it."""

    def __init__(self, id: str, fd: int | None) -> None:
        self.id = id
        self._fd = fd

    @classmethod
    def claim(cls, data_dir: Path) -> Instance:
        """The name kept in ``data_dir`` if no live process holds it (made on first use),
        else a fresh one (another server runs on the same data directory)."""
        fresh = "srv_" + secrets.token_hex(8)
        try:
            make_data_dir(Path(data_dir))
            fd = os.open(Path(data_dir) / FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            return cls(fresh, None)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return cls(fresh, None)
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        if _NAME.fullmatch(text):
            return cls(text, fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, fresh.encode() + b"\n", 0)
        return cls(fresh, fd)

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
