"""The nftables rulesets of lab faults, written once for both ways of applying them (`nft` in
lab/inject.py, and the fault daemon's open nftables contexts in loadtest/linkops.py).

Each fault is one table per host and rail, so a fault is replaced or removed whole. Every
script is one transaction: "add table" first makes the delete valid whether or not the table
exists, so putting a fault in place and taking it away are both idempotent. The chains hook at
priority -300 (before conntrack) and accept by policy: only the rail's packets are touched.
"""

from __future__ import annotations

from r2cc_serve.testbed.lab.layout import Layout


def blackhole_script(layout: Layout, rail: int, on: bool) -> str:
    """Drop every packet in and out of the host's rail (on), or remove that table (off)."""
    return _rail_table(layout.blackhole_table(rail), layout.rail_ifname(rail), "drop" if on else None)


def lossy_script(layout: Layout, rail: int, loss_pct: float | None) -> str:
    """Drop loss_pct percent of the packets in and out of the host's rail, each drawn at random
    (`numgen random mod 1000`: steps of 0.1%); None removes the table."""
    if loss_pct is None:
        return _rail_table(layout.lossy_table(rail), layout.rail_ifname(rail), None)
    per_mille = round(loss_pct * 10)
    if not 1 <= per_mille <= 1000:
        raise ValueError(f"loss {loss_pct}% is outside 0.1..100")
    return _rail_table(layout.lossy_table(rail), layout.rail_ifname(rail), f"numgen random mod 1000 < {per_mille} drop")


def clear_script(layout: Layout, rail: int) -> str:
    """Remove every nftables fault of the host's rail (blackhole and loss) in one transaction."""
    return blackhole_script(layout, rail, on=False) + lossy_script(layout, rail, None)


def _rail_table(table: str, dev: str, verdict: str | None) -> str:
    script = f"add table inet {table}\ndelete table inet {table}\n"
    if verdict:
        script += (f"table inet {table} {{\n"
                   f"  chain input {{ type filter hook input priority -300; policy accept; iifname \"{dev}\" {verdict}; }}\n"
                   f"  chain output {{ type filter hook output priority -300; policy accept; oifname \"{dev}\" {verdict}; }}\n"
                   "}\n")
    return script
