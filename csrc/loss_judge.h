// The loss verdict of one connection, as a value: the kernel's retransmission, D-SACK and
// data-segment counts in, "hold it" out (the policy loss.cc acts on; its header says why). No
// sockets, no clock, no lock of its own: the transport feeds it under its lock from the watchdog,
// and the unit tests feed it plain numbers.
//
// A window runs from one judgement to the next over one socket (by the connection's epoch). It
// is judged once it spans kWindowMinNs and carried min_segments segments (or kEnoughRetrans
// retransmissions); a window older than kWindowMaxNs without that starts again. The verdict is
// "lossy" when its retransmitted share is hold_pct points above the peer's best other rail and
// the retransmissions came in at least kSpread of its samples.
//
// A retransmission the peer reported as a duplicate (D-SACK: the original had arrived) lost
// nothing, and is not counted. On a busy host most are: the ACK comes late, the kernel's tail
// loss probe fires after two round trips and sends the last segment again. Beside a CPU-bound
// job, two ranks on loopback saw 211 retransmissions in 30 s, every one a probe and every one
// D-SACKed, and a clean rail was held for "0.7% loss".
#pragma once

#include <algorithm>
#include <cstdint>

namespace r2cc {

class LossJudge {
 public:
  struct Params {
    double hold_pct = 0;   // loss_hold_pct; 0: never judged
    int min_segments = 1000;  // loss_min_segments
  };
  static constexpr int64_t kSampleNs = 250000000;       // TCP_INFO per connection at most this often
  static constexpr int64_t kWindowMinNs = 1000000000;   // a window spans at least this (4 samples)
  static constexpr int kSpread = 3;                     // samples of a window that must see retransmissions
  // A window with this many retransmissions is judged before it has min_segments: at 5% loss
  // that is ~200 segments, and a healthy rail (under 0.02%) never gets there on few segments.
  static constexpr uint32_t kEnoughRetrans = 10;
  static constexpr uint32_t kCompareSegments = 100;     // another rail's current window says something from this many
  static constexpr int64_t kWindowMaxNs = 30000000000LL;  // a window this old without enough segments starts again

  // The socket's counts over its life (TCP_INFO tcpi_total_retrans, tcpi_data_segs_out,
  // tcpi_dsack_dups).
  struct Counts {
    uint32_t retrans = 0;
    uint32_t segs = 0;
    uint32_t dsacked = 0;  // segments the peer received twice: retransmissions that lost nothing
    // Retransmissions not proven needless. A D-SACK comes a round trip after its retransmission,
    // so between two samples this may fall: windows clamp their count at zero.
    int64_t unproven() const { return int64_t(retrans) - int64_t(dsacked); }
  };
  // A judged window.
  struct Window {
    double pct = 0;      // retransmitted share of its data segments, percent
    uint32_t segs = 0;
    double seconds = 0;
    int spread = 0;      // samples in which the retransmission count grew
  };

  LossJudge() = default;
  explicit LossJudge(const Params& p) : p_(p) {}
  bool enabled() const { return p_.hold_pct > 0; }

  // A paused peer process (stalled, or speaking again under kWindowMinNs ago after a pause of at
  // least kPauseExcusedNs) makes its sender retransmit though the path loses nothing: no window
  // runs across it. Shorter pauses (a starved host's blips) excuse nothing: on a loaded box they
  // came often enough to keep a lossy rail's window from ever filling.
  static constexpr int64_t kPauseExcusedNs = 100000000;
  static bool peer_pause_excuses(int64_t now, int64_t stalled_since_ns, int64_t spoke_again_ns, int64_t pause_ns) {
    return stalled_since_ns ||
           (spoke_again_ns && pause_ns >= kPauseExcusedNs && now - spoke_again_ns < kWindowMinNs);
  }
  void restart() { epoch_ = 0; }  // the next sample starts a new window

  // Whether a sample is due (kSampleNs since the last, or a new socket); when it is, the time
  // is noted as the last sample's, read or not.
  bool take_sample(int64_t now, uint64_t epoch) {
    if (sampled_ns_ && now - sampled_ns_ < kSampleNs && epoch_ == epoch) return false;
    sampled_ns_ = now;
    return true;
  }

