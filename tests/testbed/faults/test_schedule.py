"""The scheduler of timed faults: steps in time order, played at their moments, and faults held
until undone, also when what runs in between fails. Pure (a fake apply, no lab)."""

from __future__ import annotations

import threading
import time

import pytest

from r2cc_testbed.faults.model import FaultSchedule, parse_fault_text
from r2cc_testbed.faults.schedule import HeldFaults, expand, play, play_flap, undo_faults


def test_steps_are_played_in_time_order_at_their_moments():
    sched = FaultSchedule.parse([{"at": 0.5, "do": "h0:1:down"}, {"at": 0.5, "do": "h0:2:flap:200:2"},
                                 {"at": 0.55, "do": "h1:3:blackhole"}, {"at": 1.0, "do": "h0:1:up"}])
    waited, done = [], []

    def wait_until(due):
        waited.append(round(due - 10.0, 3))
        return None

    assert play(expand(sched.entries), 10.0, lambda n, s: done.append((n, s.kind, s.rail)), wait_until) == "finished"
    assert waited == [0.5, 0.5, 0.55, 0.6, 0.7, 0.8, 1.0]  # flap: down and up half a period apart
    assert [d[1:] for d in done] == [("down", 1), ("down", 2), ("blackhole", 3), ("up", 2), ("down", 2),
                                     ("up", 2), ("up", 1)]
    assert [d[0] for d in done] == list(range(7))


def test_a_stop_ends_the_play_before_the_step_it_waited_for():
    steps = expand(FaultSchedule.parse([{"at": 0, "do": "h0:1:down"}, {"at": 1, "do": "h0:1:up"}]).entries)
    done = []
    outcome = play(steps, 0.0, lambda n, s: done.append(s.kind), lambda due: "aborted" if due >= 1 else None)
    assert outcome == "aborted" and done == ["down"]


def test_a_late_step_does_not_move_the_next_ones():
    steps = expand(FaultSchedule.parse([{"at": 0.0, "do": "h0:1:down"}, {"at": 0.05, "do": "h0:1:up"}]).entries)
    times = []

    def slow(n, step):
        times.append(time.monotonic())
        if n == 0:
            time.sleep(0.1)  # the first step overruns the second's moment

    t0 = time.monotonic()
    play(steps, t0, slow)
    assert times[1] - times[0] < 0.15  # done at once, not 0.05 s after the late one


def test_a_flap_lasts_its_cycles_and_ends_up():
    spec = parse_fault_text("h0:1:flap:40:3")
    seen = []
    t0 = time.monotonic()
    play_flap(spec, lambda n, s: seen.append((round(time.monotonic() - t0, 2), s.kind)))
    assert [k for _, k in seen] == ["down", "up"] * 3
    assert time.monotonic() - t0 >= spec.duration_s  # returns after the last half period, link up
    assert all(at >= n * 0.02 for n, (at, _) in enumerate(seen))  # never early (exact moments: above)


class FakeLab:
    rails = 4

    def __init__(self, fail: set[str] = frozenset()):
        self.done: list[str] = []
        self.fail = fail

    def inject(self, spec, background=False):
        self.done.append(spec.notation)
        if spec.notation in self.fail:
            raise RuntimeError(f"{spec.notation} failed")
        if spec.kind == "flap" and background:
            thread = threading.Thread(target=time.sleep, args=(spec.duration_s,))
            thread.start()
            return thread
        return None


def test_held_faults_are_undone_at_the_end_even_on_error():
    lab = FakeLab()
    with pytest.raises(ValueError, match="the load failed"):
        with HeldFaults.on_lab(lab) as held:
            held.hold(parse_fault_text("h0:1:down"))
            held.hold(parse_fault_text("h1:all-down"))
            raise ValueError("the load failed")
    assert lab.done == ["h0:1:down", "h1:all-down", "h0:1:clear", "h1:0:clear", "h1:1:clear", "h1:2:clear",
                        "h1:3:clear"]


def test_undo_goes_on_after_a_failure_and_happens_once():
    lab = FakeLab(fail={"h1:1:clear"})
    errors = []
    held = HeldFaults.on_lab(lab, on_error=lambda spec, exc: errors.append((spec.notation, str(exc))))
    held.hold(parse_fault_text("h1:all-down"))
    held.undo()
    assert lab.done[1:] == [f"h1:{k}:clear" for k in range(4)]
    assert errors == [("h1:1:clear", "h1:1:clear failed")]
    held.undo()  # nothing left to undo
    assert len(lab.done) == 5


def test_without_on_error_the_first_failure_is_raised_once_every_rail_is_undone():
    lab = FakeLab(fail={"h1:0:clear", "h1:2:clear"})
    with pytest.raises(RuntimeError, match="h1:0:clear"):
        undo_faults([parse_fault_text("h1:all-down")], lambda s, bg: lab.inject(s, bg), lab.rails)
    assert lab.done == [f"h1:{k}:clear" for k in range(4)]


def test_a_fault_that_failed_to_apply_is_undone_too():
    lab = FakeLab(fail={"h0:2:blackhole"})
    held = HeldFaults.on_lab(lab)
    with pytest.raises(RuntimeError):
        held.hold(parse_fault_text("h0:2:blackhole"))
    held.undo()
    assert lab.done == ["h0:2:blackhole", "h0:2:clear"]


def test_a_held_flap_is_let_finish_before_it_is_cleared():
    lab = FakeLab()
    held = HeldFaults.on_lab(lab)
    thread = held.hold(parse_fault_text("h0:3:flap:100:2"), background=True)
    held.undo()
    assert not thread.is_alive() and lab.done == ["h0:3:flap:100:2", "h0:3:clear"]
