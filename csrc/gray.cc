// Gray failures: rails on which the peer still speaks while data does not move. detector.cc
// judges rails that went quiet; a gray path (an MTU mismatch, a marginal optic, a policer) passes
// the small frames (heartbeats, ACKs) and drops or crawls the full-size ones, so it never goes
// quiet, and before this only TCP's user timeout (5 s) ended it.
//
// Evidence, each judged against the same quiet time as a silent rail (suspect_after_ns):
//   stuck  our bytes are outstanding and the peer's host acknowledges none of them (TCP_INFO's
//          count of bytes acknowledged stands still) though it keeps speaking;
//   slow   our backlog is delivered at a small fraction of the peer's usual rate (progress.h);
//   mute   the peer's bytes stop on one rail while its other rails deliver: TCP is one byte
//          stream, so a lost full-size segment holds back the heartbeats queued behind it.
// Each sets the rail aside (its chunks go to the others, as for a quiet rail). Stuck and mute
// rails that stay so past peer_silence_ms are failed for real and re-dialed; only then does flap
// dampening count them, so a loss that TCP repaired late costs a re-send, not a hold. A slow
// verdict counts at once (a rail that keeps crawling is held, as one that keeps failing); the
// rail is re-weighed at the rate it showed and back once it has delivered its backlog.
//
// An idle rail carries only small frames, which a gray path passes: every half rail timeout it
// gets a full-size probe (kProbe). A new connection takes new chunks only once its first probe
// was delivered (Conn::proven), so a re-dialed gray path is found by a probe, not by data.
//
// Contract: every function here runs under the transport lock, from a watchdog pass, and never
// blocks (the probe's write is non-blocking and only goes with room for all of it).

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "net.h"
#include "transport_internal.h"

