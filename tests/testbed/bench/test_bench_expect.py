"""`r2cc bench --schedule`: the bound and the simulator's prediction printed beside each row."""

import pytest

from r2cc_testbed.bench import spec
from r2cc_testbed.bench.expect import add_expectations, host_line_Bps, schedule_table
from r2cc_serve.errors import UserError
from r2cc_serve.sched import cost
from r2cc_serve.sched.builders import DEFAULT_SLICE_BYTES
from r2cc_serve.sched.group import GroupSchedule, builtin_report

M = 64 << 20
RAIL = 250e6 / 8


def test_held_faults_set_each_hosts_capacity():
    got = host_line_Bps(4, 4, "250mbit", ["h3:2:down", "h3:3:blackhole", "h1:0:degrade:125mbit"])
    assert got == [4 * RAIL, 3.5 * RAIL, 4 * RAIL, 2 * RAIL]


def test_schedule_flags_are_checked():
    assert spec.parse_schedules("direct, optcc", "all_reduce", ["r2cc"]) == ["direct", "optcc"]
    assert spec.parse_schedules(None, "all_gather", ["gloo"]) == []
    for text, op, backends in (("fastest", "all_reduce", ["r2cc"]), ("direct,direct", "all_reduce", ["r2cc"]),
                               ("optcc", "all_gather", ["r2cc"]), ("optcc", "all_reduce", ["gloo"])):
        with pytest.raises(UserError):
            spec.parse_schedules(text, op, backends)
    with pytest.raises(UserError):
        spec.parse_hold("h3:2:flap", 4, 4)


def _row(schedule, p50, capacities, kept_wins_by_us=(30000, 40000)):
    """A row as the workers report it: sched/'s own report of what ran, after a trial whose
    gathered (modeled, baseline) medians are ``kept_wins_by_us`` on every rank."""
    row = {"backend": "r2cc", "bytes": M, "p50_s": p50, "schedule": schedule}
    if schedule == "builtin":
        row["plan"] = {"schedule": "builtin"}
        row["plan_ran"] = builtin_report(M // 4, 4, one_shot_bytes=32 << 10, slice_bytes=DEFAULT_SLICE_BYTES)
        return row
    g = GroupSchedule(0, 4, schedule, lambda b: b, full_Bps=4 * RAIL, trial_calls=2)

    def gather(mine):  # the other ranks' capacities, or the trial's medians
        return [[c] for c in capacities] if len(mine) == 1 else [list(kept_wins_by_us)] * 4
    for _ in range(3):
        with g.all_reduce(M // 4, 4, gather, lambda: capacities[0]):
            pass
    row["plan"], row["plan_ran"] = g.describe(), g.ran(M // 4, 4)
    return row


def test_rows_get_the_bound_the_simulator_and_speedups():
    caps = [4 * RAIL] * 3 + [2 * RAIL]
    report = {"hosts": 4, "rails": 4, "rate": "250mbit", "mtu": 1500, "held_faults": ["h3:2:down", "h3:3:down"],
              "results": [_row("builtin", 1.6, caps), _row("direct", 1.6, caps), _row("auto", 1.15, caps)]}
    add_expectations(report)
    builtin, direct, auto = report["results"]
    lb = cost.lower_bound(4, 0.5, M, 4 * RAIL)
    assert builtin["t_lb_s"] == pytest.approx(lb) and auto["t_lb_s"] == pytest.approx(lb)
    share = (1500 - 52) / (1500 + 14)
    # direct under a beta 0.5 straggler: the equal-share closed form, at the payload rate
    assert direct["sim_s"] == pytest.approx(cost.equal_share_time(4, 0.5, M, 4 * RAIL * share), rel=1e-6)
    assert auto["sim_plan"]["schedule"] == "optcc"
    assert lb / share < auto["sim_s"] < lb / share * 1.05  # T_LB plus the pipelining term
    assert auto["speedup_vs_builtin"] == pytest.approx(1.6 / 1.15)
    assert "optcc K=" in schedule_table(report)


def test_an_auto_row_whose_trial_kept_the_builtin_choice_is_simulated_as_that():
    caps = [4 * RAIL] * 3 + [2 * RAIL]
    row = _row("auto", 1.6, caps, kept_wins_by_us=(1900000, 1600000))  # the model's optcc lost its trial
    assert row["plan"]["trials"][0]["kept"] == "direct"
    report = {"hosts": 4, "rails": 4, "rate": "250mbit", "mtu": 1500, "held_faults": ["h3:2:down", "h3:3:down"],
              "results": [row]}
    add_expectations(report)
    assert row["sim_plan"]["schedule"] == "direct"  # what the ranks ran, not the model's proposal


def test_a_row_without_a_report_gets_no_simulation():
    row = {"backend": "r2cc", "bytes": M, "p50_s": 1.0, "schedule": "auto", "plan_ran": None}
    report = {"hosts": 4, "rails": 4, "rate": "250mbit", "mtu": 1500, "results": [row]}
    add_expectations(report)
    assert "sim_s" not in row and row["t_lb_s"] > 0
