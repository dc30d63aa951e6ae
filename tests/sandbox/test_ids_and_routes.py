"""The pieces of the second round of layers that need no worker: which addresses a worker
allowed the network may not reach (its namespace's ``prohibit`` routes), the machine-wide
leases of ids from ``sandbox_uids``, and what ``sandbox = "strict"`` refuses."""

from __future__ import annotations

import asyncio
import ipaddress
import os
from pathlib import Path

import pytest

from conch.config import Settings, parse_id_range
from conch.sandbox import netns, uids
from conch.sandbox.layers import SandboxUnavailable
from conch.sandbox.pool import SandboxPool


def _covered(networks: list[str], address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return any(ip in ipaddress.ip_network(n) for n in networks)


def test_every_address_the_language_refuses_is_prohibited() -> None:
    from conch.lang.netpolicy import NetworkPolicy

    language = NetworkPolicy(restrict_private=True)
    routes = netns.prohibited(own=["198.51.100.7", "8.8.4.4"])
    for address in ("127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
                    "100.64.0.1", "0.0.0.1", "224.0.0.1", "240.0.0.1", "203.0.113.80",
                    "192.0.2.2", "198.18.0.1"):
        assert _covered(routes, address), address
        assert not language.allowed(address, address), address  # the same policy
    assert _covered(routes, "8.8.4.4")  # the host's own address, though global
    for address in ("8.8.8.8", "1.1.1.1", "151.101.0.223"):
        assert not _covered(routes, address), address
        assert language.allowed(address, address), address
    # slirp4netns's own network (its DNS forwarder) stays reachable.
    assert not _covered(routes, netns.SLIRP_DNS)


def test_network_allow_opens_holes() -> None:
    routes = netns.prohibited(["10.1.2.3", "192.168.0.0/24", "localhost"])
    assert not _covered(routes, "10.1.2.3") and _covered(routes, "10.1.2.4")
    assert not _covered(routes, "192.168.0.77") and _covered(routes, "192.168.1.77")
    # A name is resolved once; localhost's loopback is of no use through the stack, but it
    # costs nothing to leave out.
    assert netns.allows_loopback(["example.org", "127.0.0.1"]) == "127.0.0.1"
    assert netns.allows_loopback(["::1"]) == "::1"
    assert netns.allows_loopback(["localhost"]) == "localhost"
    assert netns.allows_loopback(["10.0.0.0/8"]) is None


def test_the_id_range_is_parsed_strictly() -> None:
    assert parse_id_range("60000-60999") == range(60000, 61000)
    assert parse_id_range("70000") == range(70000, 70001)
    for bad in ("0-10", "10-5", "a-b", "-5", "60000-4294967295"):
        with pytest.raises(ValueError, match="sandbox_uids"):
            parse_id_range(bad)
    with pytest.raises(ValueError, match="sandbox_uids"):
        Settings(sandbox_uids="root")
    assert Settings(sandbox_uids="").sandbox_uids == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="the machine-wide lock directory is root's")
def test_ids_are_leased_once_on_the_machine() -> None:
    ids = uids.Ids(range(64900, 64904))
    other = uids.Ids(range(64900, 64904))  # another server: its own descriptors
    first = ids.lease()
    assert first is not None
    held = [first]
    while (lease := other.lease()) is not None:
        held.append(lease)
    assert len({lease.id for lease in held}) == len(held)
    assert first.id not in {lease.id for lease in held[1:]}
    first.release()
    again = other.lease()
    assert again is not None and again.id == first.id
    for lease in [*held[1:], again]:
        lease.release()


@pytest.mark.skipif(os.geteuid() != 0, reason="the machine-wide lock directory is root's")
def test_a_group_is_shared_only_by_servers_of_one_workspace() -> None:
    a, b = uids.Ids(range(64910, 64914)), uids.Ids(range(64910, 64914))
    group = a.lease(group=True)
    assert group is not None
    shared = b.lease(prefer=group.id, group=True)  # the same workspace, whose group it is
    assert shared is not None and shared.id == group.id
    fresh = b.lease(group=True)  # another workspace: never an id held by anyone
    worker = b.lease()  # a worker's uid: never a group's
    assert fresh is not None and worker is not None
    assert group.id not in (fresh.id, worker.id) and fresh.id != worker.id
    for lease in (group, shared, fresh, worker):
        lease.release()


@pytest.mark.skipif(os.geteuid() != 0, reason="the layers strict needs here are a root server's")
@pytest.mark.parametrize(("overrides", "named"), [
    ({"sandbox_uids": ""}, "uid_range"),
    ({"allow_network": True, "network_allow": ["127.0.0.1"]}, "network_namespace"),
])
def test_strict_refuses_without_the_new_layers(tmp_path: Path, overrides: dict[str, object],
                                               named: str) -> None:
    settings = Settings(data_dir=tmp_path / "data", workspace=tmp_path / "ws", workers=1,
                        sandbox="strict", **overrides)  # type: ignore[arg-type]

    async def start() -> None:
        pool = SandboxPool(settings)
        try:
            await pool.start()
        finally:
            await pool.close()

    with pytest.raises(SandboxUnavailable, match=named):
        asyncio.run(start())
