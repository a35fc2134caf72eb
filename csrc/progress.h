// Whether this side's bytes on one connection move: the gray-failure judge.
//
// A path can pass small frames and not data (an MTU mismatch, a marginal optic, a policer): the
// peer's heartbeats and ACKs keep arriving, so "has the peer spoken" never fails the rail, and
// only TCP's user timeout (seconds) would. What tells is the kernel's count of our bytes the peer
// acknowledged (TCP_INFO tcpi_bytes_acked): it moves only when our data does.
//
// Verdicts, from samples of one socket:
//   kStuck  bytes were outstanding and none was acknowledged for stuck_after_ns;
//   kSlow   a backlog that the peer's usual rate (ref_Bps) would have delivered in half a window
//           was still not delivered after a whole window, at under 1/kSlowFactor of that rate:
//           a link renegotiated down, a port errored into a slow mode. Chunks on it are late.
// Neither is judged while the peer's receive window, not the path, limits us (a peer process
// that reads slowly or stopped reading: peer_paced), nor across a stall of our own (judge_from_ns).
//
// A value type: no sockets, no clock, no lock of its own; the detector feeds it (detector.cc).
#pragma once

#include <algorithm>
#include <cstdint>

namespace r2cc {

class ProgressJudge {
 public:
  enum class Verdict { kMoving, kStuck, kSlow };
  struct Sample {
    bool outstanding = false;  // bytes sent and not acknowledged, or queued with the window open
    uint64_t bytes_acked = 0;  // the socket's count of our bytes the peer acknowledged
    uint64_t queued = 0;       // bytes in the socket not yet acknowledged (sent or not)
    bool window_limited = false;  // the peer's receive window is smaller than what is queued
  };
  static constexpr int64_t kSlowWindowNs = 100000000;  // a slow verdict needs a backlog this long
  static constexpr double kSlowFactor = 4;

  // Whether the peer's pace, not the path's, holds our bytes back: its advertised window is
  // smaller than what we have queued and has shrunk to under half the widest it offered on this
  // socket, so its buffer holds bytes its process has not read. A window that never shrank is
  // the path's pace even when it is the limit: a re-dialed socket on a crawling path keeps the
  // receiver's first small window (it grows only as data arrives), and taking the window alone
  // for the peer's pace hid a 2mbit crawl for seconds.
  bool peer_paced(uint64_t queued, uint64_t snd_wnd) {
    widest_wnd_ = std::max(widest_wnd_, snd_wnd);
    return snd_wnd < queued && snd_wnd * 2 < widest_wnd_;
  }

  Verdict look(int64_t now, const Sample& s, int64_t stuck_after_ns, int64_t judge_from_ns, double ref_Bps) {
    if (!s.outstanding) {  // everything delivered: nothing to judge, a later backlog starts afresh
      acked_ = s.bytes_acked;
      moved_ns_ = 0;
      window_ns_ = 0;
      return Verdict::kMoving;
    }
    if (moved_ns_ == 0 || s.bytes_acked != acked_) {
      acked_ = s.bytes_acked;
      moved_ns_ = now;
    }
    if (s.window_limited) {  // the peer's pace, not the path's: no evidence either way
      moved_ns_ = now;
      window_ns_ = 0;
      return Verdict::kMoving;
    }
    if (window_ns_ && window_ns_ < judge_from_ns) window_ns_ = 0;  // we stalled within it
    if (now - std::max(moved_ns_, judge_from_ns) > stuck_after_ns) return Verdict::kStuck;
    if (window_ns_ == 0) {
      window_ns_ = now;
      window_acked_ = s.bytes_acked;
      window_queued_ = s.queued;
      return Verdict::kMoving;
    }
    const int64_t span = now - window_ns_;
    // A fixed window, not the quiet time: a crawling path's queue inflates the kernel's round-trip
    // estimate (a 10mbit rail: 400 ms), and a bar that grows with it never catches the crawl.
    if (span < kSlowWindowNs) return Verdict::kMoving;
    const uint64_t delivered = s.bytes_acked - window_acked_;
    const uint64_t backlog = window_queued_;
    window_ns_ = 0;
    const double secs = double(span) * 1e-9;
    rate_Bps_ = double(delivered) / secs;
    if (ref_Bps <= 0 || backlog == 0 || delivered >= backlog) return Verdict::kMoving;
    const bool due_long_ago = double(backlog) / ref_Bps <= secs / 2;
    return due_long_ago && rate_Bps_ * kSlowFactor < ref_Bps ? Verdict::kSlow : Verdict::kMoving;
  }

  // How long nothing has been acknowledged while bytes were outstanding (0: all delivered).
  int64_t stuck_for_ns(int64_t now) const { return moved_ns_ ? now - moved_ns_ : 0; }
  // What the last judged window delivered, bytes a second (a slow rail's rate).
  double last_rate_Bps() const { return rate_Bps_; }
  void reset() { *this = ProgressJudge(); }  // a new socket: its counts start at zero

 private:
  uint64_t acked_ = 0;
  int64_t moved_ns_ = 0;  // when acked_ last moved, or when bytes became outstanding; 0: none are
  int64_t window_ns_ = 0;  // start of the current slow window (0: none)
  uint64_t window_acked_ = 0, window_queued_ = 0;
  double rate_Bps_ = 0;
  uint64_t widest_wnd_ = 0;  // the widest window the peer advertised on this socket
};

}  // namespace r2cc
