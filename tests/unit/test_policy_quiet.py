"""Quiet-rail detection as a value (csrc/quiet_judge.h, bound as r2cc_serve._C.policy.QuietJudge):
the suspect bar from the kernel's rtt/rttvar, dead-path evidence and its stickiness, the stall of
our own, and the mute verdict; each threshold just under and just over. Times are ns."""

from r2cc_serve._C import policy

MS = 1_000_000
T0 = 1_000_000 * MS


def judge(rail_timeout_ms=60, peer_silence_ms=400):
    return policy.QuietJudge(rail_timeout_ms=rail_timeout_ms, peer_silence_ms=peer_silence_ms)


def test_floor_and_fail_time():
    assert judge().floor_ns == 60 * MS and judge().fail_after_ns == 400 * MS
    assert judge(rail_timeout_ms=60, peer_silence_ms=30).fail_after_ns == 60 * MS  # never under the floor


def test_suspect_bar_is_twice_the_kernels_rto_between_floor_and_fail_time():
    q = judge()
    assert q.suspect_after_ns(policy.PathInfo(ok=False, rtt_us=300_000)) == 60 * MS  # unknown: the floor
    assert q.suspect_after_ns(policy.PathInfo(rtt_us=5_000, rttvar_us=1_000)) == 60 * MS  # 2 x 9 ms < floor
    assert q.suspect_after_ns(policy.PathInfo(rtt_us=30_000, rttvar_us=0)) == 60 * MS  # 2 x 30 ms = floor
    assert q.suspect_after_ns(policy.PathInfo(rtt_us=30_001, rttvar_us=0)) == 60 * MS + 2_000
    assert q.suspect_after_ns(policy.PathInfo(rtt_us=20_000, rttvar_us=3_000)) == 64 * MS  # srtt + 4 rttvar
    assert q.suspect_after_ns(policy.PathInfo(rtt_us=200_000, rttvar_us=0)) == 400 * MS  # = the fail time
    assert q.suspect_after_ns(policy.PathInfo(rtt_us=200_001, rttvar_us=0)) == 400 * MS  # capped there


def test_own_stall_is_a_pass_over_half_a_rail_timeout_late():
    assert not policy.QuietJudge.held_up(T0 + 30 * MS, T0, 60 * MS)
    assert policy.QuietJudge.held_up(T0 + 30 * MS + 1, T0, 60 * MS)


def test_silence_does_not_count_across_our_own_stall():
    assert policy.QuietJudge.silent_ns(T0 + 100 * MS, T0, 0) == 100 * MS
    assert policy.QuietJudge.silent_ns(T0 + 100 * MS, T0, T0 + 90 * MS) == 10 * MS


def dead(**kw):
    return policy.PathInfo(unacked=3, last_ack_recv_ms=200, **kw)


def test_dead_path_needs_sending_without_pause_for_the_whole_quiet_time():
    now, quiet = T0 + 500 * MS, 60 * MS
    assert not policy.QuietJudge.dead_path_evidence(dead(), now, now - quiet, 0, quiet)
    assert policy.QuietJudge.dead_path_evidence(dead(), now, now - quiet - 1, 0, quiet)
    # A stall of our own counts as a pause.
    assert not policy.QuietJudge.dead_path_evidence(dead(), now, now - 400 * MS, now - quiet, quiet)


def test_dead_path_needs_no_ack_for_the_quiet_time():
    now, quiet = T0 + 500 * MS, 60 * MS
    assert not policy.QuietJudge.dead_path_evidence(policy.PathInfo(unacked=3, last_ack_recv_ms=60), now, T0, 0,
                                                    quiet)
    assert policy.QuietJudge.dead_path_evidence(policy.PathInfo(unacked=3, last_ack_recv_ms=61), now, T0, 0, quiet)
    assert not policy.QuietJudge.dead_path_evidence(dead(ok=False), now, T0, 0, quiet)


