// Failure detection. One watchdog thread per transport sends every rail's heartbeats,
// samples bandwidth and judges each rail from evidence about its path; waiters judge
// whether a collective can still finish (no path past the grace period, timeout).
//
// Evidence, strongest first: a socket error (reader/writer fail the rail at once); bytes
// we sent that the peer's kernel has not acknowledged for rail_timeout_ms while we kept
// sending (TCP_INFO) — a dead link or a blackhole. Silence of the peer's process alone is
// not evidence: a stopped or starved process still has a kernel that acknowledges.
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "net.h"
#include "transport_internal.h"

namespace r2cc {

namespace {
std::string secs(int64_t ns) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%.1f", double(ns) * 1e-9);
  return buf;
}
// The peer's host answered for the connection, but no process holds it there: the host
// refused the dial, reset the connection, or closed it without a goodbye.
bool host_up_process_gone(IoCause cause) {
  return cause == IoCause::kRefused || cause == IoCause::kReset || cause == IoCause::kEof;
}
}  // namespace

void TransportImpl::watchdog_loop() {
  // With every core busy (e.g. several ranks per host), an ordinary thread can wait
  // hundreds of ms for a CPU; heartbeats must not, or peers see a silent rail.
  if (opt_.watchdog_realtime) raise_thread_priority();
  {
    std::lock_guard<std::mutex> g(mu_);
    last_pass_ns_.store(now_ns());
  }
  arm_watchdog_timer(last_pass_ns_.load() + watchdog_tick_ns_);
  while (!stopping_) {
    uint64_t expirations;
    if (read(watchdog_timer_fd_, &expirations, sizeof(expirations)) < 0 && errno != EINTR) {
      struct timespec ts{0, long(watchdog_tick_ns_)};  // cannot happen; keep ticking regardless
      nanosleep(&ts, nullptr);
    }
    if (stopping_) break;
    std::unique_lock<std::mutex> lk(mu_);
    const int64_t now = now_ns();
    // A caller may have run the pass since the timer was set (and set it again).
    if (watchdog_pass_due(now)) watchdog_pass_locked(lk, now);
    const int64_t next = last_pass_ns_.load() + watchdog_tick_ns_;
    lk.unlock();
    arm_watchdog_timer(next);
  }
}

void TransportImpl::arm_watchdog_timer(int64_t at_ns) {
  itimerspec its{};
  at_ns = std::max<int64_t>(at_ns, 1);  // zero would disarm it
  its.it_value.tv_sec = at_ns / 1000000000;
  its.it_value.tv_nsec = at_ns % 1000000000;
  timerfd_settime(watchdog_timer_fd_, TFD_TIMER_ABSTIME, &its, nullptr);
}

bool TransportImpl::watchdog_pass_due(int64_t now) const {
  // An eighth of a tick early: the watchdog's timer, set by its own last pass, fires right when
  // the pass is due, and a spinning caller must have a moment to get there first.
  return now - last_pass_ns_.load(std::memory_order_relaxed) >= watchdog_tick_ns_ - watchdog_tick_ns_ / 8;
}

void TransportImpl::run_due_pass_on_caller(int64_t now) {
  // The caller is on its core anyway: it runs the pass and pushes the watchdog's timer two
  // ticks past it, so that while calls keep coming the watchdog does not wake at all (a caller
  // spinning, or ending a call, at some time in the tick after the next pass is due gets there
  // first). Once calls stop, the passes are the watchdog's again, at most a tick late.
  if (!watchdog_pass_due(now)) return;
  std::unique_lock<std::mutex> lk(mu_);
  now = now_ns();
  if (!watchdog_pass_due(now) || stopping_) return;
  watchdog_pass_locked(lk, now);
  counters_.caller_watchdog_passes++;
  lk.unlock();
  arm_watchdog_timer(now + 2 * watchdog_tick_ns_);
}

