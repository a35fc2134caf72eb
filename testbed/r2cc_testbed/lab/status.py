"""`status`: what the kernel says right now about every rail, plus the recorded faults.

Link state, shaping and nftables faults (blackhole, lossy, and the directions a gray or marginal
rail drops in) are read live (one `ip`, `tc`, `nft` call per namespace), so the report stays
true even if someone changed a link by hand.
"""

from __future__ import annotations

from r2cc_testbed.faults.model import SIZE_FAULTS
from r2cc_testbed.lab import mptcp, netns, shaping, state
from r2cc_testbed.lab.layout import Layout


def collect(layout: Layout, recorded: dict) -> dict:
    host_qdiscs = [_root_qdiscs(layout.host_ns(i)) for i in range(layout.hosts)]
    switch_qdiscs = _root_qdiscs(layout.switch_ns) if layout.switched else {}
    namespaces = [layout.host_ns(i) for i in range(layout.hosts)] + ([layout.switch_ns] if layout.switched else [])
    tables = {ns: {name for _family, name in netns.nft_tables(ns)} for ns in namespaces}
    hosts, links = [], []
    for i in range(layout.hosts):
        ns = layout.host_ns(i)
        ifaces = _links(ns)
        # Shaping towards host i: the switch port's egress, or (two hosts) the peer's egress.
        towards = switch_qdiscs if layout.switched else host_qdiscs[1 - i]
        hosts.append(_host_entry(layout, i, ifaces))
        for k in range(layout.rails):
            links.append(_link_entry(layout, i, k, ifaces, host_qdiscs[i], tables, towards))
    return {
        "prefix": layout.prefix,
        "state_file": recorded.get("state_file"),
        "hosts": layout.hosts,
        "rails": layout.rails,
        "rate": recorded.get("rate"),
        "mtu": recorded.get("mtu"),
        "topology": "switch" if layout.switched else "direct",
        "switch_ns": layout.switch_ns if layout.switched else None,
        "mgmt": {"bridge": layout.mgmt_bridge, "root_ip": layout.mgmt_root_ip,
                 "subnet": layout.mgmt_subnet, "host_ifname": layout.mgmt_ifname},
        "host_list": hosts,
        "links": links,
        "faults": state.fault_list(recorded),
    }


def _host_entry(layout: Layout, i: int, ifaces: dict) -> dict:
    mgmt = ifaces.get(layout.mgmt_ifname, {})
    return {"host": i, "netns": layout.host_ns(i), "mgmt_ip": layout.mgmt_ip(i),
            "mgmt_up": mgmt.get("operstate") == "UP",
            "mptcp_endpoints": [f"{e.get('address')} dev {e.get('dev', '?')}" for e in mptcp.endpoints(layout.host_ns(i))]}


def _link_entry(layout: Layout, i: int, k: int, ifaces: dict, qdiscs: dict, tables: dict[str, set],
                towards: dict) -> dict:
    dev = layout.rail_ifname(k)
    link = ifaces.get(dev, {})
    flags = link.get("flags", [])
    towards_host = towards.get(layout.switch_port(i, k) if layout.switched else dev, {})
    return {
        "host": i, "rail": k, "ifname": dev, "ip": layout.rail_ip(i, k),
        "subnet": layout.rail_subnet(k),
        "exists": bool(link),
        "admin_up": "UP" in flags,
        "carrier": "LOWER_UP" in flags,
        # link_up uses the flags, which change at once; operstate lags up to ~1 s (linkwatch).
        "link_up": "UP" in flags and "LOWER_UP" in flags,
        "operstate": link.get("operstate", "MISSING"),
        "mtu": link.get("mtu"),
        "egress_shaping": shaping.describe(qdiscs.get(dev, {})),
        "ingress_shaping": shaping.describe(towards_host),
        "blackhole": layout.blackhole_table(k) in tables[layout.host_ns(i)],
        "lossy": layout.lossy_table(k) in tables[layout.host_ns(i)],
        **{kind: _drop_direction(layout, kind, i, k, tables) for kind in SIZE_FAULTS},
    }


def _drop_direction(layout: Layout, kind: str, i: int, k: int, tables: dict[str, set]) -> str | None:
    """Which way a gray or marginal fault of host i's rail k drops (both, out, in; None: it does
    not): its table at the host's own ingress drops what comes in, the far end's what goes out."""
    (own_ns, _), (far_ns, _) = layout.link_ends(i, k)
    ways = [way for way, ns, table in (("in", own_ns, layout.drop_table(kind, k)),
                                      ("out", far_ns, layout.drop_far_table(kind, i, k))) if table in tables[ns]]
    return "both" if len(ways) == 2 else (ways[0] if ways else None)


def _links(ns: str) -> dict:
    return {link["ifname"]: link for link in netns.ip_json(ns, "link", "show")}


def _root_qdiscs(ns: str) -> dict:
    return {q["dev"]: q for q in netns.tc_json(ns, "qdisc", "show") if q.get("root")}
