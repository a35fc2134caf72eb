"""The gray-failure judge as a value (csrc/progress.h, bound as r2cc_serve._C.policy.ProgressJudge):
stuck after the quiet time, slow over a fixed window against the usual rate, and the excuses
(the peer's receive window, a stall of our own); each threshold just under and just over."""

from r2cc_serve._C import policy

MS = 1_000_000
T0 = 1_000_000 * MS
QUIET = 60 * MS


def test_nothing_outstanding_is_moving_and_resets():
    j = policy.ProgressJudge()
    assert j.look(T0, outstanding=False, bytes_acked=0) == "moving"
    assert j.stuck_for_ns(T0 + 5 * MS) == 0


def test_stuck_just_over_the_quiet_time_without_an_acked_byte():
    j = policy.ProgressJudge()
    assert j.look(T0, True, 100, stuck_after_ns=QUIET) == "moving"
    assert j.look(T0 + QUIET, True, 100, stuck_after_ns=QUIET) == "moving"
    assert j.stuck_for_ns(T0 + QUIET) == QUIET
    assert j.look(T0 + QUIET + 1, True, 100, stuck_after_ns=QUIET) == "stuck"


def test_an_acked_byte_restarts_the_stuck_clock():
    j = policy.ProgressJudge()
    j.look(T0, True, 100, stuck_after_ns=QUIET)
    assert j.look(T0 + 50 * MS, True, 101, stuck_after_ns=QUIET) == "moving"
    assert j.look(T0 + 50 * MS + QUIET, True, 101, stuck_after_ns=QUIET) == "moving"
    assert j.look(T0 + 50 * MS + QUIET + 1, True, 101, stuck_after_ns=QUIET) == "stuck"


def test_a_window_limited_sample_is_no_evidence():
    j = policy.ProgressJudge()
    j.look(T0, True, 100, stuck_after_ns=QUIET)
    assert j.look(T0 + 100 * MS, True, 100, window_limited=True, stuck_after_ns=QUIET) == "moving"
    assert j.look(T0 + 100 * MS + QUIET, True, 100, stuck_after_ns=QUIET) == "moving"
    assert j.look(T0 + 100 * MS + QUIET + 1, True, 100, stuck_after_ns=QUIET) == "stuck"


def test_stuck_time_does_not_count_across_our_own_stall():
    j = policy.ProgressJudge()
    j.look(T0, True, 100, stuck_after_ns=QUIET)
    stall_end = T0 + 50 * MS
    assert j.look(stall_end + QUIET, True, 100, stuck_after_ns=QUIET, judge_from_ns=stall_end) == "moving"
    assert j.look(stall_end + QUIET + 1, True, 100, stuck_after_ns=QUIET, judge_from_ns=stall_end) == "stuck"


REF = 1e7  # the peer's usual rate, bytes a second
LONG = 10_000 * MS  # stuck_after: out of the way of the slow verdict


def slow_window(backlog, delivered, span=100 * MS, ref=REF, judge_from=0):
    j = policy.ProgressJudge()
    first = j.look(T0, True, 1000, queued=backlog, stuck_after_ns=LONG, ref_Bps=ref)  # opens the window
    assert first == "moving"
    v = j.look(T0 + span, True, 1000 + delivered, queued=backlog, stuck_after_ns=LONG, judge_from_ns=judge_from,
               ref_Bps=ref)
    return v, j


def test_slow_when_a_backlog_due_long_ago_crawls_at_under_a_quarter_of_the_usual_rate():
    v, j = slow_window(backlog=400_000, delivered=240_000)  # due in 40 ms; 2.4 MB/s against 10
    assert v == "slow"
    assert abs(j.last_rate_Bps() - 2.4e6) < 1
    assert slow_window(400_000, 260_000)[0] == "moving"  # 2.6 MB/s: over a quarter


def test_the_slow_window_is_a_fixed_100ms():
    assert policy.ProgressJudge.SLOW_WINDOW_NS == 100 * MS and policy.ProgressJudge.SLOW_FACTOR == 4
    assert slow_window(400_000, 240_000, span=100 * MS - 1)[0] == "moving"


def test_no_slow_verdict_for_a_backlog_not_yet_due_or_already_delivered():
    assert slow_window(backlog=490_000, delivered=100_000)[0] == "slow"  # due in 49 ms of 50
    assert slow_window(backlog=510_000, delivered=100_000)[0] == "moving"  # due in 51 ms: not long ago
    assert slow_window(backlog=200_000, delivered=200_000)[0] == "moving"  # all of it delivered
    assert slow_window(backlog=400_000, delivered=10_000, ref=0.0)[0] == "moving"  # no usual rate
    assert slow_window(backlog=0, delivered=0)[0] == "moving"


def test_a_stall_of_our_own_inside_the_window_restarts_it():
    v, _ = slow_window(backlog=400_000, delivered=10_000, judge_from=T0 + 1)
    assert v == "moving"


def test_reset_forgets_the_socket():
    j = policy.ProgressJudge()
    j.look(T0, True, 100, stuck_after_ns=QUIET)
    j.reset()
    assert j.stuck_for_ns(T0 + QUIET) == 0
    assert j.look(T0 + 2 * QUIET, True, 100, stuck_after_ns=QUIET) == "moving"



KB = 1024


def test_a_window_that_never_shrank_is_the_paths_pace():
    # A re-dialed socket on a crawling path: the receiver's first window (66-85 KB) with 900 KB
    # queued behind it (seen with ss on a 2mbit lab rail). Its process reads all that arrives.
    j = policy.ProgressJudge()
    assert not j.peer_paced(queued=990 * KB, snd_wnd=66 * KB)
    assert not j.peer_paced(queued=900 * KB, snd_wnd=85 * KB)
    # The window offered is larger than the queue: nothing holds us back.
    assert not j.peer_paced(queued=60 * KB, snd_wnd=85 * KB)


def test_a_window_shrunk_to_under_half_its_widest_is_the_peers_pace():
    # A peer whose process stopped reading: its buffer fills, the window it offers shrinks.
    j = policy.ProgressJudge()
    j.peer_paced(queued=10 * KB, snd_wnd=4096 * KB)
    assert not j.peer_paced(queued=3000 * KB, snd_wnd=2048 * KB)  # half: not under it
    assert j.peer_paced(queued=3000 * KB, snd_wnd=2048 * KB - 1)
    assert j.peer_paced(queued=3000 * KB, snd_wnd=0)
    # A new socket starts from its own first window.
    j.reset()
    assert not j.peer_paced(queued=990 * KB, snd_wnd=66 * KB)


def test_nothing_is_judged_before_judge_from_when_it_lies_ahead():
    # After a stall of our own the transport sets judge_from as long again past its end (at most
    # the fail time): neither stuck nor a slow window counts before it.
    j = policy.ProgressJudge()
    ahead = T0 + 300 * MS
    assert j.look(T0, True, 100, queued=1 << 20, stuck_after_ns=QUIET, judge_from_ns=ahead, ref_Bps=REF) == "moving"
    assert j.look(ahead, True, 100, queued=1 << 20, stuck_after_ns=QUIET, judge_from_ns=ahead, ref_Bps=REF) == "moving"
    assert j.look(ahead + QUIET, True, 100, queued=1 << 20, stuck_after_ns=QUIET, judge_from_ns=ahead,
                  ref_Bps=REF) == "moving"
    assert j.look(ahead + QUIET + 1, True, 100, queued=1 << 20, stuck_after_ns=QUIET, judge_from_ns=ahead,
                  ref_Bps=REF) == "stuck"