namespace r2cc {

namespace {
// A probe fills one segment of the socket: a standard frame's, or a jumbo frame's on a rail with
// MTU up to 9000. A larger segment is no Ethernet frame (loopback, the lab's 64 KiB veths): there
// a standard frame is probed. (9 KB probes there, into a peer that a test then stopped, left its
// kernel unable to take our bytes without acknowledging them: a dead path to the detector.)
constexpr size_t kProbeMaxSegment = 9000 - 40;
constexpr size_t kProbeDefaultSegment = 1500 - 40;  // also until the socket's own is known
const char kZeros[kProbeMaxSegment] = {};
}  // namespace

double TransportImpl::usual_rate_locked(const Peer& p) const {
  double best = 0;
  for (auto& o : p.conns)
    if (is_connected(o->state)) best = std::max(best, o->st.bandwidth_Bps);
  return best;
}

void TransportImpl::judge_progress_locked(Peer& p, Conn& c, int64_t now, int64_t stall_end_ns, bool hears) {
  const uint64_t epoch = c.epoch.load();
  if (c.progress_epoch != epoch) {  // a new socket: its counts start at zero
    c.progress.reset();
    c.progress_epoch = epoch;
    c.progress_outstanding = false;
  }
  const bool own_suspicion = c.suspect && (c.suspect_why == SuspectWhy::kStuck ||
                                           c.suspect_why == SuspectWhy::kSlow);
  // Nothing outstanding at the last look and nothing sent since: nothing to look at.
  if (!c.progress_outstanding && !own_suspicion && c.tx_done_ns.load() <= c.progress_sampled_ns) return;
  const PathInfo pi = io_->path_info(c.fd);
  if (!pi.ok) return;
  c.progress_sampled_ns = now;
  if (pi.snd_mss) c.mss = pi.snd_mss;
  ProgressJudge::Sample s;
  s.outstanding = pi.unacked > 0 || (pi.notsent_bytes > 0 && pi.snd_wnd > 0);
  s.bytes_acked = pi.bytes_acked;
  s.queued = uint64_t(std::max(0, io_->bytes_unacked(c.fd)));
  s.window_limited = c.progress.peer_paced(s.queued, pi.snd_wnd);
  c.progress_outstanding = s.outstanding;
  if (!c.proven && c.probe_sent_ns && !s.outstanding) {  // the probe and all before it delivered
    c.proven = true;
    p.wake_writers();
  }
  const int64_t quiet_ns = c.quiet.suspect_after_ns(pi);
  const ProgressJudge::Verdict v =
      c.progress.look(now, s, quiet_ns, stall_end_ns, usual_rate_locked(p));
  const int64_t stuck_ns = c.progress.stuck_for_ns(now);
  // Words for a verdict only: this runs every pass while bytes are outstanding.
  auto where = [&] { return "rail" + std::to_string(c.rail) + " to rank " + std::to_string(p.rank); };
  if (own_suspicion) {
    if (!s.outstanding) {  // every byte of ours delivered: the path carries data again
      c.suspect = false;
      p.wake_writers();
    } else if (c.suspect_why == SuspectWhy::kStuck &&
               stuck_ns > c.quiet.fail_after_ns()) {
      fail_conn_locked(c, epoch, IoCause::kTimeout,
                       where() + ": none of our bytes acknowledged for " + std::to_string(stuck_ns / 1000000) +
                           " ms while the peer kept speaking on it (a gray failure: small frames pass, data "
                           "does not; check the path's MTU and the NIC's error counters)");
    }
    return;
  }
  // A rail gone quiet is judged by detector.cc; and one set aside for another reason stays so.
  if (!hears || c.suspect || v == ProgressJudge::Verdict::kMoving) return;
  char why[320];
  if (v == ProgressJudge::Verdict::kStuck) {
    snprintf(why, sizeof(why),
             "%s: none of our bytes acknowledged by its host for %lld ms though it keeps speaking (data stuck "
             "on the path: an MTU mismatch, a marginal optic or a policer)",
             where().c_str(), static_cast<long long>(stuck_ns / 1000000));
    suspect_conn_locked(c, IoCause::kTimeout, why, SuspectWhy::kStuck);
    c.st.stuck_suspects++;
    c.st.last_detect_s = double(stuck_ns) * 1e-9;
  } else {
    const double rate = c.progress.last_rate_Bps();
    snprintf(why, sizeof(why),
             "%s: delivered our backlog at %.1f MB/s against the usual %.1f MB/s (a slow path: its chunks "
             "were late and were sent again on other rails)",
             where().c_str(), rate / 1e6, usual_rate_locked(p) / 1e6);
    suspect_conn_locked(c, IoCause::kTimeout, why, SuspectWhy::kSlow);
    // Weighed from now at the rate it showed: its window and share shrink to match.
    c.st.bandwidth_Bps = rate;
    c.st.slow_suspects++;
    c.st.last_detect_s = double(ProgressJudge::kSlowWindowNs) * 1e-9;
  }
  counters_.gray_suspects++;
}

void TransportImpl::judge_mute_locked(Peer& p, Conn& c, int64_t now, int64_t silent_ns, int64_t quiet_ns,
                                  int64_t freshest_rx_ns) {
  const std::string where = "rail" + std::to_string(c.rail) + " to rank " + std::to_string(p.rank);
  if (c.suspect) {
    if (c.suspect_why == SuspectWhy::kMute && c.quiet.mute_fails(now, silent_ns, freshest_rx_ns, p.spoke_again_ns))
      fail_conn_locked(c, c.epoch.load(), IoCause::kTimeout,
                       where + ": no bytes from the peer on it for " + std::to_string(silent_ns / 1000000) +
                           " ms while its other rails delivered (a gray failure: its data is stuck on this path)");
    return;
  }
  // The peer's process runs (another of its rails spoke within half the rail timeout) and sends
  // heartbeats on every rail in one pass; this one has been silent for its whole quiet time.
  // Not while the peer catches up after a pause of its process (SIGSTOP, starvation): its rails
  // come back as its threads get a CPU, in any order, and a writer descheduled mid-frame keeps its
  // rail quiet (no heartbeat can go between a frame's bytes). Seen: a rail quiet across the whole
  // pause set aside a pass after another spoke, and one quiet 77 ms just after the pause.
  if (!c.quiet.mute(now, quiet_ns, freshest_rx_ns, p.spoke_again_ns, p.pause_ns)) return;
  suspect_conn_locked(c, IoCause::kTimeout,
                      where + ": no bytes from the peer on it for " + std::to_string(silent_ns / 1000000) +
                          " ms while its other rails delivered (its data is stuck on this path)",
                      SuspectWhy::kMute);
  c.st.mute_suspects++;
  c.st.last_detect_s = double(silent_ns) * 1e-9;
  counters_.gray_suspects++;
}

void TransportImpl::send_probe_locked(Conn& c, const Peer& p, int64_t now) {
  // Only where nothing else tests the path (data in flight is full-size segments already), and
  // only to a peer that is reading: a probe is bytes too, and a stopped process's kernel stops
  // acknowledging once its buffers are full, which would read as a dead path.
  if (!is_connected(c.state) || c.writing || !c.inflight.empty()) return;
  // A drained rail carries no bytes (the operator's promise), once proven: a re-dialed one is
  // still probed, or it could never take chunks after the undrain.
  if (drained_locked(c) && c.proven) return;
  if (now - c.probe_sent_ns < ms_ns(opt_.rail_timeout_ms) / 2) return;
  if (p.stalled_since_ns || now - c.last_rx_ns.load() > ms_ns(opt_.rail_timeout_ms)) return;
  if (io_->bytes_unacked(c.fd) != 0) return;  // bytes still on their way: the path is being tested
  const size_t segment = c.mss && c.mss <= kProbeMaxSegment ? size_t(c.mss) : kProbeDefaultSegment;
  const size_t pad = segment > sizeof(FrameHeader) ? segment - sizeof(FrameHeader) : 0;
  if (send_room_locked(c, sizeof(FrameHeader) + pad) < sizeof(FrameHeader) + pad) return;
  FrameHeader h = control_frame(FrameType::kProbe, 0, 0, uint32_t(pad));
  const ssize_t w = io_->send_nonblocking(c.fd, &h, sizeof(h), kZeros, pad);
  if (w == ssize_t(sizeof(h) + pad)) {
    c.probe_sent_ns = now;
    c.last_tx_ns = now;
    c.note_tx(now, ms_ns(opt_.rail_timeout_ms) / 2);
    counters_.probes++;
    return;
  }
  if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // nothing written: the next pass
  if (w < 0 && io_->bytes_readable(c.fd) > 0) return;  // unread bytes first: a goodbye (send_frames_now_locked)
  // A partial write leaves the stream mid-frame; an error is the rail's.
  IoResult r = w < 0 ? IoResult::sys_error("send", errno) : IoResult::failure(IoCause::kOther, "partial probe write");
  if (std::string why = w < 0 ? io_->failure(c.fd) : ""; !why.empty()) r.detail = std::move(why);
  fail_conn_locked(c, c.epoch.load(), r.cause, send_failed(c, r.text()));
}

}  // namespace r2cc
