"""The sessions' errors, on conch's one tree (:mod:`conch.errors`).

Each class re-parents onto the base that says what went wrong, so a route renders it with the
status and envelope every other domain error gets: a path that is refused is ``400`` naming
``path``, an unknown session or file ``404``, a session another server is running ``409``
(with ``Retry-After``: when its lease runs out), an upload over the size limit or the disk
quota ``413`` (``kind: "LimitError"``).
"""

from __future__ import annotations

from conch import errors


class SessionError(errors.DomainError):
    """The family's root: a session failure no narrower class names (a 500). It sets no kind
    or status: each class below takes both from the base it re-parents onto."""


class InvalidRequest(SessionError, errors.Invalid):
    """A create request (TTL, limits, permissions) the server cannot honour; ``where`` names
    the field."""


class InvalidPath(SessionError, errors.Invalid):
    """A file path that is malformed, leaves the workspace, or goes through a symbolic link
    or a special file; ``where`` is ``path``."""

    def __init__(self, message: str, *, where: str | None = "path") -> None:
        super().__init__(message, where=where)


class SessionNotFound(SessionError, errors.NotFound):
    """No such session (or not one the caller's tenant may see)."""


class FileNotFound(SessionError, errors.NotFound):
    """No such file or directory in the session's workspace."""


class FileConflict(SessionError, errors.Conflict):
    """The path exists but refuses the operation (a directory not empty, a file where a
    directory is needed)."""


class SessionBusy(SessionError, errors.Conflict):
    """Another server holds the session's lease (it is running one of its runs)."""

    def __init__(self, message: str, *, owner: str, until: float, retry_after: float) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, round(retry_after)))})
        self.owner = owner
        self.until = until
        self.retry_after = retry_after


class LeaseLost(SessionError, errors.Conflict):
    """This server's lease on the session ran out and another server took it (or it was
    released): what this server was doing for the session must not be recorded."""


class NoWorker(SessionError, errors.Unavailable):
    """No sandbox worker could be had for the session (the machine refused to start one, or
    the server is shutting down); trying again later may succeed."""


class SessionMisplaced(SessionError, errors.Unavailable):
    """The session's row is in the database but its files are not under this server's
    ``sessions_dir``: servers sharing a database must share ``sessions_dir`` too."""


class UploadTooLarge(SessionError, errors.TooLarge):
    """An upload longer than ``session_upload_mb``."""


class QuotaExceeded(SessionError, errors.TooLarge):
    """An upload that would take the session's files past ``session_disk_mb``."""
