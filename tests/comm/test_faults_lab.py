"""Real faults on real veth rails (needs root): down, blackhole, flap, degrade, strangers,
all rails down, recovery. Each checks bit-exact results and that recovery really happened.
Also what the rails' kernel side does to the data path where loopback cannot show it."""

import os
import re

import pytest

from r2cc_serve import envs
from tests.comm import lab_workers
from tests.comm.harness import run_ranks

pytestmark = [pytest.mark.lab, pytest.mark.requires("root", "ip", "tc", "nft")]
PREFIX, STATE = "r2cct", "/run/r2cc-lab/test-comm-state.json"


@pytest.fixture(scope="module")
def lab():
    old = {k: os.environ.get(k) for k in ("R2CC_LAB_PREFIX", "R2CC_LAB_STATE")}
    os.environ.update(R2CC_LAB_PREFIX=PREFIX, R2CC_LAB_STATE=STATE)  # spawned ranks inherit it
    from r2cc_testbed.lab import Lab

    lab = Lab.up(hosts=2, rails=4, rate="1gbit")
    yield lab
    Lab.down()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.mark.parametrize("kind", ["down", "blackhole"])
def test_fault_mid_collective_is_bit_exact_and_recovers(lab, kind):
    # 64 MiB at 4 x 1 Gbit/s takes ~200 ms. The fault lands 30 ms in, once rail 1 holds
    # unacknowledged chunks, and in-process: an `ip`/`nft` process on a busy box sometimes
    # landed it after rail 1's last chunk (a failover with nothing to re-send).
    res = run_ranks(lab_workers.fault_mid_collective, 2, kind, 16 << 20, 0.03, timeout=120)
    assert res[0]["inflight_at_fault"], res[0]
    for r in res:
        assert r["exact"] and r["exact_after"], r
        assert r["during"]["failovers"] >= 1, r
        assert r["final_states"] == {0: "up", 1: "up", 2: "up", 3: "up"}, r
    assert sum(r["during"]["resent_bytes"] for r in res) > 0, res
    assert sum(r["rail1_bytes_after"] for r in res) > 0, res  # re-admitted rail carries traffic


@pytest.mark.slow  # ~40 s: outside the default run, in CI (-m ci)
@pytest.mark.ci
def test_flap_during_1000_collectives(lab):
    res = run_ranks(lab_workers.flap_during_many, 2, 1000, 300, 4, timeout=300)
    for r in res:
        assert r["bad"] == 0, r
    assert sum(r["failovers"] for r in res) >= 1, res


def test_blackholed_rail_costs_small_messages_no_detection_delay(lab):
    # The detector needs the rail timeout (500 ms in this test) to act on a silent rail; a
    # small message lost on it must not wait that long: its hedge copy goes on another rail
    # as soon as the sender is idle. The control run without hedging shows the wait is real.
    hedged = run_ranks(lab_workers.small_messages_through_blackhole, 2, 16384, 1500, 300, timeout=120)
    for r in hedged:
        assert r["exact"], r
        assert r["longest_s"] < 0.25, r
    assert sum(r["hedges"] for r in hedged) > 0, hedged
    plain = run_ranks(lab_workers.small_messages_through_blackhole, 2, 0, 1500, 300, timeout=120)
    for r in plain:
        assert r["exact"] and r["hedges"] == 0, r
    assert max(r["longest_s"] for r in plain) > 0.45, plain  # a message waited for the detector


def test_degraded_rail_gets_less_traffic(lab):
    res = run_ranks(lab_workers.degrade_shifts_load, 2, "50mbit", timeout=120)
    for r in res:
        assert r["exact"], r
        # A 20x slower rail must carry clearly less than any healthy rail (equal
        # striping would give it the same share). Two busy cores cap the healthy
        # rails well below 1 Gbit/s here, so the ratio is not 20.
        fast = min(r["share"][k] for k in (0, 2, 3))
        assert r["share"][1] < fast / 2, r
        # It is measured at about its rate (50mbit: 6.25 MB/s), not a multiple, and far below the
        # fastest rail. Not always below every healthy one: a rail's rate is the bytes the peer
        # acknowledged per busy second, and beside a CPU-bound job the peer's threads ack late;
        # two healthy rails measured 4.9-5.0 MB/s there against the cut rail's 7.4.
        assert r["bw"][1] < 2 * 50e6 / 8, r
        assert r["bw"][1] < max(r["bw"][k] for k in (0, 2, 3)) / 4, r
        # ... so messages go in the smallest chunks: a large one would arrive last on it.
        assert r["chunk"] == envs.get("R2CC_MIN_CHUNK_BYTES"), r


