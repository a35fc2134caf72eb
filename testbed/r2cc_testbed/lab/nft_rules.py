"""The nftables rulesets of lab faults, written once for both fault executors (`nft` commands in
faults/lab_executor.py, open nftables contexts in faults/inprocess_executor.py).

Each fault is one table per host and rail (a lossy, gray or marginal rail: one at each end of
its link), so a fault is replaced or removed whole. Every script is one transaction: "add
table" first makes the delete valid whether or not the table exists, so putting a fault in
place and taking it away are both idempotent. The chains hook at priority -300 (before
conntrack) and accept by policy: only the rail's packets are touched.

Packet lengths: in a netdev ingress hook the kernel has already taken the Ethernet header off,
so `meta length` is the IP packet's length, headers included (measured on a lab veth: a UDP
datagram of 972 bytes, an IP packet of 1000 and an Ethernet frame of 1014, counts as 1000). A
veth hands TCP's segmentation-offload batches over whole (about 60 KB each under a bulk
transfer, measured), and nftables sees such a batch as one packet of that length: a gray rail
drops it whole, which is what a real link does to its segments only while BYTES is below the
rail MTU (check_below_mtu), and lossy and marginal draw once per batch.
"""

from __future__ import annotations

from r2cc_testbed.faults.model import SIZE_FAULTS
from r2cc_testbed.lab.layout import Layout
from r2cc_testbed.lab.netns import LabError

NFT_FAULTS = ("blackhole", "lossy") + SIZE_FAULTS  # the kinds fault_scripts puts in place


def fault_scripts(layout: Layout, fault, mtu: int | None = None) -> list[tuple[str, str]]:
    """(namespace, script) pairs that put one of NFT_FAULTS in place on fault.host's rail; with
    the lab's mtu, LabError for a gray or marginal size no packet on its rails exceeds.

    fault: a FaultSpec, or anything with its kind, host, rail, loss_pct, direction and max_bytes
    (the fault daemon's steps), so the lab and the daemon share this one mapping."""
    if fault.kind in SIZE_FAULTS and mtu is not None:
        check_below_mtu(fault.kind, fault.max_bytes, mtu)
    if fault.kind == "blackhole":
        return [(layout.host_ns(fault.host), blackhole_script(layout, fault.rail, on=True))]
    if fault.kind == "lossy":
        return lossy_scripts(layout, fault.host, fault.rail, fault.loss_pct)
    if fault.kind in SIZE_FAULTS:
        return size_scripts(layout, fault.kind, fault.host, fault.rail, fault.direction, fault.max_bytes,
                            fault.loss_pct)
    raise ValueError(f"{fault.kind} is not an nftables fault: those are {', '.join(NFT_FAULTS)}")


def blackhole_script(layout: Layout, rail: int, on: bool) -> str:
    """Drop every packet in and out of the host's rail (on), or remove that table (off)."""
    return _rail_table(layout.blackhole_table(rail), layout.rail_ifname(rail), "drop" if on else None)


def lossy_scripts(layout: Layout, host: int, rail: int, loss_pct: float | None) -> list[tuple[str, str]]:
    """(namespace, script) pairs that drop loss_pct percent of the IP packets crossing host's rail,
    each way, drawn at random (`numgen random mod 1000`: steps of 0.1%); None removes them.

    The drops happen where a packet arrives (an ingress hook at each end of the link), that is
    after its sender put it on the wire, as a bad cable or optic loses it: the sender's TCP
    retransmits and counts it. Dropping in the sender's own output hook instead is a local drop:
    TCP keeps the segment, counts no retransmission and tries again on a timer, which no real
    link does (and which the transport's loss detection cannot see).
    """
    verdict = None if loss_pct is None else " ".join(["meta protocol ip", *_random_share(loss_pct), "drop"])
    return _ingress_scripts(layout, "lossy", host, rail, verdict, "both")


