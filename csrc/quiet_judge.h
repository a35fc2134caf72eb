// Quiet-rail detection of one connection, as a value: silence and the kernel's path evidence in,
// "dead path" and "mute" out (the policy detector.cc and gray.cc act on). No sockets, no clock,
// no lock of its own: the detector feeds it under the transport lock, and the unit tests feed it
// plain numbers.
//
// A rail is quiet when the peer said nothing on it for its quiet time: rail_timeout_ms, or
// twice the kernel's retransmission estimate where the path's own round trips are that slow,
// never past max(peer_silence_ms, rail_timeout_ms) (the fail time). A quiet rail's path is dead
// when bytes we sent without pause for the whole quiet time went unacknowledged by the peer's
// kernel for the quiet time; it stays dead until that kernel acknowledges again or the peer
// speaks. Neither silence nor unacknowledged bytes count across a stall of this process (the
// watchdog ran over half a rail timeout late: stall_end_ns).
#pragma once

#include <algorithm>
#include <cstdint>

#include "net.h"  // PathInfo: plain numbers from TCP_INFO

namespace r2cc {

class QuietJudge {
 public:
  struct Params {
    int rail_timeout_ms = 60;
    int peer_silence_ms = 400;
  };
  QuietJudge() = default;
  explicit QuietJudge(const Params& p) : p_(p) {}

  int64_t floor_ns() const { return ms(p_.rail_timeout_ms); }
  // A rail quiet (or mute, or stuck) this long is failed for good.
  int64_t fail_after_ns() const { return ms(std::max(p_.peer_silence_ms, p_.rail_timeout_ms)); }

  // This process was held up (no CPU, or the lock): its watchdog pass came over half a rail
  // timeout after the last one. It sent nothing meanwhile, so silence across it is no evidence.
  static bool held_up(int64_t now, int64_t last_pass_ns, int64_t rail_timeout_ns) {
    return now - last_pass_ns > rail_timeout_ns / 2;
  }
  // How long the peer has been silent on the rail, not counting a stall of our own.
  static int64_t silent_ns(int64_t now, int64_t last_rx_ns, int64_t stall_end_ns) {
    return now - std::max(last_rx_ns, stall_end_ns);
  }

  // How long a rail may be quiet before it is suspect: twice the kernel's own retransmission
  // estimate (srtt + 4 rttvar, without its 200 ms floor), at least rail_timeout_ms, at most the
  // fail time. At 4 hosts x 250mbit the rails' queues made round trips of 10-20 ms vary by up to
  // 11 ms, and a 60 ms gap of ACKs and bytes on a healthy rail then and again failed it over for
  // nothing. A dead path keeps the estimate it had, so detection stays bounded.
  int64_t suspect_after_ns(const PathInfo& pi) const {
    if (!pi.ok) return floor_ns();
    const int64_t rto_ns = (int64_t(pi.rtt_us) + 4 * int64_t(pi.rttvar_us)) * 1000;
    return std::max(floor_ns(), std::min(2 * rto_ns, fail_after_ns()));
  }

  // The evidence of a dead path, from one look (no memory): our bytes, sent without pause
  // (tx_resume_ns) for the whole quiet time, unacknowledged by the peer's kernel for the quiet
  // time. After a pause of ours the first bytes may wait for the peer's delayed ACK, which is
  // not the path's fault. Sent and unacknowledged, or stuck unsent with the peer's window open
  // (no route: our own link is down); a zero window is a peer process that stopped reading.
  static bool dead_path_evidence(const PathInfo& pi, int64_t now, int64_t tx_resume_ns, int64_t stall_end_ns,
                                 int64_t quiet_ns) {
    if (now - std::max(tx_resume_ns, stall_end_ns) <= quiet_ns) return false;
    if (!pi.ok || int64_t(pi.last_ack_recv_ms) * 1000000 <= quiet_ns) return false;
    return pi.unacked > 0 || (pi.notsent_bytes > 0 && pi.snd_wnd > 0);
  }

  // The peer spoke on the rail (or bytes wait unread): a path that speaks is alive.
  void heard() { path_dead_ = false; }
  void reset() { path_dead_ = false; }  // a new socket, or none: no evidence either way
  // The rail was quiet past its bar (quiet_ns, from suspect_after_ns(pi)): judge its path. Once
  // dead, a path stays dead until there is evidence of life (the peer's kernel acknowledges
  // again, or heard()): a pause in our own sending only withholds evidence, and must not put a
  // dead rail back in service (it did, and the rail flapped). Returns path_dead().
  bool judge_quiet(const PathInfo& pi, int64_t now, int64_t tx_resume_ns, int64_t stall_end_ns, int64_t quiet_ns) {
    if (!path_dead_) path_dead_ = dead_path_evidence(pi, now, tx_resume_ns, stall_end_ns, quiet_ns);
    else if (pi.ok && int64_t(pi.last_ack_recv_ms) * 1000000 < quiet_ns) path_dead_ = false;
    return path_dead_;
  }
  bool path_dead() const { return path_dead_; }

  // A rail quiet for its quiet time with its path alive is mute (the peer's data is stuck on
  // it) when another rail of the peer spoke within half the rail timeout (its process runs),
  // unless the peer spoke again after a pause of its process (spoke_again_ns) of pause_ns less
  // than max(quiet time, twice the pause, at most peer_silence_ms) ago: its rails then come back
  // one by one, in any order, as its threads get a CPU (the longer the pause, the more to catch
  // up; a blip of a starved host costs little detection time).
  bool mute(int64_t now, int64_t quiet_ns, int64_t freshest_rx_ns, int64_t spoke_again_ns, int64_t pause_ns) const {
    if (!peer_runs(now, freshest_rx_ns)) return false;
    return now - spoke_again_ns >= std::max(quiet_ns, std::min(2 * pause_ns, ms(p_.peer_silence_ms)));
  }
  // A mute rail (set aside) fails for good when the peer's process runs (another rail spoke
  // within half the rail timeout) and this one has been silent for the fail time, counted from
  // no earlier than the peer's last wake-up: while the peer is stopped every rail is quiet, which
  // is no evidence against one. (A rail set aside between two SIGSTOPs was failed in the second,
  // "silent 807 ms while its other rails delivered", though for 300 ms of it none had.)
  bool mute_fails(int64_t now, int64_t silent_ns, int64_t freshest_rx_ns, int64_t spoke_again_ns) const {
    if (!peer_runs(now, freshest_rx_ns)) return false;
    return std::min(silent_ns, now - spoke_again_ns) > fail_after_ns();
  }

 private:
  static int64_t ms(int v) { return int64_t(v) * 1000000; }
  // The peer's process runs: one of its rails spoke within half the rail timeout.
  bool peer_runs(int64_t now, int64_t freshest_rx_ns) const {
    return now - freshest_rx_ns < ms(p_.rail_timeout_ms) / 2;
  }
  Params p_;
  bool path_dead_ = false;  // last look: our bytes go unacknowledged by the peer's kernel
};

}  // namespace r2cc
