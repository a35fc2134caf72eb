"""RDMA devices as r2cc sees them: ports, their states and the IPv4 addresses their RoCE GIDs
carry. Read from sysfs (/sys/class/infiniband), which every RDMA host has; `port_attrs` asks
the device itself through pyverbs (Debian: python3-pyverbs) where that is installed.

A rail on RDMA is named `rdma:<interface or IPv4>` or `<device>:<port>` (e.g. `rxe0:1`,
`mlx5_0:1`); either way the transport finds the port by the IPv4 GID (csrc/verbs/device.cc).
"""

from __future__ import annotations

import ipaddress
import os
import sys
from dataclasses import dataclass, field

SYSFS = "/sys/class/infiniband"
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    type: str            # "RoCE v2", "RoCE v1" or "IB"
    ipv4: str | None     # the address an IPv4-mapped GID carries
    netdev: str | None


@dataclass(frozen=True)
class Port:
    device: str
    port: int
    state: str           # "ACTIVE", "DOWN", ...
    link_layer: str      # "Ethernet" (RoCE) or "InfiniBand"
    mtu: str | None      # active MTU, from pyverbs when it is installed
    gids: tuple[Gid, ...] = field(default_factory=tuple)

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"

    def roce_v2_ipv4(self) -> str | None:
        """The first IPv4 address of a RoCE v2 GID: what the transport dials."""
        return next((g.ipv4 for g in self.gids if g.ipv4 and g.type == "RoCE v2"), None)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _ipv4_of_gid(gid: str) -> str | None:
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped else None


def _gids(device: str, port: int) -> tuple[Gid, ...]:
    base = f"{SYSFS}/{device}/ports/{port}"
    out = []
    names = os.listdir(f"{base}/gids") if os.path.isdir(f"{base}/gids") else []
    for name in sorted(names, key=lambda n: int(n) if n.isdigit() else 0):
        gid = _read(f"{base}/gids/{name}")
        if not gid or gid == _ZERO_GID:
            continue
        out.append(Gid(int(name), gid, _read(f"{base}/gid_attrs/types/{name}"), _ipv4_of_gid(gid),
                       _read(f"{base}/gid_attrs/ndevs/{name}") or None))
    return tuple(out)


def list_ports() -> list[Port]:
    """Every port of every RDMA device on this host; [] when there is none (or no RDMA stack)."""
    if not os.path.isdir(SYSFS):
        return []
    ports = []
    for device in sorted(os.listdir(SYSFS)):
        pdir = f"{SYSFS}/{device}/ports"
        for p in sorted(os.listdir(pdir) if os.path.isdir(pdir) else [], key=int):
            state = _read(f"{pdir}/{p}/state")  # e.g. "4: ACTIVE"
            ports.append(Port(device, int(p), state.split(":")[-1].strip() or "?",
                              _read(f"{pdir}/{p}/link_layer") or "?", port_attrs(device, int(p)).get("mtu"),
                              _gids(device, int(p))))
    return ports


def port_attrs(device: str, port: int) -> dict:
    """What the device itself says of the port through pyverbs ({} without pyverbs)."""
    Context = _pyverbs_context()
    if Context is None:
        return {}
    try:
        with Context(name=device) as ctx:
            attr = ctx.query_port(port)
            return {"mtu": str(128 << int(attr.active_mtu)), "state": int(attr.state),
                    "gid_table": int(attr.gid_tbl_len)}
    except Exception:  # a device that went away between listing and opening
        return {}


def _pyverbs_context():
    """pyverbs' device Context, or None. Debian's python3-pyverbs sits in the system Python's
    dist-packages; a Python of the same version elsewhere (pyenv, a venv) may use it from there."""
    try:
        from pyverbs.device import Context
        return Context
    except ImportError:
        pass
    dist = "/usr/lib/python3/dist-packages"
    if os.path.isdir(f"{dist}/pyverbs") and dist not in sys.path:
        sys.path.append(dist)  # last: nothing the running Python has is shadowed
        try:
            from pyverbs.device import Context
            return Context
        except ImportError:
            return None
    return None


def find_port(name: str) -> Port | None:
    """The port named `device:port`, or None when there is no such RDMA device."""
    device, _, port = name.rpartition(":")
    if not device or not port.isdigit() or not os.path.isdir(f"{SYSFS}/{device}"):
        return None
    return next((p for p in list_ports() if p.device == device and p.port == int(port)), None)