def size_scripts(layout: Layout, kind: str, host: int, rail: int, direction: str | None,
                 max_bytes: int | None, loss_pct: float | None = None) -> list[tuple[str, str]]:
    """(namespace, script) pairs that drop the IP packets longer than max_bytes crossing host's
    rail in direction (both, out: what host sends, in: what arrives at host): every one (gray)
    or loss_pct percent of them at random (marginal). direction None removes them.

    Dropped where they arrive, as lossy_scripts does: `out` at the far end's ingress, `in` at
    the host's own. Both ends are written every time, so a new direction replaces the old one.
    """
    verdict = None
    if direction is not None:
        share = [] if loss_pct is None else _random_share(loss_pct)
        verdict = " ".join(["meta protocol ip", f"meta length > {max_bytes}", *share, "drop"])
    return _ingress_scripts(layout, kind, host, rail, verdict, direction)


def clear_scripts(layout: Layout, host: int, rail: int) -> list[tuple[str, str]]:
    """(namespace, script) pairs removing every nftables fault of host's rail: one script per
    namespace (blackhole, lossy, gray and marginal tables)."""
    pairs = [(layout.host_ns(host), blackhole_script(layout, rail, on=False)),
             *lossy_scripts(layout, host, rail, None),
             *(pair for kind in SIZE_FAULTS for pair in size_scripts(layout, kind, host, rail, None, None))]
    merged: dict[str, str] = {}
    for ns, script in pairs:
        merged[ns] = merged.get(ns, "") + script
    return list(merged.items())


def check_below_mtu(kind: str, max_bytes: int, mtu: int) -> None:
    """LabError unless some IP packet on a rail of this MTU can be longer than max_bytes.

    At or above the MTU a real rail would drop nothing, while the lab would still drop TCP's
    offload batches (see the module's docstring): refused rather than half done."""
    if max_bytes >= mtu:
        fix = "use BYTES below the MTU" if kind == "gray" else f"it needs a lab MTU above {max_bytes}"
        raise LabError(f"{kind} drops IP packets longer than {max_bytes} bytes, and the lab's rails "
                       f"(MTU {mtu}) carry none: {fix}")


def _random_share(loss_pct: float) -> list[str]:
    """The condition that holds for loss_pct percent of packets (none at 100%: every one)."""
    per_mille = round(loss_pct * 10)
    if not 1 <= per_mille <= 1000:
        raise ValueError(f"loss {loss_pct}% is outside 0.1..100")
    return [] if per_mille == 1000 else [f"numgen random mod 1000 < {per_mille}"]


def _ingress_scripts(layout: Layout, kind: str, host: int, rail: int, verdict: str | None,
                     direction: str | None) -> list[tuple[str, str]]:
    """The host's own ingress table (drops what arrives: in) and the far end's (drops what the
    host sends: out); each gets verdict when direction covers it, else is removed."""
    (host_ns, host_dev), (far_ns, far_dev) = layout.link_ends(host, rail)
    own = verdict if direction in ("both", "in") else None
    far = verdict if direction in ("both", "out") else None
    return [(host_ns, _ingress_table(layout.drop_table(kind, rail), host_dev, own)),
            (far_ns, _ingress_table(layout.drop_far_table(kind, host, rail), far_dev, far))]


def _ingress_table(table: str, dev: str, verdict: str | None) -> str:
    script = f"add table netdev {table}\ndelete table netdev {table}\n"
    if verdict:
        script += (f"table netdev {table} {{\n"
                   f"  chain ingress {{ type filter hook ingress device \"{dev}\" priority -300; policy accept; {verdict}; }}\n"
                   "}\n")
    return script


def _rail_table(table: str, dev: str, verdict: str | None) -> str:
    script = f"add table inet {table}\ndelete table inet {table}\n"
    if verdict:
        script += (f"table inet {table} {{\n"
                   f"  chain input {{ type filter hook input priority -300; policy accept; iifname \"{dev}\" {verdict}; }}\n"
                   f"  chain output {{ type filter hook output priority -300; policy accept; oifname \"{dev}\" {verdict}; }}\n"
                   "}\n")
    return script
