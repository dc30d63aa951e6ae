"""A worker's network namespace: what is reachable from it, set up by the kernel's own means.

Each worker of a root server runs in a network namespace of its own. With the network off
it holds a loopback interface and nothing else: no route leaves it, so no address of the
host (its loopback, where other servers listen, included) and no other machine is
reachable, by TCP or UDP, whatever a program or a command tries, and nothing it binds is
reachable from outside. With ``allow_network`` a user-mode network stack (``slirp4netns``,
:mod:`conch.sandbox.slirp`) carries its outbound traffic through the host's sockets; the
namespace's routing table then refuses (``EACCES``, ``prohibit`` routes) every address the
language's policy refuses — private, loopback, link-local, shared, reserved, documentation
and multicast ranges, and the host's own addresses — except what ``network_allow`` lists.
The host's loopback is not reachable through the stack at all (``--disable-host-loopback``).

The ``model`` effect reaches the inference server through a relay: a listening socket on the
namespace's own loopback at the port of ``models_url``, made by the server inside the
worker's namespace (:func:`listen_inside`) and served by it (:mod:`conch.sandbox.relay`).

Standard library only: the worker applies :func:`loopback_up` and :func:`prohibit` as root,
before it drops its privileges (the sandbox user may change neither afterwards).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_CLONE_NEWNET = 0x40000000

# What a program must not reach though the network is on: every IPv4 range that is not
# globally routable (Python's ``ipaddress`` tables, as the language's policy uses them, and
# IANA's special-purpose registry), shared address space and multicast included.
NOT_GLOBAL_V4 = (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16",
    "198.18.0.0/15", "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
)

# slirp4netns's own network: its gateway (the host, whose loopback it refuses) and its DNS
# forwarder, which resolves names with the host's resolver.
SLIRP_NETWORK = "10.0.2.0/24"
SLIRP_DNS = "10.0.2.3"


def host_addresses() -> list[str]:
    """The IPv4 addresses of this host's own interfaces (from the kernel's routing trie): a
    worker that reached one through the stack would reach the host's services as a
    neighbour would."""
    found: list[str] = []
    with contextlib.suppress(OSError), open("/proc/net/fib_trie") as trie:
        last = None
        for line in trie:
            text = line.strip()
            if text.startswith(("|--", "+--")):
                last = text.split()[1]
            elif text == "/32 host LOCAL" and last is not None:
                found.append(last)
    return sorted(set(found))


def prohibited(allow: Iterable[str] = (), own: Iterable[str] = ()) -> list[str]:
    """The IPv4 networks a worker with the network on must not reach: the ranges that are
    not globally routable and the host's own addresses (``own``), less slirp4netns's network
    and what ``allow`` lists (``network_allow``: networks, addresses, or host names, which
    are resolved now)."""
    blocked = [ipaddress.ip_network(n) for n in NOT_GLOBAL_V4]
    blocked += [ipaddress.ip_network(f"{a}/32") for a in own]
    opened: list[Network] = [ipaddress.ip_network(SLIRP_NETWORK)]
    for entry in allow:
        entry = entry.strip()
        try:
            opened.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        with contextlib.suppress(OSError):
            for info in socket.getaddrinfo(entry, None, socket.AF_INET):
                opened.append(ipaddress.ip_network(f"{info[4][0]}/32"))
    result: list[ipaddress.IPv4Network] = []
    for net in ipaddress.collapse_addresses(n for n in blocked if n.version == 4):
        pieces = [net]
        for hole in opened:
            if hole.version != 4:
                continue
            next_pieces: list[ipaddress.IPv4Network] = []
            for piece in pieces:
                if hole.supernet_of(piece):  # type: ignore[arg-type]
                    continue
                if piece.supernet_of(hole):  # type: ignore[arg-type]
                    next_pieces += piece.address_exclude(hole)  # type: ignore[arg-type]
                else:
                    next_pieces.append(piece)
            pieces = next_pieces
        result += pieces
    return [str(n) for n in ipaddress.collapse_addresses(result)]


def allows_loopback(allow: Iterable[str]) -> str | None:
    """The first ``network_allow`` entry that names the host's loopback (which only the
    host's own network namespace reaches), or ``None``."""
    for entry in allow:
        entry = entry.strip()
        if entry.lower().rstrip(".") == "localhost":
            return entry
        with contextlib.suppress(ValueError):
            net = ipaddress.ip_network(entry, strict=False)
            loopback = ipaddress.ip_network("127.0.0.0/8" if net.version == 4 else "::1/128")
            if net.overlaps(loopback):  # type: ignore[arg-type]
                return entry
    return None


# -- inside the namespace (the worker, as root) ----------------------------------------------

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def loopback_up() -> None:
    """Bring up the namespace's own ``lo`` (127.0.0.1 and ::1, reachable only from inside)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


_NETLINK_ROUTE = 0
_RTM_NEWROUTE = 24
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
_NLMSG_ERROR = 2
_RT_TABLE_MAIN, _RTPROT_STATIC, _RT_SCOPE_UNIVERSE, _RTN_PROHIBIT = 254, 4, 0, 8
_RTA_DST = 1


def prohibit(networks: Iterable[str]) -> None:
    """Add a ``prohibit`` route for each network to this namespace's main table: a connect
    or send to an address in one fails with ``EACCES`` (``PermissionError``), TCP and UDP
    alike. More specific routes (slirp4netns's own network) still win."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_ROUTE) as sock:
        sock.bind((0, 0))
        for seq, text in enumerate(networks, start=1):
            net = ipaddress.ip_network(text)
            family = socket.AF_INET if net.version == 4 else socket.AF_INET6
            dst = net.network_address.packed
            rtmsg = struct.pack("BBBBBBBBI", family, net.prefixlen, 0, 0, _RT_TABLE_MAIN,
                                _RTPROT_STATIC, _RT_SCOPE_UNIVERSE, _RTN_PROHIBIT, 0)
            rta = struct.pack("HH", 4 + len(dst), _RTA_DST) + dst
            rta += b"\0" * (-len(rta) % 4)
            body = rtmsg + rta
            header = struct.pack("IHHII", 16 + len(body), _RTM_NEWROUTE,
                                 _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_CREATE | _NLM_F_EXCL, seq, 0)
            sock.send(header + body)
            answer = sock.recv(4096)
            kind = struct.unpack_from("H", answer, 4)[0]
            if kind == _NLMSG_ERROR:
                error = -struct.unpack_from("i", answer, 16)[0]
                if error:
                    raise OSError(error, f"prohibit route {text}: {os.strerror(error)}")


# -- from the server: a socket made in a worker's namespace ----------------------------------


def listen_inside(pid: int, host: str, port: int) -> socket.socket:
    """A listening TCP socket at ``host:port`` in the network namespace of process ``pid``
    (a worker), made by a thread of this process that enters that namespace and ends there:
    the socket stays in the worker's namespace, this process in its own. Needs
    ``CAP_SYS_ADMIN`` (a root server)."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def enter_and_listen() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into worker {pid}: {os.strerror(err)}")
            finally:
                os.close(fd)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen(64)
                sock.setblocking(False)
            except BaseException:
                sock.close()
                raise
            made.append(sock)
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    # A thread of its own, never reused: it leaves this process's namespace for good.
    thread = threading.Thread(target=enter_and_listen, name=f"netns-{pid}", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return made[0]