void TransportImpl::watchdog_pass_locked(std::unique_lock<std::mutex>& lk, int64_t now) {
  const int64_t timeout_ns = ms_ns(opt_.rail_timeout_ms);
  // This process itself was held up (no CPU, or the lock): it sent nothing meanwhile, so
  // neither the peers' silence nor their kernels' silence across the stall is evidence.
  if (QuietJudge::held_up(now, last_pass_ns_.load(), timeout_ns)) {
    stall_end_ns_ = now;
    // Our bytes' progress is judged only after as long again (at most the fail time): coming
    // back, this process writes what it owes on every rail at once, and one CI run (beside a
    // busy job) set a rail aside as stuck 60 ms after a 0.3 s SIGSTOP of ours ended.
    progress_from_ns_ = now + std::min(now - last_pass_ns_.load(), ms_ns(opt_.peer_silence_ms));
    counters_.own_stalls++;
  }
  last_pass_ns_.store(now);
  sample_cpu_pressure(now);
  rx_readmit_locked(now);
  for (auto& p : peers_) {
    if (p->rank == rank_ || p->closed) continue;
    check_peer_rails_locked(*p, now, stall_end_ns_);
    check_holds_locked(*p, now);
    for (auto& c : p->conns) {
      send_heartbeat_locked(*c, *p, now);
      send_probe_locked(*c, *p, now);
      update_bandwidth_locked(*c, now);
      check_loss_locked(*p, *c, now);
    }
  }
  // Hedge copies nobody sent while waiting (no collective followed): a message lost on a
  // dead rail then costs this tick, not the failure detection.
  send_due_hedges_locked(lk, now - kHedgeStaleNs);
  check_state_watches_locked(now);
#ifdef R2CC_CHECK_BOOKS
  if (error_.empty())
    if (const auto bad = audit_books_locked(); !bad.empty())
      set_error_locked(ErrorKind::kAborted, "r2cc: the transport's books broke (R2CC_CHECK_BOOKS build): " + bad[0]);
#endif
  const uint64_t held_us = uint64_t(now_ns() - now) / 1000;
  counters_.watchdog_passes++;
  counters_.watchdog_locked_us += held_us;
  counters_.watchdog_pass_max_us = std::max(counters_.watchdog_pass_max_us, held_us);
}

void TransportImpl::check_peer_rails_locked(Peer& p, int64_t now, int64_t stall_end_ns) {
  const int64_t timeout_ns = ms_ns(opt_.rail_timeout_ms);
  bool any_connected = false, all_silent = true, any_dead = false;
  int64_t least_silence = INT64_MAX;  // raw: since the peer last spoke on any connected rail
  int64_t freshest_rx = 0;            // when it last did (a rail quiet meanwhile is mute: gray.cc)
  for (auto& cp : p.conns)
    if (is_connected(cp->state)) freshest_rx = std::max(freshest_rx, cp->last_rx_ns.load());
  if (p.all_quiet && freshest_rx > p.freshest_rx_ns) {
    p.pause_ns = freshest_rx - p.freshest_rx_ns;
    p.spoke_again_ns = freshest_rx;
  }
  p.freshest_rx_ns = freshest_rx;
  p.all_quiet = freshest_rx && now - freshest_rx > timeout_ns / 2;
  for (auto& cp : p.conns) {
    Conn& c = *cp;
    if (!is_connected(c.state)) {
      c.quiet.reset();
      continue;
    }
    any_connected = true;
    p.last_heard_ns = std::max(p.last_heard_ns, c.last_rx_ns.load());
    least_silence = std::min(least_silence, now - c.last_rx_ns.load());
    const int64_t silent = QuietJudge::silent_ns(now, c.last_rx_ns.load(), stall_end_ns);
    // Bytes already queued in the kernel: the peer spoke, our reader is just slow to run.
    bool hears = silent < c.quiet.floor_ns() || io_->bytes_readable(c.fd) > 0;
    PathInfo pi;
    int64_t quiet_ns = c.quiet.floor_ns();
    if (!hears) {  // TCP_INFO only for a rail already quiet for the floor
      pi = io_->path_info(c.fd);
      quiet_ns = c.quiet.suspect_after_ns(pi);
      hears = silent < quiet_ns;
    }
    if (hears) {
      all_silent = false;
      c.quiet.heard();
    } else {
      c.quiet.judge_quiet(pi, now, c.tx_resume_ns.load(), stall_end_ns, quiet_ns);
    }
    // Heard or not: our own bytes may be stuck or crawling (gray.cc). Judged from
    // progress_from_ns_, set with stall_end_ns and never before it.
    judge_progress_locked(p, c, now, progress_from_ns_, hears);
    if (!is_connected(c.state)) continue;  // it failed for good just now
    if (c.quiet.path_dead()) {
      any_dead = true;
      const std::string why = "rail" + std::to_string(c.rail) + " to rank " + std::to_string(p.rank) +
                              ": no bytes for " + std::to_string(silent / 1000000) +
                              " ms and none of ours acknowledged by its host for " +
                              std::to_string(pi.last_ack_recv_ms) + " ms (link down or blackholed)";
      // Suspect at once (its chunks move to the other rails, cheap and reversible); fail
      // the connection for good only when the path stays dead.
      if (silent > c.quiet.fail_after_ns()) fail_conn_locked(c, c.epoch.load(), IoCause::kTimeout, why);
      else suspect_conn_locked(c, IoCause::kTimeout, why);
    } else if (c.suspect && (c.suspect_why == SuspectWhy::kSilent || c.suspect_why == SuspectWhy::kMute) &&
               c.last_rx_ns.load() > c.suspect_since_ns) {
      // Bytes came on it since it fell quiet: back in service without a reconnect. Not merely
      // "heard" (a stall of this process suspends judging, it is no sign of life): a watchdog kept
      // off the lock for 30 ms put a dead rail back, and it failed for good 400 ms later.
      c.suspect = false;
      p.wake_writers();
    } else if (!hears) {
      judge_mute_locked(p, c, now, silent, quiet_ns, freshest_rx);
    }
  }
  track_stall_locked(p, now, any_connected && all_silent && !any_dead, least_silence);
  if (peer_has_path_locked(p)) p.no_path_since_ns = 0;
  else if (!p.no_path_since_ns) p.no_path_since_ns = now;
}

