"""What keeps every rank on the same plan: exchange points, tables, the program cache."""

import numpy as np
import pytest

from r2cc_serve.errors import UserError
from r2cc_serve.sched.group import (Agreement, GroupSchedule, builtin_schedule, capacity_from_rails, one_shot_cutoff,
                                    parse_table)


def test_exchange_points_depend_only_on_the_calls():
    by_calls = Agreement(3, refresh_calls=4, refresh_bytes=1 << 20)
    assert [by_calls.due(16) for _ in range(9)] == [True, False, False, False] * 2 + [True]
    by_bytes = Agreement(3, refresh_calls=100, refresh_bytes=1 << 20)
    sizes = [16, 400_000, 400_000, 400_000, 16, 2 << 20, 2 << 20, 16, 16]
    # the budget is reached by three 400 KB calls; a call over the budget exchanges before it
    # runs, and the one after it too (the budget ran on that table)
    assert [by_bytes.due(s) for s in sizes] == [True, False, False, False, True, True, True, True, False]


def test_pairs_exchange_whole_inputs_up_to_their_own_cut_off():
    # Between two ranks one exchange moves no more bytes than reduce-scatter + all-gather, so
    # the built-in path runs it up to the pair cut-off; larger groups keep the general one.
    pair, group = one_shot_cutoff(2, 32 << 10, 512 << 10), one_shot_cutoff(3, 32 << 10, 512 << 10)
    assert (pair, group) == (512 << 10, 32 << 10)
    assert builtin_schedule(256 << 10, pair) == "one_shot" and builtin_schedule(256 << 10, group) == "direct"
    assert builtin_schedule((512 << 10) + 1, pair) == "direct"


def test_static_table_fractions_scale_to_a_full_rank():
    bw = parse_table("1, 1, 0.5", 3, full_Bps=100.0)
    assert bw.out_Bps.tolist() == [100.0, 100.0, 50.0] and bw.betas.tolist() == [1, 1, 0.5]
    assert parse_table("2e9,1e9", 2).out_Bps.tolist() == [2e9, 1e9]  # bytes/s as given
    assert parse_table("", 4) is None
    with pytest.raises(UserError, match="3 ranks"):
        parse_table("1,1", 3)


def test_capacity_counts_rails_up_to_some_peer():
    states = [(0, "up"), (0, "up"), (1, "down"), (1, "up"), (2, "down"), (2, "down"), (3, "up")]
    assert capacity_from_rails(states, primary_rails=3, rail_Bps=10.0) == 20  # rail 3 is a fallback
    assert capacity_from_rails([(0, "down")], primary_rails=1, rail_Bps=10.0) == 1  # never zero


def _group(schedule, table="", p=4, rank=0):
    compiled = []

    def compile(encoded):
        compiled.append(encoded)
        return len(compiled)
    return GroupSchedule(rank, p, schedule, compile, table, full_Bps=4e9), compiled


