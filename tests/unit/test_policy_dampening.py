"""Flap dampening as a value (csrc/dampening.h, bound as r2cc_serve._C.policy.Dampening): failures
in, hold decisions out, every threshold just under and just over. Times are ns."""

import pytest

from r2cc_serve._C import policy

S = 1_000_000_000
MS = 1_000_000
T0 = 1_000 * S  # any clock reading; the policy only subtracts


def defaults():
    return policy.Dampening(threshold=2.0, half_life_s=60.0, hold_s=10.0, hold_max_s=300.0)


def test_threshold_zero_never_counts_nor_holds():
    d = policy.Dampening(threshold=0.0)
    for i in range(10):
        assert d.note_failure(T0 + i) == "ignored"
    assert d.penalty(T0 + 10) == 0 and not d.holding(T0 + 10)


def test_the_failure_that_reaches_the_threshold_holds():
    d = defaults()
    assert d.note_failure(T0) == "counted"
    assert d.penalty(T0) == 1.0
    assert d.note_failure(T0) == "hold"  # penalty 2 >= threshold 2
    assert d.penalty_at_last_failure() == 2.0


def test_a_penalty_just_under_the_threshold_does_not_hold():
    d = defaults()
    d.note_failure(T0)
    assert d.note_failure(T0 + 1 * MS) == "counted"  # 1 decayed a little + 1 < 2
    assert d.penalty_at_last_failure() < 2.0
    assert d.note_failure(T0 + 2 * MS) == "hold"


def test_penalty_halves_every_half_life():
    d = defaults()
    d.note_failure(T0)
    assert d.penalty(T0 + 60 * S) == pytest.approx(0.5)
    assert d.penalty(T0 + 120 * S) == pytest.approx(0.25)
    assert policy.Dampening(half_life_s=0.0).penalty(T0) == 0  # nothing yet
    no_decay = policy.Dampening(half_life_s=0.0)
    no_decay.note_failure(T0)
    assert no_decay.penalty(T0 + 3600 * S) == 1.0  # half-life 0: no decay


def test_hold_time_doubles_per_level_up_to_the_cap():
    d = defaults()
    assert [d.hold_ns(level) // S for level in range(1, 7)] == [10, 20, 40, 80, 160, 300]
    assert policy.Dampening(hold_s=10.0, hold_max_s=25.0).hold_ns(2) == 20 * S
    assert policy.Dampening(hold_s=10.0, hold_max_s=25.0).hold_ns(3) == 25 * S


def test_a_hold_lasts_its_quiet_time_exactly():
    d = defaults()
    d.start_hold(T0, "why")
    assert d.level == 1 and d.reason == "why"
    assert d.holding(T0 + 10 * S - 1) and not d.hold_expired(T0 + 10 * S - 1)
    assert not d.holding(T0 + 10 * S) and d.hold_expired(T0 + 10 * S)
    assert d.hold_left_ns(T0 + 4 * S) == 6 * S
    assert d.hold_left_ns(T0 + 10 * S) == 0


def test_a_failure_during_a_hold_restarts_its_quiet_time_at_the_same_level():
    d = defaults()
    d.note_failure(T0)
    assert d.note_failure(T0) == "hold"
    d.start_hold(T0, "flapping")
    assert d.note_failure(T0 + 5 * S) == "extended"
    assert d.level == 1
    assert d.hold_left_ns(T0 + 5 * S) == 10 * S
    assert d.extend(T0 + 14 * S) and d.hold_left_ns(T0 + 14 * S) == 10 * S
    assert not d.extend(T0 + 24 * S)  # the hold ran out: nothing to extend
    assert not d.holding(T0 + 24 * S)


def test_holds_in_a_row_double_while_the_penalty_stays_at_half_the_threshold_or_more():
    d = defaults()
    d.note_failure(T0)
    d.note_failure(T0)
    d.start_hold(T0, "first")
    assert d.end_hold(T0 + 10 * S, "its time is up")
    # The penalty (2 at T0) decays to 1 = threshold / 2 at T0 + 60 s: just before, the level stays.
    assert d.note_failure(T0 + 60 * S - 10 * MS) == "hold"
    d.start_hold(T0 + 60 * S, "second")
    assert d.level == 2 and d.hold_left_ns(T0 + 60 * S) == 20 * S


def test_the_level_starts_afresh_once_the_penalty_fell_under_half_the_threshold():
    d = defaults()
    d.note_failure(T0)
    d.note_failure(T0)
    d.start_hold(T0, "first")
    d.end_hold(T0 + 10 * S, "its time is up")
    assert d.note_failure(T0 + 60 * S + 10 * MS) == "counted"  # 0.99.. + 1 < 2
    assert d.level == 0
    assert d.note_failure(T0 + 60 * S + 20 * MS) == "hold"
    d.start_hold(T0 + 60 * S + 20 * MS, "again")
    assert d.level == 1


def test_level_is_capped_at_30():
    d = policy.Dampening(hold_s=1.0, hold_max_s=1e12)
    for i in range(40):
        d.start_hold(T0 + i, "x")
    assert d.level == 30


def test_end_hold_only_ends_a_hold_and_says_why():
    d = defaults()
    assert not d.end_hold(T0, "nothing")
    assert d.reason == ""
    d.start_hold(T0, "flapping")
    assert d.end_hold(T0 + 1, "restored by the operator")
    assert d.reason == "hold ended: restored by the operator"
    assert not d.holding(T0 + 2) and not d.hold_expired(T0 + 2)


def test_forgive_drops_the_penalty_and_the_level():
    d = defaults()
    d.note_failure(T0)
    d.note_failure(T0)
    d.start_hold(T0, "x")
    d.forgive()
    assert d.penalty(T0) == 0 and d.level == 0
    assert d.note_failure(T0 + 1) == "extended"  # forgive leaves ending the hold to end_hold
    d.end_hold(T0 + 2, "forgiven")
    assert d.note_failure(T0 + 60 * 1_000_000_000) == "counted"


def test_lossy_rails_restart_levels_unless_their_last_hold_was_recent():
    never = defaults()
    never.start_hold(T0, "x")
    never.start_hold(T0, "x")
    never.restart_levels_unless_recent(T0)  # never ended a hold: start from the shortest
    assert never.level == 0

    d = defaults()
    d.start_hold(T0, "x")
    d.end_hold(T0 + 10 * S, "up")
    d.restart_levels_unless_recent(T0 + 10 * S + 300 * S)  # exactly hold_max_s later: still recent
    assert d.level == 1
    d.restart_levels_unless_recent(T0 + 10 * S + 300 * S + 1)
    assert d.level == 0
