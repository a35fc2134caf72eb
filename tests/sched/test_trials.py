"""Measured trials (r2cc_serve.sched.trials): alternation, the verdict by the slowest rank, staleness."""

import pytest

from r2cc_serve.errors import UserError
from r2cc_serve.sched.cost import CostModel
from r2cc_serve.sched.group import GroupSchedule
from r2cc_serve.sched.trials import Trials


def test_alternates_then_keeps_the_faster_by_the_slowest_rank():
    t = Trials(calls=4)
    key = (21, 4, 1)
    picks = []
    for i in range(4):
        picks.append(t.pick(key, "optcc", "direct"))
        assert t.observe(key, picks[-1], 0.010 if picks[-1] == "optcc" else 0.012) == (i == 3)
    assert picks == ["optcc", "direct", "optcc", "direct"]
    assert t.my_medians_us(key) == [10000, 12000]
    # rank 1 saw optcc at 15 ms: the slowest rank sets each schedule's time, so direct stays
    assert t.decide(key, [[10000, 12000], [15000, 12500]]) == "direct"
    assert [t.pick(key, "optcc", "direct") for _ in range(3)] == ["direct"] * 3
    assert not t.observe(key, "direct", 0.01)  # decided: no more bookkeeping
    assert t.describe()[0]["kept"] == "direct" and t.describe()[0]["modeled_s"] == 0.015


def test_no_trial_when_the_model_agrees_or_trials_are_off():
    assert Trials(4).pick((10, 4, 0), "one_shot", "one_shot") == "one_shot"
    off = Trials(0)
    assert off.pick((21, 4, 0), "optcc", "direct") == "optcc" and not off.observe((21, 4, 0), "optcc", 1.0)
    with pytest.raises(UserError, match="even"):
        Trials(3)


def test_a_new_epoch_forgets_old_verdicts():
    t = Trials(2)
    for epoch in (1, 2):
        for s in ("optcc", "direct"):
            t.observe((21, 4, epoch), t.pick((21, 4, epoch), "optcc", "direct"), 0.01)
    t.forget_before(2)
    assert [d["size_bucket_bytes"] for d in t.describe()] == [1 << 21]


def test_group_schedule_runs_the_baseline_unchunked_during_a_trial():
    compiled = []
    g = GroupSchedule(0, 4, "auto", lambda b: compiled.append(b) or len(compiled), trial_calls=2,
                      model=CostModel(alpha_s=80e-6, overhead_s=20e-6))  # the knobs' defaults
    assert g.exchange_due(2 << 20)
    g.install([4e8, 4e8, 4e8, 2e8])  # rank 3 lost half its rails: the model wants optcc at 2 MiB
    count = (2 << 20) // 4
    s1, key, builtin1 = g.select(count, 4)
    assert not g.observe(key, s1, 0.05)
    s2, _, builtin2 = g.select(count, 4)
    assert g.observe(key, s2, 0.04)
    assert (s1, s2, builtin1, builtin2) == ("optcc", "direct", False, True)  # the baseline runs the C++ path
    assert g.program_for(count, 4, "direct") != g.program_for(count, 4, "optcc") and len(compiled) == 2
    assert g.decide(key, [[50000, 40000]] * 4) == "direct"
    assert g.select(count, 4) == ("direct", key, True)
    assert g.describe()["trials"][0]["kept"] == "direct"
    assert g.select(1024, 4)[0::2] == ("one_shot", True)  # small: the model agrees with the baseline, no trial