def test_slow_rail_may_be_quiet_longer_and_is_not_failed(lab):
    # 20mbit behind a tbf with a 256 KB burst queues ~100 ms: round trips that long make
    # 60 ms gaps normal, so the rail's quiet-time bar follows TCP's own estimate.
    # A rail 50x slower than its siblings may also be demoted (its late chunks re-sent, a slow
    # verdict: gray.cc), or set aside as stuck. The cut shapes both directions, and both ranks
    # send: the peer's ACKs of our bytes wait behind its own data in its shaper's queue (256 KB
    # burst + 20 ms: up to ~120 ms at 20mbit), while the kernel's round-trip estimate was learnt
    # before that queue filled (seen at the verdict: 1.5-6 ms, 180-290 segments outstanding, no
    # ACK for 60 ms; 2 of 15 busy-box runs). Both are verdicts on progress, and the rail is back
    # once its bytes are delivered; what must not happen is a failure for silence on it.
    res = run_ranks(lab_workers.slow_rail_quiet_bar, 2, "20mbit", timeout=120)
    for r in res:
        assert r["exact"], r
        assert r["failovers"] == r["slow_verdicts"] + r["stuck_verdicts"], r
        assert abs(min(r["idle_bars"].values()) - 0.06) < 1e-9, r  # R2CC_RAIL_TIMEOUT_MS on a quick path
        assert r["max_bar"][1] > 0.12, r
        assert r["max_bar"][1] <= 0.4 + 1e-9, r  # never past R2CC_PEER_SILENCE_MS


def test_stranger_on_a_rail_is_rejected(lab):
    res = run_ranks(lab_workers.stranger_on_rail, 2, timeout=60)
    assert all(r["ok"] for r in res), res
    assert res[0]["rejected_handshakes"] >= 1 and all(r["failovers"] == 0 for r in res), res


def test_all_rails_down_same_error_everywhere_within_2s(lab):
    res = run_ranks(lab_workers.all_rails_down, 2, timeout=60)
    for r in res:
        assert r["raised"] == "RailsDownError", r
        assert r["after_s"] < 2.0, r
    assert len({r["headline"] for r in res}) == 1, res


def test_mid_size_chunks_leave_from_the_caller(lab):
    # Rails that carried only small messages must still have room for a 256 KiB all_reduce's
    # chunks, so the posting caller writes them itself and no writer thread wakes. With the
    # kernel sizing the send buffers (as before), such rails kept ~64 KiB and writers took
    # most chunks (2 hosts x 4 rails: 0.32-0.39 ms per call instead of 0.27).
    # Writers still take a few where the peer's acknowledgements come late, which scheduling
    # decides: 0-11 of 80 per rank on this box, idle or beside a busy job. A quarter is far
    # from both that and "most".
    res = run_ranks(lab_workers.mid_size_after_small_messages, 2, timeout=120)
    for r in res:
        assert r["exact"], r
        assert r["chunks"] >= 20 * 4, r  # the messages really were cut over the rails
        assert r["writer_chunks"] <= r["chunks"] // 4, r


@pytest.mark.parametrize("loss_pct", [1, 5])
def test_lossy_rail_is_held_while_it_loses_and_returns_after(lab, loss_pct):
    res = run_ranks(lab_workers.lossy_rail_is_held, 2, loss_pct, 3.0, timeout=240)
    for r in res:
        assert r["exact"], r
        assert r["held"]["state"] == "held" and r["held_after_s"] < 15, r
        assert r["sent_while_held"] == 0, r  # 5 all_reduces of 4 MiB, none of it on the lossy rail
        assert r["up_after_clear_s"] < 3.0 * 4 + 10 and r["sent_after"] > 0, r
    # at least one end saw the loss itself (the other may only have been told)
    judged = [r for r in res if r["held"]["hold_reason"].startswith("lossy:")]
    assert judged and all(r["held"]["loss_holds"] >= 1 for r in judged), res
    assert all(float(re.match(r"lossy: ([0-9.]+)%", r["held"]["hold_reason"]).group(1)) >= 0.5 for r in judged), res
    assert sum(r["counters"]["loss_holds"] for r in res) >= 1, res


def test_rate_cut_is_not_taken_for_loss(lab):
    # 1gbit -> 50mbit overflows the rail's queue once; a burst like that must not hold the rail
    # 3 s of 16 MiB all_reduces: a few loss windows of the cut rail are judged
    res = run_ranks(lab_workers.degrade_shifts_load, 2, "50mbit", 3.0, timeout=180)
    # A rail cut to 1/20 of its siblings may be held for crawling (slow verdicts, gray.cc), by this
    # rank or its peer (whose own row shows no loss hold either): never for loss.
    for r in res:
        assert r["exact"] and r["loss_holds"] == 0, r
        slow_hold = "a slow path" in r["hold_reason"] or "holds it out" in r["hold_reason"]
        assert r["state"] == "up" or (r["state"] == "held" and slow_hold), r
