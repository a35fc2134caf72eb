"""The loss verdict as a value (csrc/loss_judge.h, bound as r2cc_serve._C.policy.LossJudge): the
sampling rate, the window's edges, the retransmitted share (less what the peer D-SACKed) against the best other rail, the
spread, and the excuse of a paused peer; each threshold just under and just over. Times are ns."""

import pytest

from r2cc_serve._C import policy

S = 1_000_000_000
MS = 1_000_000
T0 = 1_000 * S
LJ = policy.LossJudge


def test_constants_are_the_documented_ones():
    assert (LJ.SAMPLE_NS, LJ.WINDOW_MIN_NS, LJ.WINDOW_MAX_NS) == (250 * MS, 1 * S, 30 * S)
    assert (LJ.SPREAD, LJ.ENOUGH_RETRANS, LJ.COMPARE_SEGMENTS) == (3, 10, 100)


def test_enabled_only_with_a_positive_hold_pct():
    assert LJ(hold_pct=0.5).enabled
    assert not LJ(hold_pct=0.0).enabled


def test_a_paused_peer_excuses_a_second_from_when_it_spoke_again():
    pause = 300 * MS
    assert LJ.peer_pause_excuses(T0, stalled_since_ns=T0 - 5 * S, spoke_again_ns=0, pause_ns=0)
    assert not LJ.peer_pause_excuses(T0, stalled_since_ns=0, spoke_again_ns=0, pause_ns=0)
    assert LJ.peer_pause_excuses(T0, 0, T0 - S + 1, pause)
    assert not LJ.peer_pause_excuses(T0, 0, T0 - S, pause)


def test_a_blip_under_100ms_excuses_nothing():
    assert LJ.peer_pause_excuses(T0, 0, T0 - 10 * MS, 100 * MS)
    assert not LJ.peer_pause_excuses(T0, 0, T0 - 10 * MS, 100 * MS - 1)


def test_samples_at_most_every_250ms_unless_the_socket_changed():
    j = LJ()
    assert j.take_sample(T0, 1)
    j.look(T0, 1, 0, 0)
    assert not j.take_sample(T0 + 250 * MS - 1, 1)
    assert j.take_sample(T0 + 250 * MS - 1, 2)  # a new socket: at once
    assert j.take_sample(T0 + 500 * MS, 1)


def run_window(j, samples, epoch=1, start=T0):
    """Feeds (dt_ns, retrans, segs[, dsacked]) samples after a first one at `start` with zero
    counts; returns the last look's result."""
    assert j.look(start, epoch, 0, 0) is None  # the first sample starts the window
    out = None
    for dt, *counts in samples:
        out = j.look(start + dt, epoch, *counts)
    return out


def test_a_window_is_judged_after_a_second_and_min_segments():
    assert run_window(LJ(), [(S - 1, 0, 5000)]) is None  # too short
    w = run_window(LJ(), [(S, 0, 1000)])
    assert w == {"pct": 0.0, "segs": 1000, "seconds": pytest.approx(1.0), "spread": 0}
    assert run_window(LJ(), [(S, 0, 999)]) is None  # too few segments, too few retransmissions


def test_enough_retransmissions_judge_a_window_with_few_segments():
    assert run_window(LJ(), [(S, 9, 500)]) is None
    w = run_window(LJ(), [(S, 10, 500)])
    assert w["pct"] == pytest.approx(2.0) and w["spread"] == 1


def test_spread_counts_samples_in_which_retransmissions_grew():
    w = run_window(LJ(), [(250 * MS, 2, 300), (500 * MS, 2, 600), (750 * MS, 5, 800), (S, 8, 1000)])
    assert w["spread"] == 3 and w["pct"] == pytest.approx(0.8)


def test_a_judged_window_starts_the_next_from_its_counts():
    j = LJ()
    run_window(j, [(S, 10, 1000)])
    assert j.last_pct == pytest.approx(1.0)
    assert j.look(T0 + 2 * S - 1, 1, 10, 5000) is None  # under a second since the judgement
    w = j.look(T0 + 2 * S, 1, 30, 3000)
    assert w["segs"] == 2000 and w["pct"] == pytest.approx(1.0)


