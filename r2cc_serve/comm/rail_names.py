"""Rail discovery: turn a rail spec into the address the transport uses.

A rail is an interface name or IPv4 address (a TCP rail), or on RDMA `rdma:<interface or IPv4>`
or `<device>:<port>` (e.g. `rxe0:1`). The transport is told a verbs rail as `rdma:<ip>`; peers
are told the address alone."""

from __future__ import annotations

import ipaddress

from r2cc_serve.comm import rdma_devices
from r2cc_serve.errors import UserError

RDMA_PREFIX = "rdma:"


def resolve_rails(rails: list[str], netns: str | None) -> list[str]:
    """IPv4 address of every rail; interface names are looked up inside `netns`."""
    return [ip for ip, _kind in resolve_rail_kinds(rails, netns)]


def resolve_rail_kinds(rails: list[str], netns: str | None) -> list[tuple[str, str]]:
    """(IPv4 address, "tcp" or "rdma") of every rail."""
    out = [_resolve_one(rail, netns) for rail in rails]
    ips = [ip for ip, _ in out]
    if len(set(ips)) != len(ips):
        raise UserError(f"rails must be distinct, got {rails}")
    return out


def transport_names(resolved: list[tuple[str, str]]) -> list[str]:
    """What the C++ transport is given: the address, prefixed rdma: for a verbs rail."""
    return [RDMA_PREFIX + ip if kind == "rdma" else ip for ip, kind in resolved]


def _resolve_one(rail: str, netns: str | None) -> tuple[str, str]:
    if rail.startswith(RDMA_PREFIX):
        return _ipv4(rail[len(RDMA_PREFIX):], netns, rail), "rdma"
    port = rdma_devices.find_port(rail) if ":" in rail else None
    if port is not None:
        ip = port.roce_v2_ipv4()
        if not ip:
            raise UserError(f"rail {rail!r}: the RDMA port has no RoCE v2 GID with an IPv4 address; give its "
                            "netdev an IPv4 address (and check `r2cc doctor`)")
        return ip, "rdma"
    if ":" in rail and not is_ipv4(rail):
        known = ", ".join(p.name for p in rdma_devices.list_ports()) or "none on this host"
        raise UserError(f"rail {rail!r}: no RDMA device port of that name (RDMA ports: {known}); name a rail "
                        "by interface, IPv4 address, rdma:<interface or IPv4>, or <device>:<port>")
    return _ipv4(rail, netns, rail), "tcp"


def is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
        return True
    except ValueError:
        return False


def _ipv4(name: str, netns: str | None, rail: str) -> str:
    from r2cc_serve import _C

    if is_ipv4(name):
        return name
    netns_path = f"/var/run/netns/{netns}" if netns else ""
    try:
        ip = _C.iface_ipv4(name, netns_path)
    except RuntimeError as exc:
        raise UserError(str(exc)) from None
    if not ip:
        where = f"namespace {netns}" if netns else "this host"
        raise UserError(f"rail {rail!r}: no interface with an IPv4 address of that name in {where}; "
                        "give interface names or IPv4 addresses")
    return ip
