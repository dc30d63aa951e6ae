"""Where the ``http_*`` builtins may connect, and how much they may read.

In the shell (a run without host settings) every address is allowed. In the agent server
(``allow_network`` on) an address that is not globally routable is refused: private,
loopback, link-local (cloud metadata at 169.254.169.254 and fd00:ec2::254 included),
shared, reserved and multicast ranges, unless ``network_allow`` lists the host name, the
address or a network containing it. The check runs when the socket is opened, on the
address actually connected to, so a DNS answer that changes between a check and the
connection, or a redirect to a private address, cannot get around it.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import httpcore

from conch.lang.errors import ConchError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class NetworkPolicy:
    def __init__(self, restrict_private: bool, allow: list[str] | tuple[str, ...] = (),
                 max_bytes: int = 10 * 1024 * 1024, timeout_s: float = 30.0) -> None:
        self.restrict_private = restrict_private
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.hosts: set[str] = set()
        self.networks: list[Network] = []
        for entry in allow:
            entry = entry.strip()
            try:
                self.networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                self.hosts.add(entry.lower().rstrip("."))

    def allowed(self, host: str, ip: str) -> bool:
        if not self.restrict_private:
            return True
        address = _address(ip)
        if address is None:
            return False
        if address.is_global and not address.is_multicast:
            return True
        if host.lower().rstrip(".") in self.hosts:
            return True
        return any(address in net for net in self.networks if net.version == address.version)

    def check(self, host: str, ip: str) -> None:
        if not self.allowed(host, ip):
            shown = host if host == ip else f"{host} ({ip})"
            raise Refused(
                f"{shown} is a private, loopback or link-local address, which the server refuses",
            )


class Refused(Exception):
    """An address the policy does not allow (raised from inside the connection pool)."""


def _address(ip: str) -> Address | None:
    try:
        address = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class GuardedBackend(httpcore.SyncBackend):
    """httpcore's socket backend, resolving names itself so the address it checks is the
    address it connects to."""

    def __init__(self, policy: NetworkPolicy) -> None:
        self.policy = policy

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc.strerror}") from None
        ips = list(dict.fromkeys(str(info[4][0]) for info in infos))
        for ip in ips:
            self.policy.check(host, ip)
        last: Exception | None = None
        for ip in ips:
            try:
                return super().connect_tcp(ip, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        assert last is not None
        raise last


# What httpx's own pool was built with (each kept as ``_<name>`` by httpcore.ConnectionPool)
_POOL_SETTINGS = ("ssl_context", "max_connections", "max_keepalive_connections",
                  "keepalive_expiry", "http1", "http2")


def client(policy: NetworkPolicy, timeout: float) -> Any:
    """An ``httpx.Client`` whose every connection (redirects included) goes through the
    policy; proxies from the environment are ignored (they would bypass it)."""
    import httpx

    transport = httpx.HTTPTransport(retries=0)
    # httpx takes no network backend of its own: give its pool one (the pool is the
    # documented httpcore.ConnectionPool, built with the same defaults).
    pool = transport._pool
    kept = {name: getattr(pool, f"_{name}") for name in _POOL_SETTINGS}
    transport._pool = httpcore.ConnectionPool(**kept, retries=0, network_backend=GuardedBackend(policy))
    return httpx.Client(transport=transport, timeout=timeout, follow_redirects=True,
                        max_redirects=5, trust_env=False)


def policy_for(settings: Any) -> NetworkPolicy:
    """The policy of a run: unrestricted with no host settings (the shell), else the server's."""
    if settings is None:
        return NetworkPolicy(restrict_private=False)
    return NetworkPolicy(
        restrict_private=True,
        allow=list(getattr(settings, "network_allow", []) or []),
        max_bytes=int(getattr(settings, "http_max_bytes", 10 * 1024 * 1024)),
        timeout_s=float(getattr(settings, "http_timeout_s", 30.0)),
    )


def refused_error(builtin: str, exc: Refused) -> ConchError:
    return ConchError("PermissionError", f"{builtin}: {exc}",
                      hint="the server's network_allow setting lists the hosts and networks it may reach")
