"""The doctor's verdicts from facts, without a network: each problem one line, naming the rail,
the peer, what is wrong and the fix."""

from __future__ import annotations

import pytest

from r2cc_serve.doctor import checks, report, settings
from r2cc_serve.doctor.checks import PairFacts, PairResult, Problem, Report
from r2cc_serve.doctor.netinfo import Iface
from r2cc_serve.doctor.probes import Reply, largest_passing
from r2cc_serve.doctor.rails import Peer, Rail

PEER = Peer("10.0.1.2", ("10.0.1.2", "10.0.2.2", "10.0.3.2"))


def iface(name, index, addr, plen=24, mtu=1500, up=True, carrier=True):
    return Iface(name, index, mtu, up, carrier, False, ((addr, plen),) if addr else ())


def rail(k, mtu=1500, **kw):
    return Rail(k, f"eth{k + 1}", f"10.0.{k + 1}.1", iface(f"eth{k + 1}", k + 2, f"10.0.{k + 1}.1", mtu=mtu, **kw))


def reply(arrived="eth3", holder="eth3", mtu=1500, here=4):
    return Reply({"arrived": arrived, "holder": holder, "mtu": mtu, "holder_mtu": mtu}, here, 256)


def healthy(k=2, **kw) -> PairFacts:
    f = PairFacts(rail(k), PEER.addrs[k], 29640, hello={"rails": ["eth1", "eth2", "eth3"], "route_dev": f"eth{k + 1}"},
                  route_dev=f"eth{k + 1}", routed=reply(f"eth{k + 1}", f"eth{k + 1}"), routed_here=f"eth{k + 1}",
                  pinned=reply(f"eth{k + 1}", f"eth{k + 1}"), arp="REACHABLE")
    for key, value in kw.items():
        setattr(f, key, value)
    return f


def one_line(problems: list[Problem]) -> str:
    assert len(problems) == 1, [p.line() for p in problems]
    line = problems[0].line()
    assert "\n" not in line and "; fix: " in line
    return line


def test_a_healthy_pair_is_ok_everywhere():
    cells, problems = checks.judge_pair(healthy())
    assert cells == {"port": "ok", "path": "ok", "mtu": "1500"} and problems == []


def test_our_route_sends_the_rail_out_of_another_nic():
    f = healthy(route_dev="eth1", routed=reply("eth1", "eth3"))
    cells, problems = checks.judge_pair(f)
    line = one_line(problems)
    assert cells["path"] == "WRONG NIC"
    assert line.startswith("rail 2 -> 10.0.3.2: packets from 10.0.3.1 leave by eth1, not eth3")
    assert "ip rule add from 10.0.3.1 table 102; ip route add 10.0.3.0/24 dev eth3 src 10.0.3.1 table 102" in line


def test_the_peer_answers_arp_on_another_nic():
    line = one_line(checks.judge_path(healthy(routed=reply("eth1", "eth3"))))
    assert "reach the peer by its eth1, not eth3" in line and "on the peer: sysctl -w" in line
    assert "arp_ignore=1" in line and "arp_announce=2" in line


def test_the_peer_routes_its_replies_out_of_another_nic():
    f = healthy(routed_here="eth1", hello={"rails": ["eth1", "eth2", "eth3"], "route_dev": "eth1"})
    line = one_line(checks.judge_path(f))
    assert "the peer sends to 10.0.3.1 by its eth1, not eth3" in line
    assert "on the peer, `ip route get 10.0.3.1 from 10.0.3.2` must say dev eth3" in line


def test_replies_cross_by_another_nic_here_because_of_our_arp():
    line = one_line(checks.judge_path(healthy(routed_here="eth1")))
    assert "this host answers ARP for 10.0.3.1 on another NIC" in line and "here: sysctl -w" in line


def test_routed_probes_lost_while_pinned_ones_pass_name_the_route():
    line = one_line(checks.judge_path(healthy(routed=None, routed_error="timeout", route_dev="eth0")))
    assert "routed as r2cc sends get no answer (timeout)" in line and "the kernel sends them by eth0" in line


def test_mtu_mismatch_names_both_ends_and_the_largest_that_crossed():
    f = healthy(pinned=reply(mtu=1400), out_largest=1404)
    cells, problems = checks.judge_pair(f)
    line = one_line(problems)
    assert cells["mtu"] == "1500/1400"
    assert "MTU differs: eth3 1500 here, eth3 1400 on the peer" in line
    assert "1500-byte packets from here are lost, the largest that crossed is 1404" in line
    assert "`ip link set dev eth3 mtu 1400` here, or `ip link set dev eth3 mtu 1500` on the peer" in line


