"""The fault daemon against the real kernel (root, no vLLM): every lab kind lands on time.

Own lab prefix (r2ccld) so it runs beside the other test labs.
"""

from __future__ import annotations

import time

import pytest

from r2cc_testbed.faults.model import FaultSchedule
from r2cc_testbed.lab import netns
from r2cc_testbed.lab.layout import Layout

pytestmark = [pytest.mark.lab, pytest.mark.timeout(240), pytest.mark.requires("root", "ip", "tc", "nft")]

PREFIX = "r2ccld"


def _link_state(lab, host: int, rail: int) -> str:
    (link,) = netns.ip_json(lab.host_ns(host), "link", "show", "dev", lab.rail_ifname(rail))
    return "UP" if "UP" in link["flags"] else "DOWN"


def test_schedule_lands_on_time_and_leaves_nothing(monkeypatch):
    from r2cc_testbed.loadtest.controller import FaultController
    from r2cc_testbed.lab.session import lab_session

    monkeypatch.setenv("R2CC_LAB_STATE", f"/run/r2cc-lab/{PREFIX}-state.json")
    sched = FaultSchedule.parse([
        {"at": 0.2, "do": "h0:1:down"}, {"at": 0.5, "do": "h0:1:up"},
        {"at": 0.6, "do": "h0:2:blackhole"}, {"at": 0.8, "do": "h0:2:clear"},
        {"at": 0.9, "do": "h1:3:degrade:250mbit"}, {"at": 1.2, "do": "h1:3:clear"},
        {"at": 1.3, "do": "h0:0:flap:100:4"}, {"at": 1.8, "do": "h1:all-down"},
        {"at": 2.0, "do": "h1:0:up"}, {"at": 2.0, "do": "h1:1:up"}, {"at": 2.0, "do": "h1:2:up"},
        {"at": 2.0, "do": "h1:3:up"},
        # a host at half bandwidth: four rate changes due at once (a tc process each took 180 ms here)
        *[{"at": 2.2, "do": f"h0:{k}:degrade:500mbit"} for k in range(4)],
        *[{"at": 2.5, "do": f"h0:{k}:clear"} for k in range(4)],
        {"at": 2.6, "do": "h1:2:lossy:5"}, {"at": 3.0, "do": "h1:2:clear"},
        {"at": 3.1, "do": "h0:3:gray:out:600"}, {"at": 3.2, "do": "h1:0:marginal:5:in"},
        {"at": 4.0, "do": "h0:3:clear"}, {"at": 4.0, "do": "h1:0:clear"}])
    with lab_session(2, 4, "1gbit", prefix=PREFIX, state=f"/run/r2cc-lab/{PREFIX}-state.json") as lab:
        with FaultController(lab) as ctl:
            assert ctl.priority.startswith("SCHED_FIFO")
            t0 = time.monotonic() + 0.2
            ctl.play(t0, sched)
            time.sleep(t0 + 0.35 - time.monotonic())
            assert _link_state(lab, 0, 1) == "DOWN"
            time.sleep(t0 + 0.7 - time.monotonic())
            tables = netns.nft_tables(lab.host_ns(0))
            assert any(name.endswith("blackhole_rail2") for _, name in tables), tables
            time.sleep(t0 + 1.0 - time.monotonic())
            assert "250Mbit" in netns.tc(lab.host_ns(1), "qdisc", "show", "dev", "rail3")
            time.sleep(t0 + 2.35 - time.monotonic())
            assert all("500Mbit" in netns.tc(lab.host_ns(0), "qdisc", "show", "dev", f"rail{k}") for k in range(4))
            time.sleep(t0 + 2.8 - time.monotonic())
            tables = netns.nft_tables(lab.host_ns(1))
            assert any(name.endswith("lossy_rail2") for _, name in tables), tables
            far = netns.nft_tables(lab.host_ns(0))  # the far end of h1's rail 2 drops too
            assert any(name.endswith("lossy_h1_rail2") for _, name in far), far
            time.sleep(t0 + 3.35 - time.monotonic())
            peer = [name for _, name in netns.nft_tables(lab.host_ns(1))]
            assert "r2ccld_gray_h0_rail3" in peer and "r2ccld_marginal_rail0" in peer, peer  # out: h1's ingress
            links = {(x["host"], x["rail"]): x for x in lab.status()["links"]}  # read before the clears at 4.0
            assert links[0, 3]["gray"] == "out" and links[1, 0]["marginal"] == "in"
            steps, outcome = ctl.wait(10)
        assert outcome == "finished" and not [s for s in steps if s["error"]]
        assert len(steps) == 2 + 2 + 2 + 8 + 1 + 4 + 8 + 2 + 4
        # the target: every step in effect within 100 ms of its time (on an idle box far less)
        assert max(s["done"] - s["due"] for s in steps) < 0.1, [(s["label"], s["done"] - s["due"]) for s in steps]
        assert all(_link_state(lab, h, k) == "UP" for h in (0, 1) for k in range(4))
        assert not any("blackhole" in name for _, name in netns.nft_tables(lab.host_ns(0)))
        assert not any(kind in name for kind in ("lossy", "gray", "marginal")
                       for h in (0, 1) for _, name in netns.nft_tables(lab.host_ns(h)))
        assert "1Gbit" in netns.tc(lab.host_ns(1), "qdisc", "show", "dev", "rail3")
        layout = Layout(lab.prefix, lab.hosts, lab.rails)  # both ends of each rail back at the lab's rate
        assert all("1Gbit" in netns.tc(ns, "qdisc", "show", "dev", dev)
                   for k in range(4) for ns, dev in layout.link_ends(0, k))
