"""Operator actions and failure handling on loopback rails (no root needed)."""

from tests.comm import workers
from tests.comm.harness import run_ranks


def test_failover_mid_collective_is_lossless_and_rail_comes_back():
    res = run_ranks(workers.failover_mid_collective, 2, 16 << 20, 0.03, {}, timeout=120)
    for r in res:
        assert r["exact"] and r["exact_after"], r
        assert r["states_after"] == ["up"] * len(r["states_after"]), r
    assert res[0]["failovers"] >= 1 and res[1]["failovers"] >= 1, res
    assert sum(r["resent"] for r in res) > 0, res  # un-acked chunks really were re-sent
    assert res[1]["rail1_reconnects"] >= 1 or res[0]["rail1_reconnects"] >= 1, res


def test_drain_stops_new_chunks_both_directions():
    res = run_ranks(workers.drain_moves_traffic, 2, {}, timeout=60)
    for r in res:
        assert r["during"] == 0, res
    assert sum(r["after"] for r in res) > 0, res
    assert all(s in ("draining", "drained") for s in res[0]["states"]), res


def test_stranger_is_rejected_and_group_undisturbed():
    res = run_ranks(workers.stranger_rejected, 2, {}, timeout=60)
    assert all(r["ok"] for r in res), res
    assert res[0]["rejected"] >= 3, res
    assert all(r["failovers"] == 0 for r in res), res


def test_all_rails_down_raises_same_error_everywhere_within_2s():
    res = run_ranks(workers.all_rails_down, 3, {}, timeout=60)
    msgs = {r["msg"].splitlines()[0] for r in res}
    for r in res:
        assert r["raised"] == "RailsDownError", r
        assert r["after_s"] < 2.0, r
    assert len(msgs) == 1, msgs  # the very same text on every rank
    assert "every rail between two ranks stayed down" in msgs.pop()
    assert all("Details: rank" in r["msg"] for r in res)


def test_small_messages_go_out_on_two_rails_and_survive_a_failover():
    res = run_ranks(workers.small_messages_through_failover, 2, {}, timeout=120)
    for r in res:
        assert r["exact"], r
        # Nearly every message had a copy on the second rail (a busy rail may skip one).
        assert r["chunks_per_msg"] > 1.5, r
    assert sum(r["failovers"] for r in res) >= 1, res


def test_without_hedging_each_small_message_goes_out_once():
    # The control for the test above: R2CC_HEDGE_BYTES=0 sends one copy per message.
    res = run_ranks(workers.small_messages_through_failover, 2, {"hedge_bytes": 0}, timeout=120)
    for r in res:
        assert r["exact"], r
        assert r["chunks_per_msg"] < 1.1, r
    assert sum(r["failovers"] for r in res) >= 1, res
