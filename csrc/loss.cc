// Lossy rails: a path that drops a share of its packets (a bad optic, a dirty connector) stays
// up and passes most bytes, so nothing fails; but a chunk whose last segment is lost waits for
// the sender's retransmission timer (200 ms at least on Linux), and a collective waits for its
// slowest chunk. Such a rail is held out like a flapping one (dampening.cc): connected, probed
// by its heartbeats, given no new chunks, and the peer told.
//
// Evidence: the kernel's count of retransmitted segments, less those the peer D-SACKed (they lost
// nothing: loss_judge.h), against data segments sent on the connection (TCP_INFO), over a window of
// at least loss_min_segments and a second, compared with the peer's best other rail (so a host
// whose every rail retransmits, e.g. under congestion, holds none). The rail is held when its share
// is loss_hold_pct points above that and the retransmissions came in at least kLossSpread of the
// window's samples: a loss that lasts, not one burst (a rate cut overflows the queue once: 0.5% of
// a window's segments in one sample).
// A rail held for loss keeps being judged from its heartbeats, sent every watchdog tick while
// so held (~250 a second: 1% loss shows in ~4 s): still lossy, its hold's quiet time starts
// again; the hold ends when that time is up. Each new hold soon after the last one doubles, as
// for flapping, so a rail that keeps losing is kept out longer each time.
//
// The windows and the verdict are LossJudge (loss_judge.h); this file samples the sockets and
// acts on its verdicts.
//
// Contract: runs under the transport lock, from the watchdog, and never blocks.
#include <cstdio>

#include "transport_internal.h"

namespace r2cc {

void TransportImpl::check_loss_locked(Peer& p, Conn& c, int64_t now) {
  LossJudge& judge = c.loss;
  if (!judge.enabled() || !is_connected(c.state) || c.suspect || c.quiet.path_dead()) return;
  // A stalled peer process stops reading; its kernel then drops what overflows the socket's
  // memory and the sender retransmits, though the path loses nothing: start afresh a second
  // after it (those drops are retransmitted on the timer, after the peer is back). A pause too
  // short to be called a stall counts the same: 30 stops of 0.3 s held a clean rail for loss.
  if (LossJudge::peer_pause_excuses(now, p.stalled_since_ns, p.spoke_again_ns, p.pause_ns)) {
    judge.restart();
    return;
  }
  const uint64_t epoch = c.epoch.load();
  if (!judge.take_sample(now, epoch)) return;
  const PathInfo pi = io_->path_info(c.fd);
  if (!pi.ok) return;
  if (!c.damp.holding(now)) judge.probing = false;
  LossJudge::Window w;
  if (!judge.look(now, epoch, {pi.total_retrans, pi.data_segs_out, pi.dsack_dups}, &w)) return;
  // The best other rail to this peer over the same time: its current window where it carried
  // enough segments (a receiver that could not keep up, e.g. a stalled or starved peer process,
  // makes every rail that carries data to it retransmit), else its last judgement if recent
  // (none: compare with a clean path).
  LossJudge::BestOther best;
  for (auto& o : p.conns) {
    if (o.get() == &c || !is_connected(o->state)) continue;
    const PathInfo opi = o->loss.windows(o->epoch.load()) ? io_->path_info(o->fd) : PathInfo{};
    const LossJudge::Counts counts{opi.total_retrans, opi.data_segs_out, opi.dsack_dups};
    double share;
    if (o->loss.share_for_comparison(now, opi.ok ? &counts : nullptr, &share)) best.add(share);
  }
  const double best_other = best.value();
  if (!judge.lossy(w, best_other)) return;
  if (c.damp.extend(now)) return;  // still lossy while held
  c.damp.restart_levels_unless_recent(now);  // lossy again long after its last hold: the shortest hold
  char why[200];
  snprintf(why, sizeof(why),
           "lossy: %.1f%% of %u segments retransmitted over %.1f s, in %d of its samples (best other rail "
           "%.1f%%, hold at +%.1f points)",
           w.pct, w.segs, w.seconds, w.spread, best_other, opt_.loss_hold_pct);
  judge.probing = true;
  c.st.loss_holds++;
  counters_.loss_holds++;
  start_hold_locked(c, now, why);
}

}  // namespace r2cc
