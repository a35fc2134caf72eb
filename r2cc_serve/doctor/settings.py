"""The kernel settings r2cc relies on: read on each host, judged the same way for every host.

A responder reads its own (collect) and sends them to the checker, which judges them beside its
own, so one run of `r2cc doctor` covers both ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from r2cc_serve.doctor import netinfo

SEND_BUFFER_BYTES = 4 << 20  # the send buffer r2cc asks for on every rail (csrc/net.h kSendBufferBytes)
PERSIST = "persist it in /etc/sysctl.d/90-r2cc.conf"

GLOBAL = ("net.core.wmem_max", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_window_scaling",
          "net.ipv4.tcp_sack", "net.ipv4.tcp_congestion_control", "net.ipv4.tcp_slow_start_after_idle",
          "net.ipv4.tcp_mtu_probing", "net.ipv4.ip_local_port_range", "net.mptcp.enabled")
PER_RAIL = ("rp_filter", "arp_ignore", "arp_announce")
# Shown for the record; r2cc works with any value (its heartbeats keep a rail from idling, its
# listening ports come from ip_local_port_range, MPTCP is not used by its TCP sockets).
INFO_ONLY = ("net.ipv4.tcp_wmem", "net.ipv4.tcp_congestion_control", "net.ipv4.tcp_slow_start_after_idle",
             "net.ipv4.tcp_mtu_probing", "net.ipv4.ip_local_port_range", "net.mptcp.enabled")


def collect(rail_ifnames: list[str]) -> dict:
    """This host's values: {"sysctl": {name: value}, "conf": {iface or "all": {key: value}}}."""
    return {"sysctl": {name: netinfo.sysctl(name) for name in GLOBAL},
            "conf": {dev: {key: netinfo.conf(dev, key) for key in PER_RAIL} for dev in ("all", *rail_ifnames)}}


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    verdict: str      # ok | problem | info
    what: str = ""    # for a problem: what is wrong, and the fix
    fix: str = ""


def judge(values: dict, rail_ifnames: list[str], shared_subnet: bool) -> list[Setting]:
    """Every setting of one host with its verdict. shared_subnet: two of the host's rails (on
    different NICs) are in one IPv4 subnet, where ARP and reverse-path checks need care."""
    sysctl = values.get("sysctl", {})
    out = [_wmem_max(sysctl.get("net.core.wmem_max")), _rmem(sysctl.get("net.ipv4.tcp_rmem")),
           _must_be_on("net.ipv4.tcp_window_scaling", sysctl.get("net.ipv4.tcp_window_scaling"),
                       "without window scaling a rail never has more than 64 KiB in flight"),
           _must_be_on("net.ipv4.tcp_sack", sysctl.get("net.ipv4.tcp_sack"),
                       "without SACK a lossy rail recovers one lost segment per round trip")]
    out += [Setting(name, _shown(sysctl.get(name)), "info") for name in INFO_ONLY]
    out += _per_rail(values.get("conf", {}), rail_ifnames, shared_subnet)
    return out


def _shown(value: str | None) -> str:
    return "n/a" if value is None else value


def _int(value: str | None, field: int = 0) -> int | None:
    try:
        return int(value.split()[field]) if value else None
    except (ValueError, IndexError):
        return None


def _wmem_max(value: str | None) -> Setting:
    name = "net.core.wmem_max"
    got = _int(value)
    if got is None or got >= SEND_BUFFER_BYTES:
        return Setting(name, _shown(value), "ok" if got else "info")
    return Setting(name, value, "problem",
                   f"{name} is {got}, below the 4 MiB send buffer r2cc asks for on each rail "
                   "(a process without CAP_NET_ADMIN gets at most this)",
                   f"sysctl -w {name}={SEND_BUFFER_BYTES} ({PERSIST})")


def _rmem(value: str | None) -> Setting:
    name = "net.ipv4.tcp_rmem"
    top = _int(value, 2)
    if top is None or top >= SEND_BUFFER_BYTES:
        return Setting(name, _shown(value), "ok" if top else "info")
    low, default = (value.split() + ["4096", "131072"])[:2]
    return Setting(name, value, "problem",
                   f"{name} caps a receive window at {top} bytes, below the 4 MiB r2cc sends into",
                   f"sysctl -w {name}='{low} {default} 6291456' ({PERSIST})")


def _must_be_on(name: str, value: str | None, why: str) -> Setting:
    if value is None or value == "1":
        return Setting(name, _shown(value), "ok" if value else "info")
    return Setting(name, value, "problem", f"{name} is {value}: {why}", f"sysctl -w {name}=1 ({PERSIST})")


def _effective(conf: dict, dev: str, key: str) -> int | None:
    """The kernel applies the larger of conf/all and conf/DEV for these three."""
    got = [_int((conf.get(d) or {}).get(key)) for d in ("all", dev)]
    return max(got) if None not in got else None


def _per_rail(conf: dict, rail_ifnames: list[str], shared: bool) -> list[Setting]:
    values = {key: {dev: _effective(conf, dev, key) for dev in rail_ifnames} for key in PER_RAIL}

    def shown(*keys: str) -> str:
        per_dev = {dev: "/".join("n/a" if values[k][dev] is None else str(values[k][dev]) for k in keys)
                   for dev in rail_ifnames}
        if len(set(per_dev.values())) == 1:
            return next(iter(per_dev.values()))
        return " ".join(f"{dev}={v}" for dev, v in per_dev.items())

    rp = Setting("rp_filter (rails)", shown("rp_filter"), "ok")
    arp = Setting("arp_ignore/arp_announce (rails)", shown("arp_ignore", "arp_announce"), "ok")
    if not shared:  # one subnet per rail: only that subnet's NIC answers ARP for its address
        return [rp, arp]
    strict = [d for d, v in values["rp_filter"].items() if v == 1]
    if strict:
        rp = Setting(rp.name, rp.value, "problem",
                     f"strict rp_filter on rails that share a subnet drops what arrives by another rail's NIC "
                     f"({','.join(strict)})",
                     "sysctl -w net.ipv4.conf.all.rp_filter=2 "
                     + " ".join(f"net.ipv4.conf.{d}.rp_filter=2" for d in strict) + f" ({PERSIST})")
    loose = [d for d in rail_ifnames
             if (values["arp_ignore"][d] or 0) < 1 or (values["arp_announce"][d] or 0) < 2]
    if loose:
        arp = Setting(arp.name, arp.value, "problem",
                      f"rails share a subnet and {','.join(loose)} answer ARP for any of this host's addresses: "
                      "a rail's packets can cross by another NIC",
                      "sysctl -w net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 "
                      f"({PERSIST}), and a routing table per rail")
    return [rp, arp]
