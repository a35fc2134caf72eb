"""Build and tear down the lab: host namespaces, veth rails, rail switches, management bridge.

Two hosts: rail k is one veth pair straight between the hosts. More hosts: rail k is a bridge
named rail{k} in the switch namespace, and each host's rail{k} veth is plugged into it.
Management: bridge <prefix>-mgmt in the ROOT namespace, so root-namespace processes (mpirun,
a benchmark driver) reach every host; rail faults never touch it.
"""

from __future__ import annotations

from r2cc_testbed.lab import mptcp, netns, shaping
from r2cc_testbed.lab.layout import Layout
from r2cc_testbed.lab.netns import LabError

# New interfaces in a lab namespace get no IPv6: no DAD/router-solicitation noise on rails.
_NO_IPV6_BY_DEFAULT = {"net.ipv6.conf.default.disable_ipv6": "1"}


def build(layout: Layout, rate: str | None, mtu: int, with_mptcp: bool = True) -> None:
    """Create the whole lab; on any failure remove what was made and re-raise.

    with_mptcp: give each host an MPTCP subflow endpoint per rail beyond rail 0 (lab/mptcp.py);
    plain TCP, r2cc's transport, ignores them.
    """
    try:
        _check_mgmt_subnet_free(layout)
        _add_namespaces(layout)
        _add_mgmt(layout)
        if layout.switched:
            _add_switched_rails(layout, mtu)
        else:
            _add_direct_rails(layout, mtu)
        if rate:
            for i in range(layout.hosts):
                for k in range(layout.rails):
                    shaping.set_link_rate(layout, i, k, rate)
        if with_mptcp:
            _add_mptcp_endpoints(layout)
    except BaseException:
        teardown(layout.prefix)
        raise


def teardown(prefix: str) -> list[str]:
    """Remove every namespace and root-namespace link of the lab with this prefix.

    Found by name, not by state file, so a half-built or forgotten lab is removed too. nftables
    tables live inside the host namespaces and vanish with them. Returns what was removed.
    """
    layout = Layout(prefix, hosts=2, rails=1)  # only the name patterns are used
    removed = []
    for name in netns.list_netns():
        if layout.owns_netns(name):
            netns.delete_netns(name)
            removed.append(f"netns {name}")
    # A namespace kept alive by a running process keeps its veths; remove the root ends
    # explicitly so the management bridge and ports never outlive `down`.
    for link in netns.root_links():
        if layout.owns_root_link(link):
            netns.delete_root_link(link)
            removed.append(f"link {link}")
    return removed


def _check_mgmt_subnet_free(layout: Layout) -> None:
    prefix = layout.mgmt_subnet.rsplit(".", 1)[0] + "."
    for link in netns.ip_json(None, "-4", "addr", "show"):
        for addr in link.get("addr_info", []):
            if addr.get("local", "").startswith(prefix) and link["ifname"] != layout.mgmt_bridge:
                raise LabError(
                    f"management subnet {layout.mgmt_subnet} is already used by {link['ifname']} in "
                    f"the root namespace (another lab?); run `r2cc lab down` with that lab's "
                    f"R2CC_LAB_PREFIX, or pick another prefix")


def _add_namespaces(layout: Layout) -> None:
    names = [layout.host_ns(i) for i in range(layout.hosts)]
    if layout.switched:
        names.append(layout.switch_ns)
    for name in names:
        netns.add_netns(name)
        netns.sysctl(name, _NO_IPV6_BY_DEFAULT)


def _add_mgmt(layout: Layout) -> None:
    bridge = layout.mgmt_bridge
    netns.ip(None, "link", "add", bridge, "type", "bridge")
    _disable_ipv6_in_root(bridge)
    netns.ip(None, "addr", "add", f"{layout.mgmt_root_ip}/24", "dev", bridge)
    netns.ip(None, "link", "set", bridge, "up")
    for i in range(layout.hosts):
        port, host = layout.mgmt_root_port(i), layout.host_ns(i)
        netns.ip(None, "link", "add", port, "type", "veth",
                 "peer", "name", layout.mgmt_ifname, "netns", host)
        _disable_ipv6_in_root(port)
        netns.ip(None, "link", "set", port, "master", bridge, "up")
        _configure_host_end(host, layout.mgmt_ifname, f"{layout.mgmt_ip(i)}/24")


def _add_direct_rails(layout: Layout, mtu: int) -> None:
    h0, h1 = layout.host_ns(0), layout.host_ns(1)
    for k in range(layout.rails):
        dev = layout.rail_ifname(k)
        netns.ip(h0, "link", "add", dev, "mtu", str(mtu), "type", "veth",
                 "peer", "name", dev, "mtu", str(mtu), "netns", h1)
        for i in (0, 1):
            _configure_host_end(layout.host_ns(i), dev, f"{layout.rail_ip(i, k)}/24")


def _add_switched_rails(layout: Layout, mtu: int) -> None:
    sw = layout.switch_ns
    for k in range(layout.rails):
        bridge = layout.rail_ifname(k)  # the switch of rail k carries the rail's name
        netns.ip(sw, "link", "add", bridge, "type", "bridge", "stp_state", "0")
        for i in range(layout.hosts):
            dev, port = layout.rail_ifname(k), layout.switch_port(i, k)
            netns.ip(layout.host_ns(i), "link", "add", dev, "mtu", str(mtu), "type", "veth",
                     "peer", "name", port, "mtu", str(mtu), "netns", sw)
            netns.ip(sw, "link", "set", port, "master", bridge, "up")
            _configure_host_end(layout.host_ns(i), dev, f"{layout.rail_ip(i, k)}/24")
        netns.ip(sw, "link", "set", bridge, "mtu", str(mtu), "up")


def _add_mptcp_endpoints(layout: Layout) -> None:
    for i in range(layout.hosts):
        mptcp.add_endpoints(layout.host_ns(i), [(layout.rail_ifname(k), layout.rail_ip(i, k))
                                                for k in range(1, layout.rails)])


def _configure_host_end(ns: str, dev: str, cidr: str) -> None:
    netns.ip(ns, "addr", "add", cidr, "dev", dev)
    netns.ip(ns, "link", "set", dev, "up")


def _disable_ipv6_in_root(dev: str) -> None:
    # Only this interface: the root namespace's global settings belong to the machine.
    try:
        with open(f"/proc/sys/net/ipv6/conf/{dev}/disable_ipv6", "w") as f:
            f.write("1")
    except FileNotFoundError:
        pass  # kernel without IPv6: nothing to disable
