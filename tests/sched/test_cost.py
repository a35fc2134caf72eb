"""Lower bound, closed forms and the alpha-beta model against hand-derived values."""

import numpy as np
import pytest

from r2cc_serve.errors import UserError
from r2cc_serve.sched import builders, cost
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.ir import RECV, SEND


@pytest.mark.parametrize("p,beta,t,ring,ff", [
    (4, 0.75, 1.6, 2.0, 1.5),
    (4, 0.5, 2.0, 3.0, 1.5),
    (16, 0.5, 2.0, 3.75, 1.875),
])
def test_worked_values_from_the_issue(p, beta, t, ring, ff):
    assert cost.lower_bound(p, beta, 1.0, 1.0) == pytest.approx(t)
    assert cost.equal_share_time(p, beta, 1.0, 1.0) == pytest.approx(ring)
    assert cost.fault_free_time(p, 1.0, 1.0) == pytest.approx(ff)


def test_single_straggler_closed_form():
    for p in (3, 4, 8, 16, 1024):
        for beta in (0.1, 0.25, 0.5, 0.6, 0.75, 0.875, 1.0):
            want = max(1 / beta, 2 * (p - 1) / (p - 1 + beta))
            assert cost.lower_bound(p, beta, 3.0, 2.0) == pytest.approx(want * 3.0 / 2.0)


def test_overhead_at_half_bandwidth_is_one_over_p_minus_one():
    for p in (4, 16, 64, 1024):
        ratio = cost.lower_bound(p, 0.5, 1, 1) / cost.fault_free_time(p, 1, 1)
        assert ratio == pytest.approx(1 + 1 / (p - 1))


def test_two_ranks_gain_nothing():
    for beta in (0.3, 0.5, 0.9):
        assert cost.lower_bound(2, beta, 1, 1) == pytest.approx(cost.equal_share_time(2, beta, 1, 1))


def test_straggler_share_matches_the_issue_formula_and_threshold():
    assert cost.straggler_share(4, 0.75) == pytest.approx(0.1)
    for p in (3, 4, 16, 1024):
        threshold = (p - 1) / (2 * p - 3)
        assert cost.straggler_share(p, threshold * 0.999) == 0
        assert cost.straggler_share(p, threshold * 1.001) > 0
        for beta in (0.3, 0.55, 0.8, 0.95):
            x = cost.optcc_shares(np.r_[np.ones(p - 1), beta])
            assert x[-1] == pytest.approx(cost.straggler_share(p, beta), abs=1e-12)
            assert x.sum() == pytest.approx(1)


@pytest.mark.parametrize("betas", [[1, 1, 0.75, 0.75], [1, 0.9, 0.6, 0.5, 1, 1], [0.5] * 3 + [1] * 13,
                                   [1, 0.2, 1, 1], [0.8] * 8])
def test_multi_straggler_shares_reach_the_bound(betas):
    b = np.asarray(betas, float)
    x = cost.optcc_shares(b)
    assert x.min() >= 0 and x.sum() == pytest.approx(1)
    bw = Bandwidth.degraded(len(b), 1.0, b)
    t = cost.owner_computes_time(x, bw, 1.0)
    assert t == pytest.approx(cost.lower_bound(len(b), b, 1.0, 1.0))
    # where the bound is the total-traffic term every rank is busy all the time: 1+(p-2)x_i = beta_i T
    if 2 * (len(b) - 1) / b.sum() >= 1 / b.min():
        assert np.allclose(1 + (len(b) - 2) * x, b * t)


def test_lower_bound_accepts_degraded_list_or_full_vector():
    assert cost.lower_bound(8, [0.5, 0.5], 1, 1) == cost.lower_bound(8, [1] * 6 + [0.5, 0.5], 1, 1)
    assert cost.lower_bound(1, 0.5, 1, 1) == 0
    with pytest.raises(UserError):
        cost.lower_bound(4, [0.5] * 5, 1, 1)
    with pytest.raises(UserError):
        cost.lower_bound(4, -1, 1, 1)