def test_equal_mtus_with_a_smaller_one_between():
    cells, problems = checks.judge_pair(healthy(out_largest=1400, back_largest=1400))
    line = one_line(problems)
    assert cells["mtu"] == "1500 lost" and "a switch or port between has a smaller MTU" in line
    assert "`ip link set dev eth3 mtu 1400`" in line


@pytest.mark.parametrize("facts, words", [
    (dict(tcp="refused", routed_error="refused"), "nothing listens on 10.0.3.2:29640 (connection refused)"),
    (dict(tcp="timeout", routed_error="timeout", arp="REACHABLE"), "answers ARP on eth3 but port 29640 times out"),
    (dict(tcp="timeout", routed_error="timeout", arp="FAILED"), "not even to ARP"),
    (dict(tcp="unreachable", tcp_detail="tcp x: No route to host", arp=None), "unreachable from 10.0.3.1 (No route to host)"),
    (dict(tcp="blocked"), "this host's firewall stops packets"),
])
def test_silent_pairs_say_why(facts, words):
    f = healthy(hello=None, routed=None, pinned=None, routed_here=None, **facts)
    cells, problems = checks.judge_pair(f)
    assert words in one_line(problems) and cells["path"] == "-"


def test_tcp_blocked_while_udp_answers_and_the_reverse():
    line = one_line(checks.judge_pair(healthy(tcp="timeout", hello=None))[1])
    assert "tcp/29640 to 10.0.3.2: timeout while udp/29640 answers" in line
    cells, problems = checks.judge_pair(healthy(routed=None, pinned=None, routed_error="timeout"))
    assert cells["path"] == "udp blocked" and "a firewall drops UDP" in one_line(problems)


def test_a_peer_silent_on_every_rail_is_one_line():
    refused = [healthy(k, tcp="refused", routed_error="refused", routed=None, pinned=None, hello=None) for k in range(3)]
    line = checks.judge_peer(PEER, refused, 29640).line()
    assert line == ("peer 10.0.1.2: not answering on port 29640 (connection refused on every rail); "
                    "fix: start `r2cc doctor --serve` there")
    silent = [healthy(k, tcp="timeout", routed=None, pinned=None, hello=None, arp="STALE") for k in range(3)]
    assert "timed out" in checks.judge_peer(PEER, silent, 29640).what
    assert checks.judge_peer(PEER, [refused[0], healthy(1)], 29640) is None  # one rail answers: per rail


def test_own_rail_link_state_and_shared_nic():
    rails = [rail(0), rail(1, up=False), rail(2, carrier=False)]
    rails.append(Rail(3, "eth1", "10.0.9.1", rails[0].iface))
    problems, skip = checks.judge_rails(rails)
    lines = [p.line() for p in problems]
    assert skip == {1: "link down here", 2: "no carrier"}
    assert lines[0] == "rail 1 (eth2 10.0.2.1): link is down here; fix: `ip link set dev eth2 up`"
    assert lines[1].startswith("rail 2 (eth3 10.0.3.1): no carrier")
    assert lines[2].startswith("rails 0,3: all on eth1: one NIC failing takes them all")


def test_slow_rail_against_its_siblings_median():
    assert checks.slow_rails({0: 940, 1: 950, 2: 300, 3: 945}) == {2: 945}
    assert checks.slow_rails({0: 940, 1: 700, 2: 600, 3: 945}) == {}
    assert checks.slow_rails({0: 940}) == {}
    line = checks.judge_slow(healthy(mbit_out=300.0, mbit_in=940.0), 945, None).line()
    assert line.startswith("rail 2 -> 10.0.3.2: 300 Mbit/s to the peer (its sibling rails: 945): under half of")
    assert "ethtool eth3" in line
    both = checks.judge_slow(healthy(mbit_out=300.0, mbit_in=290.0), 945, 950).what
    assert both == ("300 Mbit/s to the peer (its sibling rails: 945) and 290 Mbit/s from the peer "
                    "(its sibling rails: 950): under half of its siblings")


def test_largest_passing_finds_the_edge_in_a_few_rounds():
    rounds = []

    def passes(sizes):
        rounds.append(sizes)
        return {s for s in sizes if s <= 1404}

    assert largest_passing(passes, 256, 1500) == 1404
    assert len(rounds) <= 5 and all(len(r) <= 8 for r in rounds)
    assert largest_passing(lambda s: set(), 256, 1500) == 256


