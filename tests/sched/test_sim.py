"""The simulator against closed forms, itself without symmetry, and the 1024-rank budget."""

import time

import numpy as np
import pytest

from r2cc_serve.sched import builders, cost
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.ir import IN, OUT, RECV, SEND, Plan, PlanError, ProgramBuilder
from r2cc_serve.sched.sim import _max_min, simulate

MIB64 = 64 << 20


def _bw(p, beta, d=1, B=1.0):
    return Bandwidth.degraded(p, B, {r: beta for r in range(p - d, p)})


def _sim(schedule, p, beta, d=1, M=None, chunks=1, **kw):
    """Seconds per byte (units M/B with B = 1). By default M splits evenly into p parts."""
    bw = _bw(p, beta, d)
    count = (M or p * 2**20 * 4) // 4
    return simulate(builders.build(schedule, p, count, bw=bw, chunks=chunks), bw, **kw).seconds / (count * 4)


@pytest.mark.parametrize("p", [2, 3, 4, 7, 16, 64])
@pytest.mark.parametrize("beta", [1.0, 0.875, 0.5, 0.25])
def test_ring_and_direct_reproduce_the_equal_share_closed_form(p, beta):
    want = cost.equal_share_time(p, beta, 1.0, 1.0)
    assert _sim("ring", p, beta) == pytest.approx(want, rel=1e-9)
    assert _sim("direct", p, beta) == pytest.approx(want, rel=1e-9)


def test_ring_with_several_stragglers_is_paced_by_the_slowest():
    assert _sim("ring", 12, 0.5, d=3) == pytest.approx(cost.equal_share_time(12, 0.5, 1, 1), rel=1e-9)


@pytest.mark.parametrize("p", [3, 4, 16, 64])
def test_optcc_pays_exactly_one_chunk_when_the_straggler_owns_nothing(p):
    """beta below (p-1)/(2p-3): T = T_LB (1 + 1/K), the pipelining term."""
    lb = cost.lower_bound(p, 0.5, 1, 1)
    for k in (1, 2, 4, 16):
        even = (p - 1) * 16 * 4096 * 4  # every piece the same size
        assert _sim("optcc", p, 0.5, chunks=k, M=even) == pytest.approx(lb * (1 + 1 / k), rel=1e-9)


@pytest.mark.parametrize("p,beta", [(4, 0.75), (16, 0.75), (16, 0.875), (64, 0.75)])
def test_optcc_reaches_the_bound_when_the_straggler_owns_a_share(p, beta):
    """Above the threshold S's in-link starts with its own share's pieces, which hides the fill
    once K >= (1-x_S)/((p-1)x_S): the model's prediction matches the simulator."""
    bw = _bw(p, beta)
    model = cost.CostModel(alpha_s=0, overhead_s=0, reduce_Bps=0, min_piece_bytes=1)
    for k in (1, 2, 3, 8):
        predicted = cost.estimate("optcc", bw, 1.0, model).bandwidth_s + cost.pipeline_fill("optcc", bw, 1.0, [k])[0]
        assert _sim("optcc", p, beta, chunks=k) == pytest.approx(predicted, rel=1e-4), k
    assert _sim("optcc", p, beta, chunks=8) == pytest.approx(cost.lower_bound(p, beta, 1, 1), rel=1e-4)


@pytest.mark.parametrize("p", [16, 64])
@pytest.mark.parametrize("beta", [0.5, 0.75])
def test_optcc_within_two_percent_of_the_bound_at_64_mib(p, beta):
    bw = _bw(p, beta)
    model = cost.CostModel(alpha_s=0, overhead_s=0, reduce_Bps=0, min_piece_bytes=1024)
    k = cost.estimate("optcc", bw, MIB64, model).chunks
    t = _sim("optcc", p, beta, chunks=k, M=MIB64)
    assert t <= 1.02 * cost.lower_bound(p, beta, 1, 1), (k, t)


def test_fault_free_direct_is_optimal_and_one_shot_is_p_minus_one():
    for p in (2, 5, 16):
        assert _sim("direct", p, 1.0) == pytest.approx(cost.fault_free_time(p, 1, 1), rel=1e-9)
        assert _sim("one_shot", p, 1.0) == pytest.approx(p - 1, rel=1e-9)


def test_several_stragglers_stay_close_to_the_multi_straggler_bound():
    for p, d, beta in ((16, 2, 0.75), (16, 8, 0.5), (64, 8, 0.75), (64, 8, 0.25)):
        lb = cost.lower_bound(p, [beta] * d, 1, 1)
        assert lb <= _sim("optcc", p, beta, d=d, chunks=32) <= 1.04 * lb