def test_lower_bound_with_distinct_in_and_out():
    bw = Bandwidth([1.0, 1.0, 1.0, 0.5], [1.0, 1.0, 0.8, 1.0])
    assert cost.lower_bound_of(bw, 1.0) == pytest.approx(max(2.0, 6 / 3.5))


@pytest.mark.parametrize("schedule", builders.SCHEDULES)
def test_traffic_formulas_match_the_plans(schedule):
    p, count = 6, 6000
    bw = Bandwidth.degraded(p, 1.0, {4: 0.5, 5: 0.5})
    plan = builders.build(schedule, p, count, bw=bw, chunks=3)
    out, inn = cost.schedule_traffic(schedule, bw)
    for r in range(p):
        prog = plan.program(r)
        sent = prog.length[prog.kind == SEND].sum() / count
        got = prog.length[prog.kind == RECV].sum() / count
        assert sent == pytest.approx(out[r], abs=1e-3) and got == pytest.approx(inn[r], abs=1e-3), r


def test_estimate_picks_sensible_chunks_and_latency_terms():
    free = cost.CostModel(alpha_s=0, overhead_s=0, reduce_Bps=0, min_piece_bytes=1, max_chunks=64)
    slow = Bandwidth.degraded(16, 1.0, {15: 0.5})
    e = cost.estimate("optcc", slow, 1.0e6, free)
    assert e.chunks == 64
    assert e.seconds == pytest.approx(cost.lower_bound(16, 0.5, 1e6, 1) * (1 + 1 / 64))
    balanced = Bandwidth.degraded(16, 1.0, {15: 0.75})  # the straggler owns a share: the fluid model needs no
    # fill, but one chunk of its traffic is charged anyway (few chunks measured slower on real sockets)
    e = cost.estimate("optcc", balanced, 1.0e6, free)
    x_s = cost.optcc_shares(balanced.betas)[15]
    assert e.chunks == 64 and x_s > 0
    assert e.seconds == pytest.approx(cost.lower_bound(16, 0.75, 1e6, 1) + (1 - x_s) / 64 * 1e6 / 0.75)
    lat = cost.CostModel(alpha_s=1e-3, overhead_s=0, reduce_Bps=0)
    uni = Bandwidth.uniform(4, 1e9)
    assert cost.estimate("one_shot", uni, 8, lat).seconds < cost.estimate("direct", uni, 8, lat).seconds
    assert cost.estimate("one_shot", uni, 1e8, lat).seconds > cost.estimate("direct", uni, 1e8, lat).seconds
    costly = cost.CostModel(alpha_s=0, overhead_s=1e-5, reduce_Bps=0, min_piece_bytes=1)
    fast_slow = Bandwidth.degraded(16, 1e9, {15: 0.5})  # T_LB = 2 ms; fill 2 ms/K vs 30 messages * 10 us * K
    assert cost.estimate("optcc", fast_slow, 1.0e6, costly).chunks == 3


def test_pipeline_fill_is_one_over_k_when_the_straggler_owns_nothing():
    bw = Bandwidth.degraded(8, 1.0, {7: 0.5})
    fill = cost.pipeline_fill("optcc", bw, 1.0, np.array([1, 2, 4]))
    assert np.allclose(fill, cost.lower_bound(8, 0.5, 1, 1) / np.array([1, 2, 4]))
    assert np.all(cost.pipeline_fill("direct", bw, 1.0, np.array([1, 2])) == 0)


def test_bandwidth_table_checks_and_quantizes():
    with pytest.raises(UserError):
        Bandwidth([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(UserError):
        Bandwidth([1.0], [1.0, 1.0])
    noisy = Bandwidth([1.0, 0.998, 0.503], [1.001, 1.0, 0.497])
    q = noisy.quantized(32)
    assert q.key() == Bandwidth([1.0, 1.0, 0.5], [1.0, 1.0, 0.5]).quantized(32).key()
    assert Bandwidth.degraded(3, 2.0, {2: 0.5}).classes() == [[0, 1], [2]]
