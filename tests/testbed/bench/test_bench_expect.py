"""`r2cc bench --schedule`: the bound and the simulator's prediction printed beside each row."""

import pytest

from r2cc_testbed.bench import spec
from r2cc_testbed.bench.expect import add_expectations, host_line_Bps, schedule_table
from r2cc_serve.errors import UserError
from r2cc_serve.sched import cost
from r2cc_serve.sched.group import GroupSchedule

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


def _row(schedule, p50, capacities):
    row = {"backend": "r2cc", "bytes": M, "p50_s": p50, "schedule": schedule}
    if schedule != "builtin":
        g = GroupSchedule(0, 4, schedule, lambda b: None, full_Bps=4 * RAIL)
        if g.agreement:
            g.install(capacities)
        g.program(M // 4, 4)
        row["plan"] = g.describe()
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
    row = _row("auto", 1.6, caps)
    bucket = row["plan"]["choices"][0]["size_bucket_bytes"]
    row["plan"]["trials"] = [{"size_bucket_bytes": bucket, "elem_bytes": 4, "modeled": "optcc", "baseline": "direct",
                              "kept": "direct", "modeled_s": 1.9, "baseline_s": 1.6}]
    report = {"hosts": 4, "rails": 4, "rate": "250mbit", "mtu": 1500, "held_faults": ["h3:2:down", "h3:3:down"],
              "results": [row]}
    add_expectations(report)
    assert row["sim_plan"]["schedule"] == "direct"  # what the ranks ran, not the model's proposal
