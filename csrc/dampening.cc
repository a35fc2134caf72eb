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
// Contract: every function here runs under the transport lock and never blocks.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "transport_internal.h"

namespace r2cc {

double TransportImpl::flap_penalty_locked(const Conn& c, int64_t now) const {
  if (c.damp.penalty == 0 || opt_.flap_half_life_s <= 0) return c.damp.penalty;
  const double age_s = double(now - c.damp.penalty_ns) * 1e-9;
  return c.damp.penalty * std::exp2(-age_s / opt_.flap_half_life_s);
}

RailState TransportImpl::connected_state_locked(const Conn& c) const {
  if (rail_drained_[c.rail] || c.peer_drained) return c.inflight.empty() ? RailState::kDrained : RailState::kDraining;
  if (c.damp.holding(now_ns()) || c.damp.peer_holds) return RailState::kHeld;
  return RailState::kUp;
}

void TransportImpl::note_rail_failure_locked(Conn& c, const std::string& reason, int64_t now) {
  if (opt_.flap_threshold <= 0) return;
  Conn::Dampening& d = c.damp;
  const double before = flap_penalty_locked(c, now);
  if (before < opt_.flap_threshold / 2) d.level = 0;  // the last flapping has faded: start afresh
  d.penalty = before + 1;
  d.penalty_ns = now;
  c.st.flap_failures++;
  if (extend_hold_locked(c, now)) return;  // still flapping
  if (d.penalty < opt_.flap_threshold) return;
  char head[160];
  snprintf(head, sizeof(head), "flapping: %llu failures, penalty %.1f >= %.1f (halves every %.0f s); last: ",
           static_cast<unsigned long long>(c.st.flap_failures), d.penalty, opt_.flap_threshold,
           opt_.flap_half_life_s);
  start_hold_locked(c, now, head + reason);
}

bool TransportImpl::extend_hold_locked(Conn& c, int64_t now) {
  // Failing (or losing packets) again while held: the quiet time it must show starts again.
  if (!c.damp.holding(now)) return false;
  c.damp.hold_until_ns = now + hold_ns_locked(c.damp.level);
  return true;
}

int64_t TransportImpl::hold_ns_locked(int level) const {
  return int64_t(std::min(opt_.hold_max_s, opt_.hold_s * std::ldexp(1.0, level - 1)) * 1e9);
}

void TransportImpl::start_hold_locked(Conn& c, int64_t now, const std::string& reason) {
  Conn::Dampening& d = c.damp;
  d.level = std::min(d.level + 1, 30);
  d.hold_until_ns = now + hold_ns_locked(d.level);
  d.reason = reason;
  c.st.holds++;
  counters_.holds++;
  if (!is_connected(c.state)) return;  // install() tells the peer when a probe connects
  c.state = connected_state_locked(c);
  c.ctrl.push_back(control_frame(FrameType::kHold));
  peers_[c.peer]->wake_writers();
}

void TransportImpl::end_hold_locked(Conn& c, const char* why) {
  Conn::Dampening& d = c.damp;
  if (!d.hold_until_ns) return;
  d.hold_until_ns = 0;
  d.hold_ended_ns = now_ns();
  d.reason = std::string("hold ended: ") + why;
  if (!is_connected(c.state)) return;  // back when its next probe connects
  c.ctrl.push_back(control_frame(FrameType::kRelease));
  if (c.state == RailState::kHeld) c.state = connected_state_locked(c);
  peers_[c.peer]->wake_writers();
  notify_done_locked();
}

void TransportImpl::check_holds_locked(Peer& p, int64_t now) {
  for (auto& c : p.conns)
    if (c->damp.hold_until_ns && now >= c->damp.hold_until_ns) end_hold_locked(*c, "its time is up");
}

void TransportImpl::on_peer_hold_locked(Conn& c, bool held, bool restored) {
  c.damp.peer_holds = held;
  // The operator restored the rail at the peer: the hold ends at both ends, and the penalty with it.
  if (restored) forgive_locked(c, "restored by the operator at the peer");
  if (c.state == RailState::kUp || c.state == RailState::kHeld) c.state = connected_state_locked(c);
  peers_[c.peer]->wake_writers();
}

void TransportImpl::forgive_locked(Conn& c, const char* why) {
  c.damp.penalty = 0;
  c.damp.level = 0;
  end_hold_locked(c, why);
}

void TransportImpl::restore_conn_locked(Conn& c) {
  forgive_locked(c, "restored by the operator");
  // The peer's end is held too, most likely: tell it now, or when the rail next connects.
  if (is_connected(c.state)) c.ctrl.push_back(control_frame(FrameType::kRelease, 0, kReleaseRestored));
  else c.damp.restore_pending = true;
  peers_[c.peer]->wake_writers();
}

}  // namespace r2cc