def test_dead_path_needs_bytes_of_ours_outstanding_or_stuck_behind_an_open_window():
    now, quiet = T0 + 500 * MS, 60 * MS
    idle = policy.PathInfo(last_ack_recv_ms=200)
    assert not policy.QuietJudge.dead_path_evidence(idle, now, T0, 0, quiet)
    no_route = policy.PathInfo(last_ack_recv_ms=200, notsent_bytes=100, snd_wnd=65535)
    assert policy.QuietJudge.dead_path_evidence(no_route, now, T0, 0, quiet)
    stopped_reader = policy.PathInfo(last_ack_recv_ms=200, notsent_bytes=100, snd_wnd=0)
    assert not policy.QuietJudge.dead_path_evidence(stopped_reader, now, T0, 0, quiet)


def test_a_dead_path_stays_dead_until_its_kernel_acknowledges_within_the_quiet_time():
    q = judge()
    now, quiet = T0 + 500 * MS, 60 * MS
    assert q.judge_quiet(dead(), now, T0, 0, quiet) and q.path_dead
    # We paused sending (no fresh evidence): still dead.
    assert q.judge_quiet(dead(), now + 10 * MS, now + 5 * MS, 0, quiet)
    # An ACK exactly the quiet time ago is no sign of life; one just within it is.
    assert q.judge_quiet(policy.PathInfo(last_ack_recv_ms=60), now + 20 * MS, now, 0, quiet)
    assert not q.judge_quiet(policy.PathInfo(last_ack_recv_ms=59), now + 30 * MS, now, 0, quiet)
    assert not q.path_dead


def test_a_dead_path_ends_when_the_peer_speaks_or_the_socket_changes():
    q = judge()
    now, quiet = T0 + 500 * MS, 60 * MS
    assert q.judge_quiet(dead(), now, T0, 0, quiet)
    assert q.judge_quiet(dead(ok=False), now, T0, 0, quiet)  # TCP_INFO failed: no evidence of life either
    q.heard()
    assert not q.path_dead
    assert q.judge_quiet(dead(), now, T0, 0, quiet)
    q.reset()
    assert not q.path_dead


def test_mute_needs_another_rail_heard_within_half_a_rail_timeout():
    q = judge()
    now, quiet = T0 + 10_000 * MS, 60 * MS
    assert q.mute(now, quiet, now - 30 * MS + 1, 0, 0)
    assert not q.mute(now, quiet, now - 30 * MS, 0, 0)


def test_no_mute_while_the_peer_catches_up_after_a_pause():
    q = judge()
    now = T0 + 10_000 * MS
    # The grace is max(quiet time, twice the pause, capped at peer_silence_ms) from when the
    # peer spoke again: a 3 s stop and a 300 ms one wait 400 ms, a 40 ms blip 80 ms.
    for pause in (3000 * MS, 300 * MS):
        assert not q.mute(now, 60 * MS, now, now - 400 * MS + 1, pause)
        assert q.mute(now, 60 * MS, now, now - 400 * MS, pause)
    assert not q.mute(now, 60 * MS, now, now - 80 * MS + 1, 40 * MS)
    assert q.mute(now, 60 * MS, now, now - 80 * MS, 40 * MS)
    assert not q.mute(now, 500 * MS, now, now - 500 * MS + 1, 3000 * MS)  # never under the quiet time
    assert q.mute(now, 500 * MS, now, now - 500 * MS, 3000 * MS)


def test_a_mute_rail_fails_only_while_the_peer_runs_and_counts_from_its_wake_up():
    q = judge()  # fail time 400 ms
    now = T0 + 10_000 * MS
    # Another rail spoke just now; this one silent for just over the fail time: it fails.
    assert q.mute_fails(now, 400 * MS + 1, now, 0)
    assert not q.mute_fails(now, 400 * MS, now, 0)
    # The peer is stopped (every rail quiet for half a rail timeout): no verdict, however long.
    assert not q.mute_fails(now, 5000 * MS, now - 30 * MS, 0)
    # It woke 100 ms ago after a stop: the rail's 807 ms of silence count from the wake-up.
    assert not q.mute_fails(now, 807 * MS, now, now - 100 * MS)
    assert not q.mute_fails(now, 807 * MS, now, now - 400 * MS)
    assert q.mute_fails(now, 807 * MS, now, now - 400 * MS - 1)
