"""The one fault notation with its time: h<HOST>:<RAIL>:<KIND>[:ARGS][@WHEN][+FOR], as every command reads it."""

import subprocess
import sys

import pytest

from r2cc_serve.errors import UserError
from r2cc_testbed.faults.model import FaultSchedule, FaultSpec, parse_timed
from r2cc_testbed.faults.timing import looks_like_notation, parse_seconds
from r2cc_testbed.serving.fault_experiment import parse_option
from r2cc_testbed.serving.serve_prefill import parse_holds


def test_when_and_for_how_long():
    t = parse_timed("h0:1:lossy:5%@3s+10s")
    assert (t.spec.kind, t.spec.host, t.spec.rail, t.spec.loss_pct, t.spec.after_s, t.spec.hold_s, t.share) == (
        "lossy", 0, 1, 5.0, 3.0, 10.0, None)
    assert parse_timed("h1:all-down@30%", at="share").share == 0.3
    assert parse_timed("h0:2:degrade:100mbit+20s").spec.hold_s == 20.0  # no @: the command's own moment
    assert parse_timed("h0:2:down@500ms").spec.after_s == 0.5
    assert parse_timed("h0:2:down@1min+2").spec.hold_s == 2.0 and parse_timed("h0:2:down@1min").spec.after_s == 60
    assert parse_timed(" h0:3:flap:200:3 ").spec == FaultSpec("flap", 0, 3, period_ms=200, count=3)
    assert parse_seconds("2.5s", "x") == 2.5
    # Left out: None, for the command to fill.
    plain = parse_timed("h0:1:down")
    assert (plain.spec.after_s, plain.spec.hold_s, plain.share) == (None, None, None)
    assert plain.with_defaults(3.0, 5.0) == FaultSpec("down", 0, 1, after_s=3.0, hold_s=5.0)
    assert parse_timed("h0:1:down@1s").with_defaults(3.0, 5.0).after_s == 1.0


@pytest.mark.parametrize("text, opts, msg", [
    ("h0:1:down@30%", {}, "a share of an op is for r2cc bench; give seconds"),
    ("h0:1:down@3s", {"at": "share"}, "give a share of its duration like @30%"),
    ("h0:1:down@3s", {"at": "none"}, "whole run; leave out @WHEN"),
    ("h0:1:down+3s", {"hold": False}, "whole run; leave out \\+FOR"),
    ("h0:1:down@soon", {}, "@WHEN 'soon' is not a time"),
    ("h0:1:down+0s", {}, "more than 0 s"),
    ("h0:1:down@3s@4s", {}, "not valid: use h<HOST>"),
    ("h0:1:explode@3s", {}, "unknown fault kind 'explode'"),
    ("h0:1:drain@1s", {"kinds": ("down",)}, "'drain' cannot be used here"),
])
def test_bad_timing_is_one_line_naming_the_form(text, opts, msg):
    kinds = opts.pop("kinds", None)
    with pytest.raises(UserError, match=msg) as exc:
        parse_timed(text, kinds, **opts) if kinds else parse_timed(text, **opts)
    assert str(exc.value).startswith(f"fault {text!r}: ") and "\n" not in str(exc.value)


def test_notation_is_told_from_the_older_kind_form():
    assert looks_like_notation("h0:1:down") and looks_like_notation("1:2:down") and looks_like_notation("h1:all-down")
    assert not looks_like_notation("down") and not looks_like_notation("degrade:100mbit")


def test_demo_and_serve_bench_take_both_forms():
    new = parse_option("h1:2:degrade:100mbit@2s+8s", host=0, rail=0, after_s=3, hold_s=5)
    assert (new.host, new.rail, new.rate, new.after_s, new.hold_s) == (1, 2, "100mbit", 2.0, 8.0)
    # @ and + left out: the command's defaults.
    assert parse_option("h0:3:down", host=0, rail=0, after_s=3, hold_s=5).hold_s == 5
    old = parse_option("degrade:100mbit", host=0, rail=1, after_s=3, hold_s=5)
    assert old == FaultSpec("degrade", 0, 1, rate="100mbit", after_s=3, hold_s=5)
    with pytest.raises(UserError, match="already says what --rail would: give it once"):
        parse_option("h0:1:down", host=0, rail=2, after_s=3, hold_s=5, given={"rail": "--rail"})
    with pytest.raises(UserError, match="--hold would"):
        parse_option("h0:1:down+4s", host=0, rail=2, after_s=3, hold_s=5, given={"hold": "--hold"})
    # --hold beside a notation without + is fine: it says how long.
    assert parse_option("h0:1:down", host=0, rail=0, after_s=3, hold_s=9, given={"hold": "--hold"}).hold_s == 9


def test_serve_prefill_faults_stay_for_the_run():
    (h,) = parse_holds(["h3:2:degrade:100mbit"], 4, 4)
    assert (h.host, h.rail, h.rate) == (3, 2, "100mbit")
    with pytest.raises(UserError, match="leave out @WHEN"):
        parse_holds(["h3:2:down@3s"], 4, 4)


def test_schedule_entries_in_the_notation_and_their_undo():
    sched = FaultSchedule.parse(["h0:1:lossy:5%@3s+10s", {"at": 5, "do": "h0:2:down"}, "h1:all-down@6s+1.5s",
                                 "h0:3:drain@7s+1s"])
    run = sched.check(hosts=2, rails=4)
    assert [(s.after_s, s.notation) for s in run.entries] == [
        (3.0, "h0:1:lossy:5"), (5.0, "h0:2:down"), (6.0, "h1:all-down"),
        (7.0, "h0:3:drain"), (7.5, "h1:0:clear"), (7.5, "h1:1:clear"), (7.5, "h1:2:clear"), (7.5, "h1:3:clear"),
        (8.0, "h0:3:undrain"), (13.0, "h0:1:clear")]
    assert all(s.hold_s is None for s in run.entries)
    assert FaultSchedule.parse(run.to_list()) == run  # what the fault daemon is sent reads back
    for entries, msg in [(["h0:1:down"], "add @SECONDS"), (["h0:1:flap@1s+2s"], "flap is not undone later"),
                         (["h0:1:up@1s+2s"], "up is not undone later"),
                         ([{"at": 1, "do": "h0:1:down@2s"}], "`at` already gives the time")]:
        with pytest.raises(UserError, match=msg):
            FaultSchedule.parse(entries)


def test_lab_fault_cli_refuses_bad_input_before_touching_a_lab():
    for argv, msg in [(["h0", "1"], "is not a fault"), (["h0:1:flap+3s"], "flap is not undone later"),
                      (["h0:1:down@30%"], "give seconds into the run")]:
        r = subprocess.run([sys.executable, "-m", "r2cc_serve.cli", "lab", "fault", *argv], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)
