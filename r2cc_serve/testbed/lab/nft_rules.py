"""The nftables rulesets of lab faults, written once for both ways of applying them (`nft` in
lab/inject.py, and the fault daemon's open nftables contexts in loadtest/linkops.py)."""

from __future__ import annotations

from r2cc_serve.testbed.lab.layout import Layout


def blackhole_script(layout: Layout, rail: int, on: bool) -> str:
    """Drop every packet in and out of the host's rail (on), or remove that table (off).

    One transaction either way: "add table" first makes the delete valid whether or not the
    table exists, so both directions are idempotent. Priority -300 runs before conntrack, and
    the explicit accept policy keeps the chains from dropping anything but the rail's packets.
    """
    table, dev = layout.blackhole_table(rail), layout.rail_ifname(rail)
    script = f"add table inet {table}\ndelete table inet {table}\n"
    if on:
        script += (f"table inet {table} {{\n"
                   f"  chain input {{ type filter hook input priority -300; policy accept; iifname \"{dev}\" drop; }}\n"
                   f"  chain output {{ type filter hook output priority -300; policy accept; oifname \"{dev}\" drop; }}\n"
                   "}\n")
    return script