@pytest.mark.parametrize("schedule", builders.SCHEDULES)
def test_symmetry_gives_the_same_time_as_simulating_every_rank(schedule):
    count = 10**6 + 7  # uneven shares: representatives differ from others by an element
    for p, d, beta in ((5, 1, 0.5), (7, 2, 0.8), (9, 3, 0.3), (6, 0, 1.0)):
        bw = _bw(p, beta, d) if d else Bandwidth.uniform(p, 1.0)
        for k, alpha, red in ((1, 0.0, 0.0), (3, 0.01, 1e7)):
            plan = builders.build(schedule, p, count, bw=bw, chunks=k, slice_bytes=1 << 20)
            fast = simulate(plan, bw, alpha_s=alpha, reduce_Bps=red)
            slow = simulate(plan, bw, alpha_s=alpha, reduce_Bps=red, use_symmetry=False)
            assert slow.representatives == p
            assert fast.seconds == pytest.approx(slow.seconds, rel=1e-4), (p, d, k)


def test_no_schedule_beats_the_lower_bound():
    rng = np.random.default_rng(7)
    for _ in range(12):
        p = int(rng.integers(2, 9))
        betas = np.round(rng.uniform(0.2, 1.0, p), 2)
        bw = Bandwidth.degraded(p, 1.0, betas)
        lb = cost.lower_bound_of(bw, 4000 * 4)
        for schedule in builders.SCHEDULES:
            t = simulate(builders.build(schedule, p, 4000, bw=bw, chunks=int(rng.integers(1, 6))), bw).seconds
            assert t >= lb * (1 - 1e-9), (schedule, betas)


def test_latency_and_reduction_time_add_where_expected():
    bw = Bandwidth.uniform(2, 1.0)
    plan = builders.one_shot(2, 100)  # 400 bytes each way, then a reduce of 2 x 400 bytes
    assert simulate(plan, bw, alpha_s=5.0).seconds == pytest.approx(405.0)
    assert simulate(plan, bw, alpha_s=5.0, reduce_Bps=8.0).seconds == pytest.approx(505.0)


def test_max_min_shares_a_bottleneck_and_gives_the_rest_away():
    # Flows 0->2 and 1->2 share rank 2's in (capacity 1); flow 0->1 gets the rest of rank 0's out.
    cap = np.array([2.0, 2.0, 2.0, 2.0, 2.0, 1.0])  # out of ranks 0..2, then in of ranks 0..2
    src, dst = np.array([0, 1, 0]), np.array([5, 5, 4])
    rate = _max_min(src, dst, np.ones(3), np.ones(3), cap)
    assert rate.tolist() == pytest.approx([0.5, 0.5, 1.5])
    # A flow standing for 3 copies uses three times its rate.
    rate = _max_min(np.array([0]), np.array([5]), np.array([3.0]), np.array([1.0]), cap)
    assert rate.tolist() == pytest.approx([2 / 3])


def test_fifo_per_connection_serializes_messages():
    def make(r):
        b = ProgramBuilder()
        if r == 0:
            b.add(SEND, 1, IN, [0, 50], 50)
        else:
            b.add(RECV, 0, OUT, [0, 50], 50)
        return b.build()
    plan = Plan("t", 2, 100, 1, make)
    res = simulate(plan, Bandwidth([1.0, 1.0], [1.0, 1.0]), alpha_s=1.0)
    assert res.seconds == pytest.approx(101.0) and res.engine == "fixed-rate"


def test_deadlock_raises():
    def make(r):
        b = ProgramBuilder()
        recv = b.add(RECV, 1 - r, OUT, 0, 10)
        b.add(SEND, 1 - r, IN, 0, 10, deps=recv)
        return b.build()
    with pytest.raises(PlanError, match="deadlock"):
        simulate(Plan("t", 2, 10, 4, make), Bandwidth.uniform(2, 1.0))


def test_a_symmetry_across_different_bandwidths_is_dropped():
    plan = builders.direct(6, 6000, groups=[list(range(6))])  # claims all ranks alike
    bw = _bw(6, 0.5)
    res = simulate(plan, bw)
    assert res.representatives == 6
    assert res.seconds == pytest.approx(cost.equal_share_time(6, 0.5, 24000, 1.0), rel=1e-6)


def test_1024_ranks_run_in_seconds():
    t0 = time.perf_counter()
    bw = _bw(1024, 0.5)
    res = simulate(builders.build("optcc", 1024, MIB64 // 4, bw=bw, chunks=16), bw)
    assert res.representatives == 2
    assert res.seconds / MIB64 == pytest.approx(cost.lower_bound(1024, 0.5, 1, 1) * (1 + 1 / 16), rel=1e-3)
    res = simulate(builders.build("direct", 1024, MIB64 // 4, bw=bw), bw)
    assert res.seconds / MIB64 == pytest.approx(cost.equal_share_time(1024, 0.5, 1, 1), rel=1e-6)
    assert time.perf_counter() - t0 < 20
