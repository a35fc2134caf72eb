"""What this host's kernel says about its interfaces, routes, neighbours and settings.

Interfaces, routes and neighbours come from iproute2's JSON output (`ip -j`), settings from
/proc/sys; both answer for the network namespace of the calling process. Nothing here waits
on the network.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass

from r2cc_serve.errors import UserError


@dataclass(frozen=True)
class Iface:
    name: str
    index: int
    mtu: int
    up: bool                               # administratively up
    carrier: bool                          # the link layer is up (LOWER_UP)
    loopback: bool
    addrs: tuple[tuple[str, int], ...]     # (IPv4 address, prefix length), in the kernel's order

    def network(self, addr: str) -> ipaddress.IPv4Network | None:
        """The subnet of `addr` on this interface (on loopback, any address of its subnets)."""
        for a, plen in self.addrs:
            net = ipaddress.IPv4Network(f"{a}/{plen}", strict=False)
            if a == addr or (self.loopback and ipaddress.IPv4Address(addr) in net):
                return net
        return None

    def as_dict(self) -> dict:
        return {"name": self.name, "index": self.index, "mtu": self.mtu, "up": self.up,
                "carrier": self.carrier, "loopback": self.loopback, "addrs": [list(a) for a in self.addrs]}

    @classmethod
    def from_dict(cls, d: dict) -> "Iface":
        return cls(d["name"], d["index"], d["mtu"], d["up"], d["carrier"], d["loopback"],
                   tuple((a, p) for a, p in d["addrs"]))


def _run_ip(*args: str) -> str | None:
    """`ip ARGS`'s output; None when ip reports an error (no route, no such device)."""
    if shutil.which("ip") is None:
        raise UserError("r2cc doctor needs the `ip` command: apt-get install -y iproute2")
    try:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return None
    return proc.stdout if proc.returncode == 0 else None


def _ip_json(*args: str) -> list | None:
    out = _run_ip("-j", *args)
    return json.loads(out) if out and out.strip() else None


def interfaces() -> dict[str, Iface]:
    out = {}
    for link in _ip_json("addr", "show") or []:
        flags = set(link.get("flags", []))
        addrs = tuple((a["local"], a["prefixlen"]) for a in link.get("addr_info", []) if a.get("family") == "inet")
        out[link["ifname"]] = Iface(link["ifname"], link["ifindex"], link.get("mtu", 0), "UP" in flags,
                                    "LOWER_UP" in flags, "LOOPBACK" in flags, addrs)
    return out


class IfaceCache:
    """interfaces(), re-read at most every `ttl_s`: a responder answers many probes a second,
    and still sees an MTU or a link changed while it runs."""

    def __init__(self, ttl_s: float = 0.5):
        self._ttl = ttl_s
        self._at = -1e9
        self._ifaces: dict[str, Iface] = {}

    def get(self) -> dict[str, Iface]:
        if time.monotonic() - self._at > self._ttl:
            self._ifaces = interfaces()
            self._at = time.monotonic()
        return self._ifaces

    def holding(self, addr: str) -> Iface | None:
        return holder(self.get(), addr)

    def by_index(self, index: int) -> Iface | None:
        return next((i for i in self.get().values() if i.index == index), None)


def holder(ifaces: dict[str, Iface], addr: str) -> Iface | None:
    """The interface that has IPv4 address `addr` (on loopback, every address of its subnet:
    127.0.0.2 is as local as 127.0.0.1)."""
    exact = next((i for i in ifaces.values() if any(a == addr for a, _ in i.addrs)), None)
    if exact or not addr:
        return exact
    return next((i for i in ifaces.values() if i.loopback and i.network(addr)), None)


def route_dev(dst: str, src: str) -> str | None:
    """The interface the kernel sends dst's packets by when their source is src (as r2cc's
    sockets, bound to a rail's address and nothing else); None if there is no route."""
    routes = _ip_json("route", "get", dst, "from", src)
    return routes[0].get("dev") if routes else None


# Neighbour states in which the link layer answered: the peer's NIC is there.
RESOLVED = {"REACHABLE", "STALE", "DELAY", "PROBE", "PERMANENT", "NOARP"}


def neighbour_state(dst: str, dev: str) -> str | None:
    """The ARP state of dst on dev (REACHABLE, INCOMPLETE, FAILED, ...); None if no entry."""
    entries = _ip_json("neigh", "show", "to", dst, "dev", dev)
    if not entries:
        return None
    states = entries[0].get("state") or []
    return states[0] if states else None


def sysctl(name: str) -> str | None:
    """/proc/sys value of `name` (dots, e.g. net.core.wmem_max), whitespace folded; None if absent."""
    return _read_proc_sys(name.replace(".", "/"))


def conf(iface: str, key: str) -> str | None:
    """net.ipv4.conf.IFACE.KEY (iface "all" for the global one); a VLAN's name has a dot in it."""
    return _read_proc_sys(f"net/ipv4/conf/{iface}/{key}")


def _read_proc_sys(path: str) -> str | None:
    try:
        with open("/proc/sys/" + path) as f:
            return " ".join(f.read().split())
    except OSError:
        return None


NETNS_DIR = "/var/run/netns"


def enter_netns(name: str) -> None:
    """Move this thread into network namespace `name` (as `ip netns exec` would). Call it before
    starting threads: threads made afterwards start in the namespace of the thread making them."""
    path = os.path.join(NETNS_DIR, name)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise UserError(f"network namespace {name!r}: {exc.strerror} ({path}); is it up?") from None
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
            raise UserError(f"cannot enter network namespace {name!r}: "
                            f"{os.strerror(ctypes.get_errno())} (needs root)")
    finally:
        os.close(fd)


def netns_name() -> str | None:
    """The name of the namespace we are in, if it has one under /var/run/netns."""
    names = (_run_ip("netns", "identify") or "").split()
    return names[0] if names else None

