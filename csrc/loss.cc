// Lossy rails: a path that drops a share of its packets (a bad optic, a dirty connector) stays
// up and passes most bytes, so nothing fails; but a chunk whose last segment is lost waits for
// the sender's retransmission timer (200 ms at least on Linux), and a collective waits for its
// slowest chunk. Such a rail is held out like a flapping one (dampening.cc): connected, probed
// by its heartbeats, given no new chunks, and the peer told.
//
// Evidence: the kernel's count of retransmitted segments against data segments sent on the
// connection (TCP_INFO), over a window of at least loss_min_segments and a second, compared with
// the peer's best other rail (so a host whose every rail retransmits, e.g. under congestion,
// holds none). The rail is held when its share is loss_hold_pct points above that and the
// retransmissions came in at least kLossSpread of the window's samples: a loss that lasts, not
// one burst (a rate cut overflows the queue once: 0.5% of a window's segments in one sample).
// A rail held for loss keeps being judged from its heartbeats, sent every watchdog tick while
// so held (~250 a second: 1% loss shows in ~4 s): still lossy, its hold's quiet time starts
// again; the hold ends when that time is up. Each new hold soon after the last one doubles, as
// for flapping, so a rail that keeps losing is kept out longer each time.
//
// Contract: runs under the transport lock, from the watchdog, and never blocks.
#include <algorithm>
#include <cstdio>

#include "transport_internal.h"

namespace r2cc {

namespace {
constexpr int64_t kLossSampleNs = 250000000;   // TCP_INFO per connection at most this often
constexpr int64_t kLossWindowMinNs = 1000000000;  // a window spans at least this (4 samples)
constexpr int kLossSpread = 3;  // samples of a window that must see retransmissions
// A window with this many retransmissions is judged before it has loss_min_segments: at 5% loss
// that is ~200 segments, and a healthy rail (under 0.02%) never gets there on few segments.
constexpr uint32_t kLossEnoughRetrans = 10;
constexpr uint32_t kLossCompareSegments = 100;  // another rail's current window says something from this many
constexpr int64_t kLossWindowMaxNs = 30000000000LL;  // a window this old without enough segments starts again
}  // namespace

void TransportImpl::check_loss_locked(Peer& p, Conn& c, int64_t now) {
  if (opt_.loss_hold_pct <= 0 || !is_connected(c.state) || c.suspect || c.path_dead) return;
  Conn::LossWindow& w = c.loss;
  // A stalled peer process stops reading; its kernel then drops what overflows the socket's
  // memory and the sender retransmits, though the path loses nothing: start afresh a second
  // after it (those drops are retransmitted on the timer, after the peer is back). A pause too
  // short to be called a stall counts the same: 30 stops of 0.3 s held a clean rail for loss.
  if (p.stalled_since_ns || (p.spoke_again_ns && now - p.spoke_again_ns < kLossWindowMinNs)) {
    w.epoch = 0;  // the next sample after the stall starts a new window
    return;
  }
  const uint64_t epoch = c.epoch.load();
  if (w.sampled_ns && now - w.sampled_ns < kLossSampleNs && w.epoch == epoch) return;
  w.sampled_ns = now;
  const PathInfo pi = path_info(c.fd);
  if (!pi.ok) return;
  if (!c.damp.holding(now)) w.probing = false;
  if (w.epoch != epoch || now - w.start_ns > kLossWindowMaxNs || pi.data_segs_out < w.segs0 ||
      pi.total_retrans < w.retrans0) {
    w.epoch = epoch;  // a new window; the last judgement (pct, judged_ns) stays
    w.start_ns = now;
    w.retrans0 = w.retrans_seen = pi.total_retrans;
    w.segs0 = pi.data_segs_out;
    w.samples_with_retrans = 0;
    return;
  }
  if (pi.total_retrans != w.retrans_seen) w.samples_with_retrans++;
  w.retrans_seen = pi.total_retrans;
  const uint32_t segs = pi.data_segs_out - w.segs0;
  const uint32_t retrans = pi.total_retrans - w.retrans0;
  if (now - w.start_ns < kLossWindowMinNs || (segs < uint32_t(opt_.loss_min_segments) && retrans < kLossEnoughRetrans))
    return;
  const int spread = w.samples_with_retrans;
  const double pct = 100.0 * retrans / segs;
  const double window_s = double(now - w.start_ns) * 1e-9;
  w.pct = pct;
  w.judged_ns = now;
  w.start_ns = now;
  w.retrans0 = pi.total_retrans;
  w.segs0 = pi.data_segs_out;
  w.samples_with_retrans = 0;
  // The best other rail to this peer over the same time: its current window where it carried
  // enough segments (a receiver that could not keep up, e.g. a stalled or starved peer process,
  // makes every rail that carries data to it retransmit), else its last judgement if recent
  // (none: compare with a clean path).
  double best_other = 100;
  bool any_other = false;
  for (auto& o : p.conns) {
    if (o.get() == &c || !is_connected(o->state)) continue;
    const Conn::LossWindow& ow = o->loss;
    const PathInfo opi = ow.epoch == o->epoch.load() ? path_info(o->fd) : PathInfo{};
    const uint32_t osegs = opi.ok ? opi.data_segs_out - ow.segs0 : 0;
    if (opi.ok && opi.data_segs_out >= ow.segs0 && opi.total_retrans >= ow.retrans0 && osegs >= kLossCompareSegments) {
      best_other = std::min(best_other, 100.0 * (opi.total_retrans - ow.retrans0) / osegs);
      any_other = true;
    } else if (ow.judged_ns && now - ow.judged_ns < kLossWindowMaxNs) {
      best_other = std::min(best_other, ow.pct);
      any_other = true;
    }
  }
  if (!any_other) best_other = 0;
  Conn::Dampening& d = c.damp;
  if (pct - best_other < opt_.loss_hold_pct || spread < kLossSpread) return;
  if (extend_hold_locked(c, now)) return;  // still lossy while held
  // A rail lossy again long after its last hold starts from the shortest hold.
  if (!d.hold_ended_ns || now - d.hold_ended_ns > int64_t(opt_.hold_max_s * 1e9)) d.level = 0;
  char why[200];
  snprintf(why, sizeof(why),
           "lossy: %.1f%% of %u segments retransmitted over %.1f s, in %d of its samples (best other rail "
           "%.1f%%, hold at +%.1f points)",
           pct, segs, window_s, spread, best_other, opt_.loss_hold_pct);
  w.probing = true;
  c.st.loss_holds++;
  counters_.loss_holds++;
  start_hold_locked(c, now, why);
}

}  // namespace r2cc
