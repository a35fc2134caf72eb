// Flap dampening: a rail that keeps failing is held out instead of being re-admitted at once.
//
// Each failure of a (peer, rail) connection (its chunks failed over: a socket error, a dead
// path, a rail gone quiet; never an operator's failover) adds 1 to the connection's penalty,
// which halves every flap_half_life_s. A failure that brings the penalty to flap_threshold holds
// the rail until it has gone hold_s without failing (a failure during the hold starts that time
// again); each new hold while the penalty stays high doubles it, up to hold_max_s. So a rail is
// held for as long as it flaps and a while after, and one that flaps again soon after its
// return stays out longer each time. A held rail keeps being dialed and, once connected, keeps its heartbeats (so a
// further failure is seen and counted: that is the probing) but takes no new chunks, and the
// peer is told (kHold) so that neither side sends on it. When the hold ends the rail is back at
// once if it is connected, else when its next probe connects. restore_rail ends a hold on both
// ends. Like a drained rail, a held one still carries traffic when no other rail can.
//
// With the defaults (threshold 2, half-life 60 s) the third failure within about a minute holds
// the rail; one or two failures never do, so a single fault is re-admitted as fast as without
// dampening. Each side judges from its own failures; either side's hold keeps both off the rail.
//
// The arithmetic (penalty, levels, hold times) is FlapDampening (dampening.h); this file acts on
// its decisions: states, frames to the peer, counters.
//
// Contract: every function here runs under the transport lock and never blocks.
#include <cstdio>

#include "transport_internal.h"

namespace r2cc {

bool TransportImpl::drained_locked(const Conn& c) const { return rail_drained_[c.rail] || c.peer_drained; }

RailState TransportImpl::connected_state_locked(const Conn& c) const {
  if (drained_locked(c)) return c.inflight.empty() ? RailState::kDrained : RailState::kDraining;
  if (c.damp.holding(now_ns()) || c.peer_holds) return RailState::kHeld;
  return RailState::kUp;
}

void TransportImpl::note_rail_failure_locked(Conn& c, const std::string& reason, int64_t now) {
  // Counted with dampening off too: R2ccRailFlapping alerts on this count.
  c.st.flap_failures++;
  const FlapDampening::Failure f = c.damp.note_failure(now);
  if (f != FlapDampening::Failure::kHold) return;  // dampening off, counted, or a hold under way restarted
  char head[160];
  snprintf(head, sizeof(head), "flapping: %llu failures, penalty %.1f >= %.1f (halves every %.0f s); last: ",
           static_cast<unsigned long long>(c.st.flap_failures), c.damp.penalty_at_last_failure(), opt_.flap_threshold,
           opt_.flap_half_life_s);
  start_hold_locked(c, now, head + reason);
}

void TransportImpl::start_hold_locked(Conn& c, int64_t now, const std::string& reason) {
  c.damp.start_hold(now, reason);
  c.st.holds++;
  counters_.holds++;
  if (!is_connected(c.state)) return;  // install() tells the peer when a probe connects
  c.state = connected_state_locked(c);
  c.ctrl.push_back(control_frame(FrameType::kHold));
  peers_[c.peer]->wake_writers();
}

void TransportImpl::end_hold_locked(Conn& c, const char* why) {
  if (!c.damp.end_hold(now_ns(), why)) return;
  if (!is_connected(c.state)) return;  // back when its next probe connects
  c.ctrl.push_back(control_frame(FrameType::kRelease));
  if (c.state == RailState::kHeld) c.state = connected_state_locked(c);
  peers_[c.peer]->wake_writers();
  notify_done_locked();
}

void TransportImpl::check_holds_locked(Peer& p, int64_t now) {
  for (auto& c : p.conns)
    if (c->damp.hold_expired(now)) end_hold_locked(*c, "its time is up");
}

void TransportImpl::on_peer_hold_locked(Conn& c, bool held, bool restored) {
  c.peer_holds = held;
  // The operator restored the rail at the peer: the hold ends at both ends, and the penalty with it.
  if (restored) forgive_locked(c, "restored by the operator at the peer");
  if (c.state == RailState::kUp || c.state == RailState::kHeld) c.state = connected_state_locked(c);
  peers_[c.peer]->wake_writers();
}

void TransportImpl::forgive_locked(Conn& c, const char* why) {
  c.damp.forgive();
  end_hold_locked(c, why);
}

void TransportImpl::restore_conn_locked(Conn& c) {
  forgive_locked(c, "restored by the operator");
  // The peer's end is held too, most likely: tell it now, or when the rail next connects.
  if (is_connected(c.state)) c.ctrl.push_back(control_frame(FrameType::kRelease, 0, kReleaseRestored));
  else c.restore_pending = true;
  peers_[c.peer]->wake_writers();
}

}  // namespace r2cc
