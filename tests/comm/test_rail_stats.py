"""What the transport reports about its rails (loopback; no root needed)."""

import pytest

from tests.comm import workers
from tests.comm.harness import run_ranks


def test_bandwidth_is_measured_on_large_transfers_only():
    grain = 64 << 10
    res = run_ranks(workers.bandwidth_from_large_transfers_only, 2, {"min_chunk_bytes": grain}, timeout=180)
    for r in res:
        assert r["exact"], r
        assert r["chunks_small"] >= 3000, r  # the small messages really went out
        assert r["after_small"] == [0.0] * len(r["after_small"]), r  # not measured from round trips
        assert all(bw > 0 for bw in r["after_large"]), r  # every rail carried stripes and got a figure
        # Chunks follow the measurements: small while no rail is measured, larger once every
        # rail carries 8 ms of two grains (16 MB/s; loopback rails measure far above that)...
        assert r["chunk_small"] == grain, r
        assert r["chunk_large"] >= 2 * grain, r
        assert r["mean_chunk"] > grain, r  # ... and the next messages really are cut that way


def test_small_messages_take_as_many_rails_as_pay_for_their_chunks():
    # Before any rail is measured a chunk's fixed cost is taken as 16 KiB: a 64 KiB message goes
    # on sqrt(64 / 16) = 2 rails, 256 KiB on all four. Large transfers then measure loopback's
    # rails, and the choice follows kChunkCostUs of the slowest; peer_stats() says what it is.
    res = run_ranks(workers.striping_follows_measured_bandwidth, 2, {}, timeout=180)
    for r in res:
        assert r["unmeasured"] == {"chunk_cost_bytes": 16384, "one_rail_max_bytes": (36 << 10) - 1,
                                   "all_rails_min_bytes": 196 << 10}, r  # sqrt >= 1.5, 3.5
        assert 1.9 <= r["unmeasured_64k"] <= 2.3, r  # (a late message's hedge copy adds one)
        cost = r["measured"]["chunk_cost_bytes"]
        assert cost == pytest.approx(min(r["bandwidth"]) * 8e-6, rel=1e-6), r  # kChunkCostUs of the slowest
        # The reported choice is the one taken: 64 KiB goes on one rail, some or all of them.
        one, every = r["measured"]["one_rail_max_bytes"], r["measured"]["all_rails_min_bytes"]
        assert one >= (16 << 10) and every > one, r
        want = 1 if 64 << 10 <= one else 4 if 64 << 10 >= every else None
        if want is None:
            assert 1.9 <= r["measured_64k"] <= 3.3, r
        else:
            assert want - 0.1 <= r["measured_64k"] <= want + 0.3, r
        assert r["measured_256k"] >= r["measured_64k"] - 0.1, r


def test_spinning_stops_when_it_does_not_pay():
    # spin_max_cpu_pressure 1: spin whatever the host's load (this test is about the hit-rate gate)
    res = run_ranks(workers.spin_pays_or_stops, 2, {"spin_us": 200, "spin_max_cpu_pressure": 1.0}, timeout=180)
    for r in res:
        # A prompt peer: spins end in data. On a box so busy that no peer answered within 200 us
        # (CI beside a load test, load 10: 0 hits), spinning must have stopped instead.
        if r["quick_hits"] == 0:
            assert r["quick_misses"] <= 40, res  # of 300 waits: ~6 misses, then 1 in 16
    # A late peer: rank 0's spins miss. Without the gate each of its 200 waits would spin for
    # nothing; with it, a few misses turn spinning off and one wait in 16 probes.
    assert res[0]["late_misses"] <= 50, res
    assert res[0]["late_hits"] <= res[0]["late_misses"], res


def test_no_spinning_at_spin_us_0():
    res = run_ranks(workers.spin_pays_or_stops, 2, {"spin_us": 0}, timeout=180)
    assert all(r["quick_hits"] + r["quick_misses"] + r["late_misses"] == 0 for r in res), res


def test_spinning_yields_to_a_busy_host():
    # Three busy-looping processes on this host: threads wait for cores (CPU pressure), so a
    # waiting rank polls briefly at most (kBriefSpinUs) or sleeps at once instead of taking a
    # core for the whole spin_us; the same waits spin in full on an idle host.
    res = run_ranks(workers.spin_under_cpu_pressure, 2, {"spin_us": 200}, timeout=180)
    for r in res:
        assert r["busy"]["cpu_pressure"] > 0.10, r  # the default bar
        # Waits that found their bytes already there neither spin nor skip: how many are left to
        # gate depends on the load (41 of 500 in one run); none of them may spin in full.
        assert r["busy"]["spin_skips"] + r["busy"]["briefs"] > 0 and r["busy"]["full_spins"] <= 20, r
    never = run_ranks(workers.spin_under_cpu_pressure, 2, {"spin_us": 200, "spin_max_cpu_pressure": 0.0},
                      timeout=180)
    for r in never:
        assert r["idle"]["full_spins"] == 0 and r["idle"]["spin_skips"] + r["idle"]["briefs"] > 0, never