def test_programs_are_compiled_once_per_plan_and_epoch():
    g, compiled = _group("auto")
    assert g.exchange_due(64 << 20)
    g.install([4e9, 4e9, 4e9, 4e9])
    first = g.program((64 << 20) // 4, 4)
    assert g.program((64 << 20) // 4, 4) == first and len(compiled) == 1
    assert g.describe()["choices"][0]["schedule"] == "direct"
    epoch = g.install([4e9, 4e9, 4e9, 2e9])  # a host lost 2 of 4 rails: new epoch, new plan
    assert epoch == g.planner.epoch and g.program((64 << 20) // 4, 4) != first
    assert g.describe()["choices"][-1]["schedule"] == "optcc"


def test_forced_plans_need_no_exchange_and_every_rank_builds_the_same():
    direct, _ = _group("direct")
    assert not direct.exchange_due(64 << 20)
    shares = {r: _group("optcc", "1,1,1,0.5", rank=r)[0].planner.plan("all_reduce", 1 << 20).info["shares"]
              for r in range(4)}
    assert all(s == shares[0] for s in shares.values()) and shares[0][3] == 0
    with pytest.raises(UserError, match="bit-identical"):
        _group("ring")
    assert np.isclose(sum(shares[0]), 1.0)


class _FakeGroup:
    """The gather callback of four ranks in step, seen from rank 0: it records what rank 0
    gathers and answers what the other ranks would have sent."""

    def __init__(self, capacities, medians_us):
        self.capacities, self.medians_us, self.sent = capacities, medians_us, []

    def gather(self, mine):
        self.sent.append(list(mine))
        if len(mine) == 1:  # capacities
            return [[c] for c in self.capacities]
        return [list(m) for m in self.medians_us]  # a trial's (modeled, baseline) medians


def test_one_call_runs_the_exchange_the_trial_and_its_verdict():
    from r2cc_serve.sched.cost import CostModel

    compiled = []
    g = GroupSchedule(0, 4, "auto", lambda b: compiled.append(b) or len(compiled), trial_calls=2,
                      model=CostModel(alpha_s=80e-6, overhead_s=20e-6))
    group = _FakeGroup([4e8, 4e8, 4e8, 2e8], [[50000, 40000]] * 4)  # rank 3 lost half its rails
    count = (2 << 20) // 4
    asked = []
    ran = []
    for _ in range(3):
        with g.all_reduce(count, 4, group.gather, lambda: asked.append(1) or 4e8) as program:
            ran.append(program)
    # The first call exchanges capacities; the model wants optcc, so the trial alternates it with
    # the baseline (None: the built-in path), then the ranks compare medians and keep direct.
    assert len(asked) == 1 and group.sent[0] == [4e8]
    assert len(group.sent) == 2 and len(group.sent[1]) == 2  # rank 0's own (modeled, baseline) medians
    assert ran[0] == 1 and ran[1] is None and ran[2] is None and len(compiled) == 1
    assert g.describe()["trials"][0]["kept"] == "direct"
    report = g.ran(count, 4)
    assert (report["schedule"], report["path"], report["chunks"]) == ("direct", "builtin", 1)


def test_a_call_that_raises_is_neither_timed_nor_reported():
    g = GroupSchedule(0, 4, "auto", lambda b: b, trial_calls=2)
    group = _FakeGroup([4e8, 4e8, 4e8, 2e8], [[1, 2]] * 4)
    with pytest.raises(RuntimeError):
        with g.all_reduce(1 << 19, 4, group.gather, lambda: 4e8):
            raise RuntimeError("the transport failed")
    assert g.ran(1 << 19, 4) is None and not any(t["kept"] for t in g.describe()["trials"])
    assert len(group.sent) == 1  # the exchange before it, no trial verdict after


def test_the_report_rebuilds_the_program_that_ran():
    from r2cc_serve.sched.group import builtin_report, plan_of

    for rank in range(4):
        g, compiled = _group("optcc", "1,1,1,0.5", rank=rank)
        with g.all_reduce(1 << 20, 4, lambda mine: pytest.fail("a static table needs no gather"), lambda: 0) as prog:
            assert prog == 1
        report = g.ran(1 << 20, 4)
        assert report["path"] == "plan" and report["chunks"] >= 1 and report["bandwidth_Bps"]["out"][3] < report[
            "bandwidth_Bps"]["out"][0]
        assert plan_of(report, 4).program(rank).encode() == compiled[0]
    assert g.ran(1 << 10, 4) is None  # no call of that shape ran
    small = builtin_report(1 << 10, 4, one_shot_bytes=32 << 10, slice_bytes=4 << 20)
    assert (small["schedule"], small["path"], small["bandwidth_Bps"]) == ("one_shot", "builtin", None)
    assert plan_of(small, 4).summary()["schedule"] == "one_shot"


def test_two_ranks_keep_the_builtin_path_and_the_knobs_set_a_group_schedule(monkeypatch):
    from r2cc_serve.sched.group import runs_builtin

    assert runs_builtin("builtin", 4, "") and runs_builtin("auto", 2, "")
    assert not runs_builtin("auto", 2, "1,0.5") and not runs_builtin("auto", 3, "") and not runs_builtin("direct", 2, "")
    monkeypatch.setenv("R2CC_PLAN_TRIAL_CALLS", "4")
    monkeypatch.setenv("R2CC_PLAN_REFRESH_CALLS", "7")
    g = GroupSchedule.from_knobs(0, 4, "auto", lambda b: b, full_Bps=1e9, one_shot_bytes=1 << 10)
    assert (g.trials.calls, g.agreement.refresh_calls, g.one_shot_bytes) == (4, 7, 1 << 10)
