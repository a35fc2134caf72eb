"""RDMA rails under test, run inside the emulated guest by tests/rdma/test_verbs_rails.py (the
host's pytest does not collect this file: it matches no test_*.py pattern).

Facts about function and failover only: the guest emulates the CPU, so no figure here is a
speed. Each test prints one RESULT line (JSON) that the host side copies into its report.
"""

from __future__ import annotations

import functools
import json

import pytest

from tests.comm import harness
from tests.rdma import rdma_workers

SIZES = [1, 1000, 65536 + 5, 1 << 20]
# The ranks are forked from this process, which has torch loaded already: under emulation each
# spawned rank's own import of torch took 100 s.
run_ranks = functools.partial(harness.run_ranks, start_method="fork")


def report(name: str, value) -> None:
    print(f"RESULT {name} {json.dumps(value, default=str)}", flush=True)


def test_every_collective_is_bit_exact_over_rdma_rails():
    res = run_ranks(rdma_workers.collectives_exact, 2, SIZES, timeout=900)
    assert res == [[], []], res


def test_tcp_and_rdma_rails_mixed():
    res = run_ranks(rdma_workers.mixed_rails, 2, [1 << 20], timeout=300)
    report("mixed", res)
    assert all(r["exact"] for r in res), res
    assert res[0]["kinds"] == ["rdma", "tcp"], res
    assert all(min(r["sent_by_rail"]) > 0 for r in res), res  # both rails carried bytes


@pytest.mark.parametrize("rail", [1])
def test_link_down_mid_collective_fails_over_exactly_and_the_rail_comes_back(rail):
    res = run_ranks(rdma_workers.link_down_mid_collective, 2, 4 << 20, rail, timeout=600)
    report("link_down", res)
    a = res[0]
    assert a["in_flight_at_fault"], res
    assert all(r["exact"] and r["exact_after"] for r in res), res
    assert sum(r["failovers"] for r in res) > 0 and sum(r["resent_bytes"] for r in res) > 0, res
    assert a["detected_s"] >= 0, res
    assert all(r["readmit_s"] >= 0 for r in res), res  # every rail up again
    assert all(r["rail_bytes_after"] > 0 for r in res), res  # and the restored rail carries bytes


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
    assert res[0]["raised"] is not None and res[0]["after_s"] < 30, res
