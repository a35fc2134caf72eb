"""The nftables rulesets of lab faults, written once for both ways of applying them (`nft` in
lab/inject.py, and the fault daemon's open nftables contexts in loadtest/linkops.py).

Each fault is one table per host and rail (a lossy rail: one at each end of its link), so a
fault is replaced or removed whole. Every script is one transaction: "add table" first makes
the delete valid whether or not the table exists, so putting a fault in place and taking it
away are both idempotent. The chains hook at priority -300 (before conntrack) and accept by
policy: only the rail's packets are touched.
"""

from __future__ import annotations

from r2cc_serve.testbed.lab.layout import Layout


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
    verdict = None
    if loss_pct is not None:
        per_mille = round(loss_pct * 10)
        if not 1 <= per_mille <= 1000:
            raise ValueError(f"loss {loss_pct}% is outside 0.1..100")
        verdict = f"meta protocol ip numgen random mod 1000 < {per_mille} drop"
    (host_ns, host_dev), (far_ns, far_dev) = layout.link_ends(host, rail)
    return [(host_ns, _ingress_table(layout.lossy_table(rail), host_dev, verdict)),
            (far_ns, _ingress_table(layout.lossy_far_table(host, rail), far_dev, verdict))]


def clear_scripts(layout: Layout, host: int, rail: int) -> list[tuple[str, str]]:
    """(namespace, script) pairs removing every nftables fault of host's rail (blackhole and loss)."""
    pairs = lossy_scripts(layout, host, rail, None)
    return [(pairs[0][0], blackhole_script(layout, rail, on=False) + pairs[0][1]), pairs[1]]


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
