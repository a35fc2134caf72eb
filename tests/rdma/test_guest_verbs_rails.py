"""r2cc's verbs rails in the emulated guest (in_guest/test_verbs_rails.py), one boot with two
rails: every collective exact, TCP and verbs rails mixed, a link down mid-collective, a killed
peer, a peer cut off, the doctor reading the ports. The figures (JSON lines) are printed: run it
with -s to see them."""

from __future__ import annotations

import json

import pytest

from tests.rdma.conftest import guest_time_limit

GUEST_TIMEOUT_S = 1800
pytestmark = [pytest.mark.rdma, pytest.mark.slow, guest_time_limit(GUEST_TIMEOUT_S)]

CHECKS = {
    "test_every_collective_is_bit_exact_over_rdma_rails",
    "test_tcp_and_rdma_rails_mixed",
    "test_link_down_mid_collective_fails_over_exactly_and_the_rail_comes_back",
    "test_a_flapping_link_is_held_out_then_readmitted",
    "test_killed_peer_is_reported_gone",
    "test_peer_cut_off_is_caught_by_the_watchdog",
    "test_doctor_reads_the_rails_ports_through_pyverbs_and_sees_a_link_go_down",
}


def test_verbs_rails_in_the_guest(guest_pytest, tmp_path):
    run = guest_pytest("tests/rdma/in_guest/test_verbs_rails.py", rails=2, timeout_s=GUEST_TIMEOUT_S)
    print(run.result.summary())
    figures = tmp_path / "verbs_results.jsonl"
    if figures.exists():
        print(figures.read_text())
    assert run.cases, f"no junit report: {run.result.summary()}\n{run.result.output[-3000:]}"
    assert not run.failures(), "\n".join(f"{c.name}: {c.message}" for c in run.failures())
    assert set(run.outcomes()) == CHECKS and set(run.outcomes().values()) == {"passed"}, run.outcomes()
    assert run.result.ok
    # the link-down check's figures: the rail failed over and came back on both ranks
    link_down = [json.loads(line) for line in figures.read_text().splitlines() if '"link_down"' in line]
    assert link_down and all(r["failovers"] > 0 and r["readmit_s"] >= 0 for r in link_down[0]["ranks"])
