"""r2cc over RDMA rails, inside the emulated guest (run in one boot by
tests/rdma/test_guest_verbs_rails.py; the host's pytest does not collect in_guest/).

Facts about function and failover only: the guest emulates the CPU, so no figure here is a
speed. Each test adds its figures to $R2CC_GUEST_OUT/verbs_results.jsonl, which the host side
prints and keeps.
"""

from __future__ import annotations

import functools
import json
import os
import time

import pytest

from tests.comm import harness
from tests.rdma import rdma_workers

SIZES = [1, 1000, 65536 + 5, 1 << 20]
# The ranks are forked from this process, which has torch loaded already: under emulation each
# spawned rank's own import of torch took 100 s.
run_ranks = functools.partial(harness.run_ranks, start_method="fork")


pytestmark = pytest.mark.rdma
RESULTS = os.path.join(os.environ.get("R2CC_GUEST_OUT", "/tmp"), "verbs_results.jsonl")


def report(name: str, value) -> None:
    with open(RESULTS, "a") as f:
        f.write(json.dumps({"check": name, "ranks": value}, default=str) + "\n")


def test_every_collective_is_bit_exact_over_rdma_rails():
    res = run_ranks(rdma_workers.collectives_exact, 2, SIZES, timeout=900)
    assert res == [[], []], res


def test_tcp_and_rdma_rails_mixed():
    res = run_ranks(rdma_workers.mixed_rails, 2, [1 << 20], timeout=300)
    report("mixed", res)
    assert all(r["exact"] for r in res), res
    assert res[0]["kinds"] == ["rdma", "tcp"], res
    assert all(min(r["sent_by_rail"]) > 0 for r in res), res  # both rails carried bytes


def test_link_down_mid_collective_fails_over_exactly_and_the_rail_comes_back():
    res = run_ranks(rdma_workers.link_down_mid_collective, 2, 4 << 20, timeout=600)  # rail 1
    report("link_down", res)
    a = res[0]
    assert a["in_flight_at_fault"], res
    assert all(r["exact"] and r["exact_after"] for r in res), res
    assert sum(r["failovers"] for r in res) > 0 and sum(r["resent_bytes"] for r in res) > 0, res
    assert a["detected_s"] >= 0, res
    assert all(r["readmit_s"] >= 0 for r in res), res  # every rail up again
    assert all(r["rail_bytes_after"] > 0 for r in res), res  # and the restored rail carries bytes


def test_a_flapping_link_is_held_out_then_readmitted():
    res = run_ranks(rdma_workers.flapping_link_is_held, 2, 3, 3.0, timeout=600)
    report("flapping", res)
    assert all(r["exact"] for r in res), res
    assert res[0]["seen_held"] and res[0]["hold_reason"], res  # rank 0 watched it held
    assert all(r["holds"] >= 1 for r in res), res  # held at both ends
    assert all(r["up_after_s"] >= 0 and r["bytes_after"] > 0 for r in res), res


def test_killed_peer_is_reported_gone():
    res = run_ranks(rdma_workers.peer_killed, 2, timeout=600)
    report("peer_killed", res)
    survivor = res[0]
    assert res[1]["victim"] and res[1]["exitcode"] == -9, res
    assert survivor["raised"] == "PeerGoneError" and survivor["kind"] == "peer_gone", res
    assert survivor["after_s"] < 30, res


def test_peer_cut_off_is_caught_by_the_watchdog():
    res = run_ranks(rdma_workers.peer_host_cut_off, 2, 30, timeout=600)
    report("peer_cut_off", res)
    assert res[1]["kind"] == "rails_down" and res[1]["after_s"] < 30, res
    assert res[0]["raised"] is not None and res[0]["after_s"] < 30, res


def test_doctor_reads_the_rails_ports_through_pyverbs_and_sees_a_link_go_down():
    from r2cc_serve.comm import rdma_devices
    from r2cc_serve.doctor import rdma as doctor_rdma

    rails = rdma_workers.guest_rails(0)
    netdev = rdma_workers.guest_netdev(0, 0)
    ports = {p.name: p for p in rdma_devices.list_ports()}
    report("doctor_ports", {n: [p.state, p.mtu, p.roce_v2_ipv4()] for n, p in ports.items()})
    assert all(ports[r].state == "ACTIVE" and ports[r].roce_v2_ipv4() for r in rails), ports
    assert all(ports[r].mtu for r in rails), "pyverbs gave no MTU"  # pyverbs answered, not just sysfs
    assert doctor_rdma.run(rails, as_json=True) == 0
    rdma_workers.set_link(netdev, False)
    try:
        deadline = time.monotonic() + 10
        while rdma_devices.find_port(rails[0]).state == "ACTIVE" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rdma_devices.find_port(rails[0]).state == "DOWN"
        assert doctor_rdma.run(rails, as_json=True) == 1
    finally:
        rdma_workers.set_link(netdev, True)
