"""A stalled process is not a dead network; an idle outage heals; mismatched calls fail
everywhere, never silently (issue: stalled peers). Loopback, real processes and signals."""

import pytest

from tests.comm import stall_workers
from tests.comm.harness import run_ranks


def _stopped(stop_s):
    res = run_ranks(stall_workers.stopped_peer, 2, stop_s, {}, timeout=stop_s + 90)
    for r in res:
        assert r["bad"] == 0 and r["done"] > 10 and not r["error"], r
        assert r["failovers"] == 0 and r["resent"] == 0, r  # no false failover, no re-send storm
        assert r["states"] == ["up"], r
    seen = res[0]["seen"]
    assert seen["stalled"]["stalled"] and seen["stalled"]["stalled_for_s"] > stop_s * 0.5, seen
    assert seen["states"] == ["up"], seen  # rails stay up while the peer is stopped
    assert res[0]["stalls"] == 1 and res[0]["last_stall_s"] > stop_s * 0.8, res[0]


def test_stopped_peer_for_3s_fails_nothing():
    _stopped(3.0)


@pytest.mark.slow
@pytest.mark.parametrize("stop_s", [10.0, 30.0])
def test_stopped_peer_for_long_fails_nothing(stop_s):
    _stopped(stop_s)


def test_all_rails_out_while_idle_fails_nothing_and_heals():
    res = run_ranks(stall_workers.idle_outage_heals, 2, 1.5, {}, timeout=90)
    for r in res:
        assert r["ok"] and not r["error"] and not r["error_during"], r
        assert r["had_path_during"] == [False], r  # the outage was real


@pytest.mark.parametrize("case", sorted(stall_workers.MISMATCHES))
def test_mismatched_calls_fail_on_every_rank(case):
    res = run_ranks(stall_workers.mismatched_call, 2, case, {}, timeout=60)
    for r in res:
        assert r["raised"] in ("call", "next"), r
        assert r["after_s"] < 1.0 and r["kind"] == "call_mismatch", r
    assert len({r["msg"] for r in res}) == 1, res  # the same error on every rank, naming both calls
    if case != "root":  # both ranks must wait for each other: the call itself fails
        assert all(r["raised"] == "call" for r in res), res


@pytest.mark.parametrize("fail_carrier", [False, True], ids=["writer-finishes", "carrier-fails"])
def test_an_inline_write_that_fills_the_socket_is_finished_by_the_writer(fail_carrier):
    res = run_ranks(stall_workers.handoff_to_writer, 2, fail_carrier, {}, timeout=90)
    for r in res:
        assert r["ok"] and r["after_ok"] and not r["error"], r
    sender = res[0]
    seen = sender["seen"]
    assert seen["handoffs"] == 1 and 1 in seen["carriers"], seen  # rail 1's writer holds the rest
    assert seen["send_s"] >= 0.5, seen  # and the send really waited for the stopped peer
    if fail_carrier:
        assert sender["failovers"] >= 1 and sender["chunks_resent"] >= 1, sender
        assert 1 not in seen["after_failover"], seen  # its chunks left the failed rail
    else:
        assert sender["failovers"] == 0 and sender["chunks_resent"] == 0, sender