def test_a_window_restarts_on_a_new_socket_counts_going_back_or_after_30s():
    j = LJ()
    j.look(T0, 1, 100, 1000)
    assert j.look(T0 + S, 2, 200, 3000) is None  # another socket: a new window from here
    assert j.look(T0 + 2 * S, 2, 200, 3999) is None  # 999 segments since the restart
    assert j.look(T0 + 2 * S + 1, 2, 200, 4000) is not None

    j = LJ()
    j.look(T0, 1, 100, 1000)
    assert j.look(T0 + S, 1, 100, 999) is None  # counts went back: restarted at 999
    assert j.look(T0 + 2 * S, 1, 100, 1998) is None
    assert j.look(T0 + 2 * S, 1, 100, 1999) is not None

    j = LJ()
    j.look(T0, 1, 0, 0)
    assert j.look(T0 + 30 * S, 1, 0, 500) is None  # not yet over 30 s: the window goes on
    assert j.look(T0 + 30 * S + 1, 1, 0, 900) is None  # over 30 s: restarted at 900
    assert j.look(T0 + 31 * S + 1, 1, 0, 1899) is None
    assert j.look(T0 + 31 * S + 1, 1, 0, 1900) is not None


def test_retransmissions_the_peer_reported_as_duplicates_lost_nothing():
    # Tail loss probes on a busy host: every one D-SACKed, so no loss at all.
    assert run_window(LJ(), [(250 * MS, 5, 300, 5), (S, 20, 1000, 20)]) == {
        "pct": 0.0, "segs": 1000, "seconds": pytest.approx(1.0), "spread": 0}
    # Half of them proven needless: half the share, and only samples where the rest grew spread.
    j = LJ()
    j.look(T0, 1, 0, 0, 0)
    j.look(T0 + 250 * MS, 1, 4, 300, 4)
    j.look(T0 + 500 * MS, 1, 8, 600, 4)
    w = j.look(T0 + S, 1, 20, 1000, 10)
    assert w["pct"] == pytest.approx(1.0) and w["spread"] == 2


def test_a_d_sack_that_comes_after_its_window_was_judged_counts_nothing_below_zero():
    j = LJ()
    run_window(j, [(S, 10, 1000)])  # judged at 1%: the D-SACKs had not come yet
    w = j.look(T0 + 2 * S, 1, 10, 2000, 10)  # they came: the next window is judged, at 0, not -1%
    assert w["pct"] == 0.0 and w["segs"] == 1000 and w["spread"] == 0
    w = j.look(T0 + 3 * S, 1, 15, 3000, 10)  # and counts from there
    assert w["pct"] == pytest.approx(0.5) and w["spread"] == 1


def test_another_rails_share_leaves_out_its_d_sacked_retransmissions():
    o = LJ()
    o.look(T0, 1, 10, 1000, 5)
    assert o.share_for_comparison(T0 + S, retrans=14, segs=1200, dsacked=7) == pytest.approx(1.0)
    assert o.share_for_comparison(T0 + S, retrans=14, segs=1200, dsacked=20) == 0.0


def test_restart_makes_the_next_sample_start_a_window():
    j = LJ()
    j.look(T0, 1, 0, 0)
    j.restart()
    assert not j.windows(1)
    assert j.look(T0 + 2 * S, 1, 50, 5000) is None  # a new window, not a judged one
    assert j.windows(1)


def test_lossy_needs_hold_pct_points_above_the_best_other_and_a_spread_of_3():
    j = LJ(hold_pct=0.5)
    assert j.lossy(pct=0.75, spread=3, best_other=0.25)  # exactly 0.5 points above
    assert not j.lossy(pct=0.74, spread=3, best_other=0.25)
    assert not j.lossy(pct=5.0, spread=2, best_other=0.0)  # one burst, not a loss that lasts
    assert j.lossy(pct=5.0, spread=3, best_other=0.0)


def test_best_other_is_the_lowest_share_or_a_clean_path():
    assert LJ.best_other([]) == 0.0
    assert LJ.best_other([3.0, 1.5, 2.0]) == 1.5
    assert LJ.best_other([100.0]) == 100.0


def test_another_rails_share_from_its_current_window_or_a_recent_judgement():
    o = LJ()
    assert o.share_for_comparison(T0) is None  # nothing known
    o.look(T0, 1, 10, 1000)
    assert o.share_for_comparison(T0 + S, retrans=12, segs=1099) is None  # 99 segments say nothing
    assert o.share_for_comparison(T0 + S, retrans=12, segs=1100) == pytest.approx(2.0)
    assert o.share_for_comparison(T0 + S, retrans=9, segs=1100) is None  # counts went back
    run_window(o, [(S, 20, 1000)], epoch=2, start=T0 + 5 * S)  # judged at T0 + 6 s: 2%
    assert o.share_for_comparison(T0 + 6 * S + 30 * S - 1) == pytest.approx(2.0)
    assert o.share_for_comparison(T0 + 6 * S + 30 * S) is None  # too old


def test_probing_is_the_transports_flag():
    j = LJ()
    assert not j.probing
    j.probing = True
    assert j.probing
