"""Landlock: the kernel's own file-system and TCP confinement, reachable without privileges.

Three system calls (``landlock_create_ruleset``, ``landlock_add_rule``,
``landlock_restrict_self``) through ctypes. The one Python binding on PyPI (``landlock``
1.0.0.dev) has no network rules and no scopes, which are half of what the sandbox needs,
so this module speaks to the kernel directly; the structures are those of
``include/uapi/linux/landlock.h``.

A ruleset *handles* a set of access rights: every handled right is denied except beneath
the paths (or on the ports) a rule grants it. Rights the running kernel does not know
(an older ABI) are left out of the ruleset, so that it applies as much as the kernel
offers; :func:`abi_version` says how much that is.
"""

from __future__ import annotations

import ctypes
import os
import platform
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

# System call numbers are the same on every architecture that has Landlock (they were
# added after the unified syscall table).
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446

_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2
_PR_SET_NO_NEW_PRIVS = 38

# File-system rights, and the ABI that introduced each.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2: links and renames across directories
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5

# TCP rights (ABI 4).
BIND_TCP = 1 << 0
CONNECT_TCP = 1 << 1

# Scopes (ABI 6): what a process may reach outside its own Landlock domain.
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

_FS_BY_ABI = {
    1: EXECUTE | WRITE_FILE | READ_FILE | READ_DIR | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR
    | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM,
    2: REFER,
    3: TRUNCATE,
    5: IOCTL_DEV,
}

# Rights that only make sense on a directory; a rule on a file may grant only the others.
_DIR_ONLY = READ_DIR | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK \
    | MAKE_FIFO | MAKE_BLOCK | MAKE_SYM | REFER

READ = READ_FILE | READ_DIR
READ_EXECUTE = READ | EXECUTE


class LandlockError(OSError):
    """The kernel refused a Landlock call (or has no Landlock)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is __attribute__((packed))
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


_libc: ctypes.CDLL | None = None


def _syscall(number: int, *args: object) -> int:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    result = int(_libc.syscall(ctypes.c_long(number), *args))
    if result < 0:
        err = ctypes.get_errno()
        raise LandlockError(err, os.strerror(err))
    return result


def abi_version() -> int:
    """The Landlock ABI this kernel offers; 0 where it has none (or it is disabled)."""
    if platform.system() != "Linux":
        return 0
    try:
        return _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (LandlockError, OSError):
        return 0


def fs_rights(abi: int) -> int:
    return sum(bits for version, bits in _FS_BY_ABI.items() if version <= abi)


@dataclass
class Ruleset:
    """What a process will be allowed once :meth:`restrict_self` runs.

    ``network`` is ``None`` for no TCP rules at all, or the TCP rights to handle (deny):
    ``BIND_TCP | CONNECT_TCP`` denies both, ``BIND_TCP`` alone lets connects through;
    ``ports`` are the ones a connect is still allowed to.
    """

    abi: int
    network: int | None = None
    scopes: int = 0
    ports: list[int] = field(default_factory=list)
    paths: list[tuple[str, int]] = field(default_factory=list)
    # Opened only when the rules are applied (:meth:`allow_late`)
    late: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    # (descriptor, rights) of each path, from :meth:`open`
    opened: list[tuple[int, int]] | None = None

    def allow(self, paths: Iterable[str], rights: int) -> None:
        for path in paths:
            self.paths.append((path, rights))

    def allow_late(self, paths: Iterable[str], rights: int) -> None:
        """Rules on what ``paths`` name when :meth:`restrict_self` runs rather than when
        :meth:`open` does: ``/proc/self`` of the process that applies them, a file the
        worker's mount namespace put in place since."""
        for path in paths:
            self.late.append((path, rights))

    @property
    def handled_fs(self) -> int:
        return fs_rights(self.abi)

    @property
    def handled_net(self) -> int:
        return (self.network or 0) if self.abi >= 4 else 0

    @property
    def handled_scopes(self) -> int:
        return self.scopes if self.abi >= 6 else 0

    def open(self) -> None:
        """Open every path now, for rules on what they name at this moment: a worker whose
        mount namespace then covers some of them (:mod:`conch.sandbox.mountns`) still
        grants access to the real directories, which it reaches through descriptors. A path
        that does not exist is skipped and named in ``skipped``."""
        if self.opened is not None:
            return
        self.opened = []
        try:
            for path, rights in self.paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    self.skipped.append(path)
                    continue
                self.opened.append((fd, rights))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for fd, _rights in self.opened or ():
            os.close(fd)
        self.opened = None

    def restrict_self(self) -> None:
        """Apply the ruleset to this thread (and what it starts from now on); for a
        single-threaded process, the process. Paths are opened now unless :meth:`open`
        was called before."""
        self.open()
        assert self.opened is not None
        for path, rights in self.late:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                self.skipped.append(path)
                continue
            self.opened.append((fd, rights))
        handled = self.handled_fs
        attr = _RulesetAttr(handled, self.handled_net, self.handled_scopes)
        try:
            # An older kernel takes the larger struct as long as the fields it does not know
            # are zero (copy_struct_from_user), which the handled_* properties ensure.
            fd = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr),
                          ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
            try:
                for target, rights in self.opened or ():
                    self._add_path(fd, target, rights & handled)
                if self.handled_net & CONNECT_TCP:
                    for port in self.ports:
                        rule = _NetPortAttr(CONNECT_TCP, port)
                        _syscall(_SYS_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(_RULE_NET_PORT),
                                 ctypes.byref(rule), ctypes.c_uint32(0))
                _syscall_prctl_no_new_privs()
                _syscall(_SYS_RESTRICT_SELF, ctypes.c_int(fd), ctypes.c_uint32(0))
            finally:
                os.close(fd)
        finally:
            self.close()

    @staticmethod
    def _add_path(ruleset_fd: int, target: int, rights: int) -> None:
        if not stat.S_ISDIR(os.fstat(target).st_mode):
            rights &= ~_DIR_ONLY
        rule = _PathBeneathAttr(rights, target)
        _syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset_fd), ctypes.c_int(_RULE_PATH_BENEATH),
                 ctypes.byref(rule), ctypes.c_uint32(0))


def _syscall_prctl_no_new_privs() -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise LandlockError(err, f"PR_SET_NO_NEW_PRIVS: {os.strerror(err)}")
