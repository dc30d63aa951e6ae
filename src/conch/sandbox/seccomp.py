"""The worker's seccomp filter: a short deny list in front of the system calls that matter.

Everything a conch program (and, with ``allow_process``, a command it runs) legitimately
does stays allowed; what is denied is the kernel surface that escapes or sandboxes are built
from: tracing other processes, namespaces and mounts, loading code into the kernel (BPF,
modules, kexec), the key store, perf events, ``io_uring`` (whose operations bypass seccomp
argument checks), opening files by handle (a classic container escape), and personality
changes. Sockets other than AF_UNIX are refused unless the server allows the network
(AF_UNIX too where the worker's mount namespace does not hide the host's socket files).

Denied calls fail with ``EPERM`` (``ENOSYS`` for ``clone3``, whose flags a filter cannot
read, so that the C library falls back to ``clone``, whose flags it can); the filter is
inherited by every process the worker starts and cannot be removed. The filter is built by
libseccomp (through ``pyseccomp``), which also refuses system calls of a foreign
architecture (32-bit entry points on x86-64), the usual way around a filter written by hand.
"""

from __future__ import annotations

import contextlib
import errno
from typing import Any

# Always denied. Names libseccomp does not know on this architecture are skipped.
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev",
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsmount",
    "fsconfig", "fspick", "mount_setattr",
    "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd",
    "keyctl", "add_key", "request_key",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "name_to_handle_at", "open_by_handle_at",
    "acct", "swapon", "swapoff", "reboot", "syslog", "quotactl", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "iopl", "ioperm", "lookup_dcookie", "uselib",
)

# CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
# CLONE_NEWNET: a new namespace through clone() is an unshare() by another name.
_CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                     0x40000000)

_AF_UNIX, _AF_INET, _AF_INET6, _AF_NETLINK = 1, 2, 10, 16
_AF_MAX = 64  # above every family Linux defines (46 today)
_PERSONALITY_QUERY = 0xFFFFFFFF
# SOCK_DGRAM, SOCK_RAW, SOCK_RDM, SOCK_SEQPACKET, SOCK_DCCP, SOCK_PACKET (the low bits of a
# socket's type; the high ones are flags such as SOCK_CLOEXEC).
_NOT_STREAM = (2, 3, 4, 5, 6, 10)


class SeccompUnavailable(Exception):
    """No libseccomp (or no pyseccomp) on this machine."""


def _library() -> Any:
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:  # RuntimeError: no libseccomp.so
        raise SeccompUnavailable(f"libseccomp is not available ({exc})") from None
    return pyseccomp


def available() -> str | None:
    """``None`` where a filter can be loaded, else why not."""
    try:
        _library()
    except SeccompUnavailable as exc:
        return str(exc)
    return None


def allowed_socket_families(network: bool, unix: bool = True) -> tuple[int, ...]:
    # Name resolution asks the kernel about interfaces over netlink (AI_ADDRCONFIG).
    families = (_AF_INET, _AF_INET6, _AF_NETLINK) if network else ()
    return ((_AF_UNIX,) if unix else ()) + families


def install(*, network: bool, stream_only: bool = False, unix: bool = True) -> None:
    """Load the filter into this process (and its future children). libseccomp sets
    ``PR_SET_NO_NEW_PRIVS`` before loading. Every refusal is ``EPERM`` (Python's
    ``PermissionError``, the kind the language reports) except ``clone3``'s.

    ``stream_only`` keeps internet sockets to TCP: Landlock's port rules see only TCP, so a
    worker allowed one port (the inference server's) must not have UDP or raw sockets.

    ``unix=False`` refuses ``socket(AF_UNIX, …)``, for a worker whose mount namespace cannot
    hide the host's socket files (Landlock does not judge a connect() to one): no UNIX
    socket can then be connected to anything, while ``socketpair`` (a pair already joined to
    each other, which the worker's channel and pipes-like uses need) stays allowed."""
    sc = _library()
    deny = sc.ERRNO(errno.EPERM)
    flt = sc.SyscallFilter(defaction=sc.ALLOW)
    # A binary tree over the system call numbers rather than a chain of comparisons: every
    # system call of the worker passes through the filter.
    with contextlib.suppress(OSError):  # libseccomp before 2.5
        flt.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    # Loading a filter turns on the kernel's Speculative Store Bypass mitigation for the
    # process unless asked not to, which slows the interpreter by a fifth. It protects data
    # in a process from code in the same process; a worker holds nothing the program it runs
    # may not see (no keys, a scrubbed environment), and other processes are not affected.
    with contextlib.suppress(OSError):
        flt.set_attr(sc.Attr.CTL_SSB, 1)
    for name in DENIED:
        try:
            flt.add_rule(deny, name)
        except (OSError, ValueError):  # not a system call on this architecture
            continue
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in _CLONE_NAMESPACES:
        flt.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    flt.add_rule(deny, "personality", sc.Arg(0, sc.NE, _PERSONALITY_QUERY))
    allowed = allowed_socket_families(network, unix)
    for family in range(_AF_MAX):
        if family not in allowed:
            flt.add_rule(deny, "socket", sc.Arg(0, sc.EQ, family))
    flt.add_rule(deny, "socket", sc.Arg(0, sc.GE, _AF_MAX))
    if network and stream_only:
        for family in (_AF_INET, _AF_INET6):
            for kind in _NOT_STREAM:
                flt.add_rule(deny, "socket", sc.Arg(0, sc.EQ, family),
                             sc.Arg(1, sc.MASKED_EQ, 0xF, kind))
    flt.load()
