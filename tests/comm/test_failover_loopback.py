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
    # the rail monitor's cheap check sees the drain (it re-samples in full only when this moves)
    before, again, drained = res[0]["signatures"]
    assert before == again and drained != before, res[0]["signatures"]


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


def test_small_messages_acknowledged_in_time_go_out_once_and_survive_a_failover():
    # A hedge copy is insurance for a message lost on a silently dead rail: one the peer
    # acknowledges in time needs none (before, every message went out twice: 2.0 here).
    res = run_ranks(workers.small_messages_through_failover, 2, {}, timeout=120)
    for r in res:
        assert r["exact"], r
        assert r["chunks_per_msg"] < 1.5, r
    assert sum(r["failovers"] for r in res) >= 1, res


def test_a_message_late_to_be_acknowledged_gets_a_copy_from_its_sleeping_caller():
    # Rank 1 comes 5 ms late each time. 1 ms after posting, rank 0's caller, asleep in its wait,
    # looks at its message: if the peer's kernel has not acknowledged it (delayed acks: rank 1
    # last replied on the same rail), a second copy goes out on the other rail; if it has, the
    # peer is late, not the rail, and no copy is needed. Which of the two, call by call, is the
    # kernels' choice (about half and half, or all copies), so the test asserts that messages
    # were judged while their peer was still late, and that the sleeping caller wrote the copies
    # itself: the watchdog's timer, pushed out by each call, comes too late for most. (No
    # spinning, so every copy the caller writes is written in its sleep. With those writes
    # switched off, 5 runs of 5 failed here.)
    count = 20
    res = run_ranks(workers.small_messages_to_a_late_peer, 2, {"spin_us": 0}, 0.005, count, timeout=120)
    assert all(r["exact"] for r in res), res
    r0 = res[0]
    assert r0["hedges"] >= 1, res
    assert r0["hedges"] + r0["hedges_unneeded"] >= count // 4, res  # a loaded box makes some late
    assert r0["waiter_hedges"] >= 0.5 * r0["hedges"], res


def test_a_peer_that_is_always_a_little_late_gets_few_copies():
    # Rank 1 starts every call ~0.3 ms after rank 0, and rank 0 spins (forced on): the copies'
    # delay follows how late the peer usually is (4x its smoothed reply), so a steady peer is not
    # sent every message twice. With the fixed 50 us delay every one of these calls got a copy.
    count = 300
    res = run_ranks(workers.small_messages_to_a_late_peer, 2,
                    {"spin_us": 5000, "spin_max_cpu_pressure": 1.0}, 0.0003, count, timeout=120)
    assert all(r["exact"] for r in res), res
    assert res[0]["hedges"] < 0.3 * count, res


def test_without_hedging_a_late_peer_gets_no_copies():
    # The control for the test above: R2CC_HEDGE_BYTES=0 writes no second copy.
    res = run_ranks(workers.small_messages_to_a_late_peer, 2, {"hedge_bytes": 0}, timeout=120)
    assert all(r["exact"] and r["hedges"] == 0 for r in res), res
