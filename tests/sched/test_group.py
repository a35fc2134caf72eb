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
