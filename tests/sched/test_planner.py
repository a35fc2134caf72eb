"""The planner: schedule choice by size and bandwidth, epochs, caching, forcing."""

import json

import pytest

from r2cc_serve.errors import UserError
from r2cc_serve.sched import cost
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.validate import validate
from r2cc_serve.sched.planner import Planner, bandwidth_from_rails, size_bucket

GBPS = 1.25e9


def _planner(p, betas=None, **kw):
    pl = Planner(p, **kw)
    pl.update_bandwidth(Bandwidth.degraded(p, GBPS, betas or {}))
    return pl


def test_small_messages_take_one_shot_large_take_direct():
    pl = _planner(4)
    assert pl.choose("all_reduce", 4096).schedule == "one_shot"
    assert pl.choose("all_reduce", 64 << 20).schedule == "direct"


def test_a_straggler_switches_large_messages_to_optcc():
    pl = _planner(4, {3: 0.5})
    c = pl.choose("all_reduce", 64 << 20)
    assert c.schedule == "optcc" and c.chunks > 1
    assert c.estimates["optcc"] < c.estimates["direct"]
    plan = pl.plan("all_reduce", (64 << 20) // 4)
    assert plan.schedule == "optcc" and plan.info["shares"][3] == 0
    small = pl.plan("all_reduce", 1000)
    validate(small)


def test_partial_sum_schedules_only_beyond_sixteen_ranks():
    assert "ring" not in _planner(16, {15: 0.5}).choose("all_reduce", 1 << 26).estimates
    assert "ring" in _planner(17, {16: 0.5}).choose("all_reduce", 1 << 26).estimates
    with pytest.raises(UserError, match="bit-identical"):
        Planner(8, force="ring")


def test_force_a_schedule_for_tests():
    pl = _planner(4, {3: 0.5}, force="direct")
    assert pl.choose("all_reduce", 64 << 20).schedule == "direct"
    with pytest.raises(UserError):
        Planner(4, force="fastest")


def test_noise_keeps_the_epoch_a_real_change_advances_it():
    pl = Planner(4)
    e0 = pl.update_bandwidth(Bandwidth.uniform(4, GBPS))
    assert pl.update_bandwidth(Bandwidth([GBPS, GBPS * 0.995, GBPS, GBPS], [GBPS] * 4)) == e0
    first = pl.plan("all_reduce", 1 << 20)
    assert pl.plan("all_reduce", 1 << 20) is first  # cached
    e1 = pl.update_bandwidth(Bandwidth.degraded(4, GBPS, {2: 0.5}))
    assert e1 == e0 + 1
    assert pl.plan("all_reduce", 1 << 20) is not first
    assert pl.plan("all_reduce", 1 << 20).info["epoch"] == e1


def test_choices_are_cached_per_size_bucket():
    pl = _planner(8, {7: 0.5})
    a = pl.choose("all_reduce", 3 << 20)
    assert pl.choose("all_reduce", (3 << 20) + 100) is a  # same power-of-two bucket
    assert size_bucket(4096) == 12 and size_bucket(4097) == 13 and size_bucket(0) == 0
    info = pl.describe()
    json.dumps(info)
    assert info["epoch"] == 1 and info["choices"][0]["schedule"] == a.schedule


def test_every_rank_gets_the_same_plan_from_the_same_table():
    tables = [Bandwidth.degraded(6, GBPS, {5: 0.52}), Bandwidth.degraded(6, GBPS * 1.001, {5: 0.5})]
    plans = []
    for bw in tables:
        pl = Planner(6)
        pl.update_bandwidth(bw)
        plans.append(pl.plan("all_reduce", 300000))
    assert plans[0].schedule == plans[1].schedule
    for r in range(6):
        assert plans[0].program(r).encode() == plans[1].program(r).encode()


def test_bad_input():
    with pytest.raises(UserError):
        _planner(4).choose("all_gather", 100)
    with pytest.raises(UserError):
        Planner(4).update_bandwidth(Bandwidth.uniform(3, 1.0))
    with pytest.raises(UserError):
        Planner(0)


def test_bandwidth_from_rails_sums_healthy_rails():
    bw = bandwidth_from_rails([[1e9, 1e9], [1e9], [2e9]])
    assert bw.link_Bps.tolist() == [2e9, 1e9, 2e9]
    assert cost.split_degraded(bw)[0] == [1]


def test_single_rank_group():
    pl = Planner(1)
    plan = pl.plan("all_reduce", 10)
    validate(plan)
