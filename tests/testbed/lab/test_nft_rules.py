"""The nftables scripts of lab faults (testbed/r2cc_testbed/lab/nft_rules.py), as text: no root needed."""

from __future__ import annotations

import pytest

from r2cc_testbed.faults.model import FaultSpec, parse_fault_text
from r2cc_testbed.lab.layout import Layout
from r2cc_testbed.lab.netns import LabError
from r2cc_testbed.lab.nft_rules import check_below_mtu, clear_scripts, fault_scripts

DIRECT = Layout("r2ccgy", 2, 4)    # two hosts: the far end of a rail is the peer host
SWITCHED = Layout("r2ccgy", 3, 4)  # three: the far end is the host's port on the switch


def drops(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """namespace -> the rules of the ingress chains its scripts put in place."""
    out: dict[str, list[str]] = {}
    for ns, script in pairs:
        out.setdefault(ns, []).extend(line.split("policy accept; ", 1)[1].rstrip("; }")
                                      for line in script.splitlines() if "hook ingress" in line)
    return out


@pytest.mark.parametrize("notation, at_host, at_peer", [
    ("h0:1:gray", ["meta protocol ip meta length > 1000 drop"], ["meta protocol ip meta length > 1000 drop"]),
    ("h0:1:gray:out", [], ["meta protocol ip meta length > 1000 drop"]),
    ("h0:1:gray:in:600", ["meta protocol ip meta length > 600 drop"], []),
    ("h0:1:marginal:90", ["meta protocol ip meta length > 1000 numgen random mod 1000 < 900 drop"],
     ["meta protocol ip meta length > 1000 numgen random mod 1000 < 900 drop"]),
    ("h0:1:marginal:0.5:out", [], ["meta protocol ip meta length > 1000 numgen random mod 1000 < 5 drop"]),
    ("h0:1:marginal:100:in", ["meta protocol ip meta length > 1000 drop"], []),  # numgen takes no 1000
])
def test_gray_and_marginal_drop_where_packets_arrive_in_the_direction_asked(notation, at_host, at_peer):
    """out: the far end's ingress (what the host sends); in: the host's own (what reaches it)."""
    pairs = fault_scripts(DIRECT, parse_fault_text(notation))
    assert [ns for ns, _ in pairs] == ["r2ccgy-h0", "r2ccgy-h1"]
    assert drops(pairs) == {"r2ccgy-h0": at_host, "r2ccgy-h1": at_peer}
    kind = notation.split(":")[2]
    own, far = (script for _, script in pairs)
    # Both ends are written every time: the end a direction leaves out is removed, so a new
    # direction replaces the old one, and applying one twice changes nothing.
    assert own.startswith(f"add table netdev r2ccgy_{kind}_rail1\ndelete table netdev r2ccgy_{kind}_rail1\n")
    assert far.startswith(f"add table netdev r2ccgy_{kind}_h0_rail1\ndelete table netdev r2ccgy_{kind}_h0_rail1\n")
    assert all('device "rail1"' in s for s in (own, far) if "hook" in s)


def test_on_a_switch_the_far_end_is_the_hosts_port():
    pairs = fault_scripts(SWITCHED, parse_fault_text("h2:3:gray:out:600"))
    assert drops(pairs) == {"r2ccgy-h2": [], "r2ccgy-sw": ["meta protocol ip meta length > 600 drop"]}
    assert 'device "h2r3"' in pairs[1][1]


def test_blackhole_and_lossy_keep_their_tables():
    [(ns, script)] = fault_scripts(DIRECT, FaultSpec("blackhole", 1, 2))
    assert ns == "r2ccgy-h1" and "table inet r2ccgy_blackhole_rail2" in script and 'oifname "rail2" drop' in script
    lossy = fault_scripts(DIRECT, parse_fault_text("h0:1:lossy:1"))
    assert drops(lossy) == {"r2ccgy-h0": ["meta protocol ip numgen random mod 1000 < 10 drop"],
                            "r2ccgy-h1": ["meta protocol ip numgen random mod 1000 < 10 drop"]}
    assert drops(fault_scripts(DIRECT, parse_fault_text("h0:1:lossy:100")))["r2ccgy-h0"] == ["meta protocol ip drop"]
    with pytest.raises(ValueError, match="not an nftables fault"):
        fault_scripts(DIRECT, FaultSpec("down", 0, 1))


def test_clear_removes_every_nftables_fault_of_the_rail_one_script_per_namespace():
    pairs = clear_scripts(DIRECT, 0, 1)
    assert [ns for ns, _ in pairs] == ["r2ccgy-h0", "r2ccgy-h1"]
    own, far = (script for _, script in pairs)
    assert "hook" not in own + far, "clear only deletes"
    for table in ("inet r2ccgy_blackhole_rail1", "netdev r2ccgy_lossy_rail1", "netdev r2ccgy_gray_rail1",
                  "netdev r2ccgy_marginal_rail1"):
        assert f"delete table {table}\n" in own
    for table in ("lossy", "gray", "marginal"):
        assert f"delete table netdev r2ccgy_{table}_h0_rail1\n" in far
    assert [ns for ns, _ in clear_scripts(SWITCHED, 2, 0)] == ["r2ccgy-h2", "r2ccgy-sw"]


def test_a_size_at_or_above_the_mtu_is_refused():
    check_below_mtu("gray", 1499, 1500)
    check_below_mtu("marginal", 1000, 9000)
    with pytest.raises(LabError, match=r"^gray drops IP packets longer than 1500 bytes, and the lab's rails \(MTU 1500\) "
                                       "carry none: use BYTES below the MTU$"):
        check_below_mtu("gray", 1500, 1500)
    with pytest.raises(LabError, match="marginal .* it needs a lab MTU above 1000$"):
        check_below_mtu("marginal", 1000, 1000)
    assert fault_scripts(DIRECT, parse_fault_text("h0:1:gray:1499"), mtu=1500)
    with pytest.raises(LabError, match="gray drops IP packets longer than 1500 bytes"):
        fault_scripts(DIRECT, parse_fault_text("h0:1:gray:1500"), mtu=1500)