def test_under_cpu_pressure_a_wait_polls_briefly_while_that_pays():
    # spin_max_cpu_pressure 0: the host gate is always shut, as on a host whose cores are all
    # wanted. Every spin is then a brief one. A peer that answers within 50 us (an idle host)
    # keeps them going and its bytes come without a wake-up; one that does not (a busy host, or
    # the phase where rank 1 is 3 ms late) makes them miss, and they stop as full spins do: a
    # few misses, then one wait in 16 probes.
    res = run_ranks(workers.spin_pays_or_stops, 2, {"spin_us": 1000, "spin_max_cpu_pressure": 0.0}, timeout=180)
    for r in res:
        spins = r["quick_hits"] + r["quick_misses"] + r["late_hits"] + r["late_misses"]
        assert spins <= r["quick_briefs"] + r["late_briefs"], res  # never in full
        if r["quick_hits"] == 0:  # this box answered no brief poll: they must have stopped
            assert r["quick_briefs"] <= 40, res  # of 300 waits: ~6 misses, then 1 in 16
    assert sum(r["quick_briefs"] for r in res) > 0, res
    assert res[0]["late_misses"] <= 50 and res[0]["late_briefs"] <= 60, res


def test_a_goodbye_is_logged_quietly_and_a_fault_is_not():
    res = run_ranks(workers.goodbye_is_not_a_warning, 2, {}, timeout=180)
    lines = [(level, msg) for recs in res for level, msg in recs if " -> " in msg]
    fault = [(level, msg) for level, msg in lines if "rail2" in msg and "-> down" in msg and "closed" not in msg]
    assert fault and all(level == "WARNING" for level, _ in fault), lines
    goodbye = [(level, msg) for level, msg in res[0] if "-> down" in msg and "closed its communicator" in msg]
    assert len(goodbye) >= 3, res[0]  # rank 1's rails went down from rank 0's side
    assert all(level == "INFO" for level, _ in goodbye), goodbye


def test_callers_run_the_watchdog_passes_and_it_takes_over_when_they_stop():
    # spin_max_cpu_pressure 1: a caller spins whatever the host's load. Rank 1 comes late to
    # every call, so rank 0's caller spins each time. The tick is 4 ms.
    res = run_ranks(workers.watchdog_passes_while_spinning_and_idle, 2, {"spin_max_cpu_pressure": 1.0}, timeout=120)
    for r in res:
        assert r["exact"], r
        busy, idle = r["busy"], r["idle"]
        # No pass is lost either way: about one a tick (a caller runs it at most a tick late).
        assert busy["passes"] >= 0.4 * busy["s"] / 0.004 and idle["passes"] >= 0.6 * idle["s"] / 0.004, r
        # With no caller the watchdog runs every pass itself.
        assert idle["by_callers"] == 0 and idle["watchdog_wakeups"] >= 0.6 * idle["s"] / 0.004, r
    # While a caller spins it runs the passes, and the watchdog thread mostly sleeps: its
    # real-time wake-up would preempt a caller on a host whose cores all spin. How much rank 0
    # spun depends on the host's load (a caller whose peer is descheduled stops spinning), so
    # the shares are held to where it spun on nearly every call, as on an idle host.
    busy = res[0]["busy"]
    idle_host = busy["spin_hits"] >= 0.8 * res[0]["calls"]
    assert busy["spin_hits"] > 0 and busy["by_callers"] > 0, res[0]
    if idle_host:  # idle: ~100% (a busy host gave 60%, gaps are the watchdog's)
        assert busy["by_callers"] >= 0.5 * busy["passes"], res[0]
        assert busy["watchdog_wakeups"] <= 0.4 * busy["s"] / 0.004, res[0]
    # Rank 1, always late, finds its peer's bytes waiting and never spins: its calls run the
    # passes as they end (before, its watchdog woke for every one). The shares are held where
    # the host was idle, by the same sign as above, and rank 1's calls came at least one a
    # millisecond: on a busy host a descheduled rank leaves gaps over two ticks, the watchdog's.
    busy, calls = res[1]["busy"], res[1]["calls"]
    assert busy["by_callers"] > 0, res[1]
    if idle_host and calls >= busy["s"] / 0.001:
        assert busy["by_callers"] >= 0.5 * busy["passes"], res[1]
        assert busy["watchdog_wakeups"] <= 0.4 * busy["s"] / 0.004, res[1]


def test_a_state_wait_ends_on_a_change_a_touched_file_an_interrupt_or_its_timeout(tmp_path):
    # The rail monitor's wait between full samples (it runs without the GIL).
    watched = tmp_path / ".refresh"
    watched.write_text("")
    res = run_ranks(workers.state_waits, 2, {}, str(watched), timeout=120)[0]
    took, moved, switches = res["quiet"]
    assert 0.19 <= took < 1.0 and not moved, res  # nothing happened: its 0.2 s timeout
    # Asked to look every 10 ms, it slept through: the watchdog's passes look for it. (Waking
    # for each look took 20 switches here; in a rank, each took a core from the caller.)
    assert switches <= 4, res
    for cause in ("interrupt", "touched"):
        took, moved, _ = res[cause]
        assert took < 1.0 and not moved, (cause, res)  # back at once, the state as it was
    took, moved, _ = res["drain"]
    assert took < 1.0 and moved, res