def test_shared_subnet_only_across_nics():
    a, b = iface("eth1", 2, "10.0.1.1"), iface("eth2", 3, "10.0.1.11")
    assert checks.shared_subnet([("10.0.1.1", a), ("10.0.1.11", b)])
    assert not checks.shared_subnet([("10.0.1.1", a), ("10.0.2.1", iface("eth2", 3, "10.0.2.1"))])


def values() -> dict:
    base = {"net.core.wmem_max": "4194304", "net.ipv4.tcp_rmem": "4096 131072 6291456",
            "net.ipv4.tcp_window_scaling": "1", "net.ipv4.tcp_sack": "1"}
    conf = {d: {"rp_filter": "0", "arp_ignore": "0", "arp_announce": "0"} for d in ("all", "eth1", "eth2")}
    return {"sysctl": base, "conf": conf}


def problems_of(rows):
    return {s.name: s for s in rows if s.verdict == "problem"}


def test_settings_healthy_and_each_problem_with_its_fix():
    assert problems_of(settings.judge(values(), ["eth1", "eth2"], shared_subnet=False)) == {}
    v = values()
    v["sysctl"].update({"net.core.wmem_max": "212992", "net.ipv4.tcp_window_scaling": "0",
                        "net.ipv4.tcp_rmem": "4096 131072 1048576"})
    bad = problems_of(settings.judge(v, ["eth1", "eth2"], shared_subnet=False))
    assert set(bad) == {"net.core.wmem_max", "net.ipv4.tcp_window_scaling", "net.ipv4.tcp_rmem"}
    assert bad["net.core.wmem_max"].fix.startswith("sysctl -w net.core.wmem_max=4194304")
    assert "4096 131072 6291456" in bad["net.ipv4.tcp_rmem"].fix


def test_arp_and_rp_filter_matter_only_when_rails_share_a_subnet():
    v = values()
    v["conf"]["eth2"]["rp_filter"] = "1"
    assert problems_of(settings.judge(v, ["eth1", "eth2"], shared_subnet=False)) == {}
    bad = problems_of(settings.judge(v, ["eth1", "eth2"], shared_subnet=True))
    assert set(bad) == {"rp_filter (rails)", "arp_ignore/arp_announce (rails)"}
    assert "net.ipv4.conf.eth2.rp_filter=2" in bad["rp_filter (rails)"].fix
    for dev in ("all", "eth1", "eth2"):  # the kernel takes the larger of conf/all and conf/DEV
        v["conf"][dev].update(rp_filter="2")
    v["conf"]["all"].update(arp_ignore="1", arp_announce="2")
    rows = settings.judge(v, ["eth1", "eth2"], shared_subnet=True)
    assert problems_of(rows) == {} and {s.name: s.value for s in rows}["arp_ignore/arp_announce (rails)"] == "1/2"


def make_report(problems=()) -> Report:
    rails = [rail(0), rail(1)]
    peer = Peer("10.0.1.2", ("10.0.1.2", "10.0.2.2"))
    pairs = [PairResult(peer, healthy(k, dst=peer.addrs[k]), {"port": "ok", "path": "ok", "mtu": "1500",
                                                             "bandwidth": "941 / 940"}) for k in (0, 1)]
    rows = settings.judge(values(), ["eth1", "eth2"], False)
    return Report("node-a", 29640, rails, [peer], pairs, {"here": rows, "10.0.1.2": rows}, list(problems), 2.5)


def test_report_healthy_exits_0_and_lists_every_pair():
    r = make_report()
    text = report.render(r)
    assert r.exit_code == 0 and text.endswith("r2cc doctor: every check ok (exit 0)")
    assert "0     eth1 10.0.1.1  10.0.1.2  ok    ok    1500  941 / 940" in text
    assert "net.core.wmem_max" in text and "PROBLEM" not in text


def test_report_with_problems_exits_1_one_line_each():
    r = make_report([Problem("rail 1 -> 10.0.2.2", "MTU differs", "ip link set dev eth2 mtu 1500")])
    text = report.render(r)
    assert r.exit_code == 1
    assert "  rail 1 -> 10.0.2.2: MTU differs; fix: ip link set dev eth2 mtu 1500" in text.splitlines()
    assert text.endswith("r2cc doctor: 1 problem(s) (exit 1)")
    assert report.as_json(r)["problems"] == ["rail 1 -> 10.0.2.2: MTU differs; fix: ip link set dev eth2 mtu 1500"]