void TransportImpl::track_stall_locked(Peer& p, int64_t now, bool silent_alive, int64_t least_silence) {
  // Every rail quiet while the paths are fine: the peer's process is not running (stopped,
  // swapping, throttled). Reported after peer_silence_ms so a busy moment is not a stall.
  const int64_t stall_ns = ms_ns(std::max(opt_.peer_silence_ms, opt_.rail_timeout_ms));
  if (silent_alive && least_silence > stall_ns) {
    if (!p.stalled_since_ns) {
      p.stalled_since_ns = now - least_silence;
      p.stalls++;
    }
  } else if (p.stalled_since_ns && !silent_alive) {
    p.last_stall_s = double(now - p.stalled_since_ns) * 1e-9;
    p.stalled_since_ns = 0;
  }
}

void TransportImpl::send_heartbeat_locked(Conn& c, Peer& p, int64_t now) {
  // Heartbeats come from this one thread for every rail: the peer hears us while our
  // writers are busy or starved, and our kernel always has fresh bytes for the peer's
  // kernel to acknowledge (the path evidence above). Acks owed to the peer ride along
  // (small messages' acks wait for this, at most heartbeat_ms). Room in the send buffer
  // makes a partial write impossible.
  // A rail held for loss is probed harder: more heartbeats judge it sooner (loss.cc).
  // An owed echo goes first; it is bytes for the peer too, so it stands in for a heartbeat. A
  // rail busy with bulk data (being written, or its socket full) keeps it owed: its round-trip
  // time then keeps the last sample until the rail has room.
  if (c.echo_heard_ns) {
    FrameHeader echo = control_frame(FrameType::kHeartbeatEcho, 0, c.echo_peer_clock);
    echo.total = uint64_t(std::max<int64_t>(0, now - c.echo_heard_ns));
    if (send_frames_now_locked(c, p, echo, now) == 1) c.echo_heard_ns = 0;
  }
  const int64_t hb_ns = c.loss.probing ? 0 : ms_ns(opt_.heartbeat_ms);
  if (now - c.last_tx_ns < hb_ns) return;
  send_frames_now_locked(c, p, control_frame(FrameType::kHeartbeat, 0, uint64_t(now)), now);
}

