"""Which rails and peers a doctor run is about, from what the user gave.

This host's rails are named as the communicator names them (interface names or IPv4 addresses,
from --rails, R2CC_RAILS or a rail map file: r2cc_serve/comm/rail_config.py); a peer is its
rail addresses in rail order. Anything that cannot be a rail or a peer is a UserError (exit 2).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from r2cc_serve.comm.rail_names import is_ipv4
from r2cc_serve.doctor.netinfo import Iface, holder
from r2cc_serve.errors import UserError


@dataclass(frozen=True)
class Rail:
    index: int
    ifname: str
    addr: str | None      # None: the interface has no IPv4 address (a problem, reported)
    iface: Iface

    @property
    def network(self) -> ipaddress.IPv4Network | None:
        return self.iface.network(self.addr) if self.addr else None


@dataclass(frozen=True)
class Peer:
    label: str
    addrs: tuple[str, ...]


def _ip_path_of(spec: str) -> str:
    """An RDMA rail (rdma:<interface or IPv4>, <device>:<port>) is checked over its netdev's IPv4
    path (its port itself: `r2cc doctor --rdma`); other specs are returned as they are."""
    from r2cc_serve.comm import rdma_devices
    from r2cc_serve.comm.rail_names import RDMA_PREFIX

    if spec.startswith(RDMA_PREFIX):
        return spec[len(RDMA_PREFIX):]
    port = rdma_devices.find_port(spec) if ":" in spec else None
    return (port.roce_v2_ipv4() or spec) if port else spec


def resolve_rails(specs: list[str], ifaces: dict[str, Iface]) -> list[Rail]:
    """Each rail's interface and address. An interface name takes its first IPv4 address, as
    the communicator does (csrc/net.cc iface_ipv4)."""
    rails = []
    for k, spec in enumerate(specs):
        spec = _ip_path_of(spec)
        if is_ipv4(spec):
            iface = holder(ifaces, spec)
            if iface is None:
                raise UserError(f"rail {k} ({spec}): no interface on this host has that address "
                                f"(addresses here: {_addresses(ifaces)})")
            rails.append(Rail(k, iface.name, spec, iface))
        elif spec in ifaces:
            iface = ifaces[spec]
            rails.append(Rail(k, spec, iface.addrs[0][0] if iface.addrs else None, iface))
        else:
            raise UserError(f"rail {k} ({spec}): no such interface on this host (interfaces: "
                            f"{', '.join(sorted(ifaces)) or 'none'}); give interface names or IPv4 addresses")
    addrs = [r.addr for r in rails if r.addr]
    if len(set(addrs)) != len(addrs):
        raise UserError(f"rails must be distinct, got {', '.join(specs)}")
    return rails


def _addresses(ifaces: dict[str, Iface]) -> str:
    return ", ".join(a for i in ifaces.values() for a, _ in i.addrs) or "none"


def parse_peer(text: str, rails: int, label: str | None = None) -> Peer:
    """A peer from its rail addresses in rail order, "A,B,C,D"."""
    addrs = tuple(a.strip() for a in text.split(",") if a.strip())
    bad = [a for a in addrs if not is_ipv4(a)]
    if bad:
        raise UserError(f"peer {text!r}: {bad[0]!r} is not an IPv4 address; give the peer's rail addresses "
                        "in rail order, e.g. --peer 10.0.1.2,10.0.2.2")
    if len(addrs) != rails:
        raise UserError(f"peer {text!r} has {len(addrs)} address(es) but this host has {rails} rail(s): "
                        "give one address per rail, in rail order")
    if len(set(addrs)) != len(addrs):
        raise UserError(f"peer {text!r}: the addresses must be distinct")
    return Peer(label or addrs[0], addrs)


def read_peers_file(path: str, rails: int) -> list[Peer]:
    """One peer per line: "[NAME] ADDR,ADDR,...", # starts a comment."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise UserError(f"--peers {path}: cannot read it ({exc.strerror})") from None
    peers = []
    for n, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) > 2:
            raise UserError(f"--peers {path}:{n}: expected `[NAME] ADDR,ADDR,...`, got {line.strip()!r}")
        try:
            peers.append(parse_peer(words[-1], rails, words[0] if len(words) == 2 else None))
        except UserError as exc:
            raise UserError(f"--peers {path}:{n}: {exc}") from None
    if not peers:
        raise UserError(f"--peers {path}: names no peer")
    return peers