  // The sample's counts. True (and *out) when it closed a window that is judged.
  bool look(int64_t now, uint64_t epoch, const Counts& c, Window* out) {
    if (epoch_ != epoch || now - start_ns_ > kWindowMaxNs || c.segs < segs0_ || c.retrans < retrans_seen_ ||
        c.dsacked < dsacked_seen_) {
      epoch_ = epoch;  // a new window; the last judgement (pct_, judged_ns_) stays
      start_ns_ = now;
      lost0_ = lost_seen_ = c.unproven();
      retrans_seen_ = c.retrans;
      dsacked_seen_ = c.dsacked;
      segs0_ = c.segs;
      samples_with_retrans_ = 0;
      return false;
    }
    if (c.unproven() > lost_seen_) samples_with_retrans_++;
    lost_seen_ = c.unproven();
    retrans_seen_ = c.retrans;
    dsacked_seen_ = c.dsacked;
    const uint32_t segs = c.segs - segs0_;
    const uint32_t retrans = uint32_t(std::max<int64_t>(0, c.unproven() - lost0_));
    if (now - start_ns_ < kWindowMinNs || (segs < uint32_t(p_.min_segments) && retrans < kEnoughRetrans)) return false;
    out->spread = samples_with_retrans_;
    out->pct = 100.0 * retrans / segs;
    out->segs = segs;
    out->seconds = double(now - start_ns_) * 1e-9;
    pct_ = out->pct;
    judged_ns_ = now;
    start_ns_ = now;
    lost0_ = c.unproven();
    segs0_ = c.segs;
    samples_with_retrans_ = 0;
    return true;
  }

  // Whether this judge's window is over the socket of `epoch` (else its counts say nothing of it).
  bool windows(uint64_t epoch) const { return epoch_ == epoch; }
  // This rail's share, to compare another rail of the peer with: its current window's where it
  // carried kCompareSegments (now: its socket's counts, null when unknown), else its last
  // judgement if under kWindowMaxNs old. False: it has nothing to say.
  bool share_for_comparison(int64_t now, const Counts* c, double* pct) const {
    const uint32_t segs = c ? c->segs - segs0_ : 0;
    if (c && c->segs >= segs0_ && c->retrans >= retrans_seen_ && segs >= kCompareSegments) {
      *pct = 100.0 * double(std::max<int64_t>(0, c->unproven() - lost0_)) / segs;
      return true;
    }
    if (judged_ns_ && now - judged_ns_ < kWindowMaxNs) {
      *pct = pct_;
      return true;
    }
    return false;
  }
  // The best (lowest) share of the other rails; 0 when none had one (compare with a clean path).
  struct BestOther {
    double pct = 100;
    bool any = false;
    void add(double share) {
      pct = std::min(pct, share);
      any = true;
    }
    double value() const { return any ? pct : 0; }
  };
  // The verdict on a judged window: lossy enough, and for long enough, to hold the rail.
  bool lossy(const Window& w, double best_other) const {
    return !(w.pct - best_other < p_.hold_pct || w.spread < kSpread);
  }

  double last_pct() const { return pct_; }  // share of the last judged window
  // Held for loss: heartbeats every watchdog tick, to judge the path sooner.
  bool probing = false;

 private:
  Params p_;
  // The socket the counts are from, by the connection's epoch (bumped at every install and
  // failure; a socket number is reused, so it cannot tell): a new socket starts a new window.
  uint64_t epoch_ = 0;
  int64_t start_ns_ = 0, sampled_ns_ = 0;
  uint32_t segs0_ = 0;
  int64_t lost0_ = 0;              // unproven retransmissions at the window's start
  int64_t lost_seen_ = 0;          // ... and at the last sample
  uint32_t retrans_seen_ = 0, dsacked_seen_ = 0;  // the counts at the last sample (a new socket's fall)
  int samples_with_retrans_ = 0;  // samples of this window in which the unproven count grew
  double pct_ = 0;
  int64_t judged_ns_ = 0;
};

}  // namespace r2cc
