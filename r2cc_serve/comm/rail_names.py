"""Rail discovery: turn a rail spec (interface names or IPv4 addresses) into addresses."""

from __future__ import annotations

import ipaddress

from r2cc_serve.errors import UserError


def resolve_rails(rails: list[str], netns: str | None) -> list[str]:
    """IPv4 address of every rail; interface names are looked up inside `netns`."""
    from r2cc_serve import _C

    netns_path = f"/var/run/netns/{netns}" if netns else ""
    out = []
    for rail in rails:
        try:
            ipaddress.IPv4Address(rail)
            out.append(rail)
            continue
        except ValueError:
            pass
        try:
            ip = _C.iface_ipv4(rail, netns_path)
        except RuntimeError as exc:
            raise UserError(str(exc)) from None
        if not ip:
            where = f"namespace {netns}" if netns else "this host"
            raise UserError(f"rail {rail!r}: no interface with an IPv4 address of that name in {where}; "
                            "give interface names or IPv4 addresses")
        out.append(ip)
    if len(set(out)) != len(out):
        raise UserError(f"rails must be distinct, got {rails}")
    return out
