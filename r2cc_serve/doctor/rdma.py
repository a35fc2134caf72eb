"""`r2cc doctor --rdma`: the RDMA ports this host has, as RDMA rails will use them.

For each port: its state, link layer, active MTU and the GIDs that carry an IPv4 address (a RoCE
rail is found by that address; use the RoCE v2 one). Exit 0 when every listed port a rail
names is ACTIVE with a RoCE v2 IPv4 GID, 1 otherwise (each problem on one line with its fix).
"""

from __future__ import annotations

import json

from r2cc_serve.comm import rdma_devices
from r2cc_serve.comm.rail_names import RDMA_PREFIX

NO_DEVICE = ("no RDMA device on this host: load the NIC's driver and rdma-core's provider (Debian: rdma-core "
             "ibverbs-providers), or for soft-RoCE `modprobe rdma_rxe; rdma link add rxe0 type rxe netdev IFACE`")


def problems(ports: list[rdma_devices.Port], rails: list[str]) -> list[str]:
    """What keeps the named RDMA rails (device:port; others are ignored) from working."""
    out = []
    by_name = {p.name: p for p in ports}
    for rail in rails:
        if rail.startswith(RDMA_PREFIX) or ":" not in rail:
            continue
        port = by_name.get(rail)
        if port is None:
            out.append(f"rail {rail}: no such RDMA port (ports here: {', '.join(by_name) or 'none'})")
        elif port.state != "ACTIVE":
            out.append(f"rail {rail}: port is {port.state}: bring its netdev up (`ip link set IFACE up`) and "
                       "check the cable/switch port")
        elif not port.roce_v2_ipv4():
            out.append(f"rail {rail}: no RoCE v2 GID with an IPv4 address: `ip addr add ADDRESS/PREFIX dev IFACE` "
                       "on its netdev")
    return out


def render(ports: list[rdma_devices.Port]) -> str:
    if not ports:
        return NO_DEVICE
    lines = []
    for p in ports:
        lines.append(f"{p.name:<12} {p.state:<8} {p.link_layer:<10} mtu {p.mtu or '?'}")
        for g in p.gids:
            if g.ipv4:
                lines.append(f"    gid[{g.index}] {g.type:<8} {g.ipv4:<15} on {g.netdev or '?'}"
                             + ("   <- rail address" if g.type == "RoCE v2" else ""))
    return "\n".join(lines)


def run(rails: list[str], as_json: bool) -> int:
    ports = rdma_devices.list_ports()
    found = problems(ports, rails)
    if as_json:
        print(json.dumps({"ports": [_port_json(p) for p in ports], "problems": found}, indent=2))
    else:
        print(render(ports))
        for line in found:
            print(f"PROBLEM {line}")
    return 1 if (found or not ports) else 0


def _port_json(p: rdma_devices.Port) -> dict:
    return {"port": p.name, "state": p.state, "link_layer": p.link_layer, "mtu": p.mtu,
            "gids": [{"index": g.index, "type": g.type, "ipv4": g.ipv4, "netdev": g.netdev} for g in p.gids]}