void TransportImpl::update_bandwidth_locked(Conn& c, int64_t now) {
  // Acked bytes per busy second, sampled every >= 20 ms of busy time, smoothed. Only
  // bandwidth-bound traffic counts: when the busy periods of a sample carried under half a
  // small chunk each on average, or its chunks were under half of one on average (decode-sized
  // messages, whose acks wait for the receiver's next collective and so run busy periods
  // together), their time is round trips and scheduling, not the link's rate, and rails
  // would look slow at random.
  int64_t busy = c.busy_ns + (c.busy_since_ns ? now - c.busy_since_ns : 0);
  const int64_t sample_ns = busy - c.bw_ref_busy, min_sample_ns = ms_ns(20);
  if (sample_ns <= min_sample_ns) return;
  const uint64_t acked = c.acked_bytes - c.bw_ref_acked;
  // Nothing acknowledged yet: the sample goes on. (A chunk on a slow rail can be busy for
  // longer than a sample: 256 KiB at 50mbit for 40 ms. Closing the empty samples dropped that
  // time, and such a rail measured 3x faster than it is.)
  if (acked == 0) return;
  const uint64_t periods = std::max<uint64_t>(1, c.busy_periods - c.bw_ref_periods);
  const uint64_t chunks = std::max<uint64_t>(1, c.st.chunks_sent - c.bw_ref_chunks);
  c.bw_ref_chunks = c.st.chunks_sent;
  if (acked / periods >= chunk_grain() / 2 && acked / chunks >= chunk_grain() / 2) {
    const double sample = double(acked) / (double(sample_ns) * 1e-9);
    // A longer sample is itself an average over more time: it weighs more.
    const double weight = std::min(1.0, 0.3 * double(sample_ns) / double(min_sample_ns));
    c.st.bandwidth_Bps = c.st.bandwidth_Bps == 0 ? sample : (1 - weight) * c.st.bandwidth_Bps + weight * sample;
  }
  c.bw_ref_acked = c.acked_bytes;
  c.bw_ref_busy = busy;
  c.bw_ref_periods = c.busy_periods;
}

// ---- verdicts of a waiting collective -------------------------------------------------

std::string TransportImpl::no_path_error_locked(const Peer& p, ErrorKind* kind) const {
  // A host that refuses, resets or closes every connection is up; its r2cc process is not.
  bool all_refused = true;
  std::string detail;
  for (auto& c : p.conns) {
    const std::string& e = c->st.last_error;
    detail += " rail" + std::to_string(c->rail) + ": " + (e.empty() ? rail_state_name(c->state) : e) + ";";
    if (!host_up_process_gone(c->last_cause)) all_refused = false;
  }
  const std::string where = "\nDetails: rank " + std::to_string(rank_) + " lost all " + std::to_string(num_rails()) +
                            " rails to rank " + std::to_string(p.rank) + " (" + detail + " )";
  // The first line is the same on every rank (peers adopt it through the abort frame or
  // reach it on their own); the detail line says who saw what.
  if (all_refused) {
    *kind = ErrorKind::kPeerGone;
    return "r2cc: a rank's process is gone (its host refused or closed every rail connection) while a "
           "collective waited on it: the group is aborted on all ranks. Restart the group." + where;
  }
  *kind = ErrorKind::kRailsDown;
  return "r2cc: every rail between two ranks stayed down for more than " + std::to_string(opt_.all_down_grace_ms) +
         " ms while a collective waited: the group is aborted on all ranks. Check the NICs and links of the hosts "
         "named below (`r2cc lab status` in the lab), then restart the group." + where;
}

void TransportImpl::check_wait_locked(int peer, bool sending, int64_t wait_start_ns, int64_t deadline_ns) {
  const Peer& p = *peers_[peer];
  const int64_t now = now_ns();
  // No path and a collective waiting on it: give the rails the grace period to come back
  // (counted from when this wait began or the path went, whichever is later).
  if (p.no_path_since_ns && now - std::max(p.no_path_since_ns, wait_start_ns) > ms_ns(opt_.all_down_grace_ms)) {
    ErrorKind kind;
    const std::string msg = no_path_error_locked(p, &kind);
    set_error_locked(kind, msg);
    return;
  }
  if (now <= deadline_ns) return;
  const std::string what = std::string("a transfer ") + (sending ? "to" : "from") + " rank " + std::to_string(peer) +
                           " did not finish within " + secs(int64_t(opt_.op_timeout_s * 1e9)) +
                           " s (R2CC_OP_TIMEOUT_S)";
  if (p.stalled_since_ns) {
    set_error_locked(ErrorKind::kPeerStalled,
                     "r2cc: rank " + std::to_string(peer) + " is stalled: " + what + ", and for " +
                         secs(now - p.stalled_since_ns) +
                         " s it sent nothing on any rail while its host kept acknowledging our bytes. The network is "
                         "fine; that process is stopped, paused or stuck (check it, e.g. `ps -o stat,pid`: T means "
                         "stopped). The group is aborted; restart it.");
  } else {
    set_error_locked(ErrorKind::kTimeout,
                     "r2cc: " + what + ": the collective timed out; a rank is stuck or the ranks called different "
                     "collectives. The group is aborted.");
  }
}

}  // namespace r2cc
