// Operator actions on a rail of this rank (drain, undrain, failover, restore), the test
// fault injector, and the statistics the admin API shows.
//
// Contract: each action is atomic under the transport lock and returns without waiting for
// the wire (frames to the peers go out on the rails' writers); a refused action
// (LastRailError, out_of_range) changes nothing. Stats are copies taken under the lock.
#include <sys/stat.h>

#include <algorithm>
#include <stdexcept>

#include "net.h"
#include "transport_internal.h"

namespace r2cc {

void TransportImpl::check_rail(int rail) const {
  if (rail < 0 || rail >= num_rails())
    throw std::out_of_range("r2cc: no rail " + std::to_string(rail) + "; this group has rails 0.." +
                            std::to_string(num_rails() - 1));
}

void TransportImpl::check_last_rail_locked(int rail, const char* action) const {
  // Healthy = takes new chunks: connected, not suspect, drained by neither side, not held.
  const int primaries = num_rails() - opt_.fallback_rails;
  if (rail >= primaries) return;  // a fallback rail is never the last healthy one
  for (auto& p : peers_) {
    if (p->rank == rank_ || p->closed) continue;
    bool other = false;
    for (int r = 0; r < primaries && !other; ++r) {
      const Conn& c = *p->conns[r];
      other = r != rail && c.state == RailState::kUp && !c.suspect && !c.peer_drained && !rail_held_[r];
    }
    if (!other)
      throw LastRailError("r2cc: rail" + std::to_string(rail) + " is the last healthy rail from rank " +
                          std::to_string(rank_) + " to rank " + std::to_string(p->rank) + "; " + action +
                          " it with force if you mean it (traffic then moves to drained or fallback rails)");
  }
}

std::vector<std::pair<TransportImpl::Peer*, TransportImpl::Conn*>> TransportImpl::conns_on_rail_locked(int rail) const {
  std::vector<std::pair<Peer*, Conn*>> out;
  for (auto& p : peers_)
    if (p->rank != rank_) out.emplace_back(p.get(), p->conns[size_t(rail)].get());
  return out;
}

void TransportImpl::set_rail_drained_locked(int rail, bool drained) {
  // Connected rails change state at once and tell the peer; a rail that connects later
  // learns it at install (rail_drained_).
  rail_drained_[rail] = drained;
  for (auto [p, c] : conns_on_rail_locked(rail)) {
    if (!is_connected(c->state)) continue;
    c->state = connected_state_locked(*c);
    c->ctrl.push_back(control_frame(drained ? FrameType::kDrain : FrameType::kUndrain));
    p->wake_writers();
  }
}

void TransportImpl::drain_rail(int rail, bool force) {
  check_rail(rail);
  std::lock_guard<std::mutex> g(mu_);
  if (!force) check_last_rail_locked(rail, "drain");
  set_rail_drained_locked(rail, true);
}

void TransportImpl::undrain_rail(int rail) {
  check_rail(rail);
  std::lock_guard<std::mutex> g(mu_);
  set_rail_drained_locked(rail, false);
}

void TransportImpl::failover_rail(int rail, bool force) {
  check_rail(rail);
  std::lock_guard<std::mutex> g(mu_);
  if (!force) check_last_rail_locked(rail, "fail over");
  rail_held_[rail] = true;
  for (auto [p, c] : conns_on_rail_locked(rail))
    fail_conn_locked(*c, c->epoch.load(), IoCause::kOther, "operator failover");
}

void TransportImpl::check_conn(int peer, int rail) const {
  if (peer < 0 || peer >= world_ || peer == rank_ || rail < 0 || rail >= num_rails())
    throw std::out_of_range("r2cc: no connection to rank " + std::to_string(peer) + " on rail " + std::to_string(rail));
}

void TransportImpl::inject_failure(int peer, int rail, int64_t chunks) {
  check_conn(peer, rail);
  std::lock_guard<std::mutex> g(mu_);
  peers_[peer]->conns[rail]->fail_after_chunks = chunks;
}

void TransportImpl::inject_full_socket(int peer, int rail) {
  check_conn(peer, rail);
  std::lock_guard<std::mutex> g(mu_);
  peers_[peer]->conns[rail]->skip_room_check = true;
}

void TransportImpl::restore_rail(int rail) {
  check_rail(rail);
  std::lock_guard<std::mutex> g(mu_);
  rail_held_[rail] = false;
  for (auto [p, c] : conns_on_rail_locked(rail)) {
    restore_conn_locked(*c);
    c->last_probe_ns = 0;  // probe at once
  }
  dial_cv_.notify_one();
}

// ---- stats -------------------------------------------------------------------

std::string TransportImpl::shown_state_locked(const Conn& c) const {
  // After an abort no rail carries the group's data, whatever its socket says.
  return aborted_ ? "aborted" : c.suspect ? "down" : rail_state_name(c.state);
}

std::string TransportImpl::hold_reason_locked(const Conn& c, int64_t now) const {
  if (c.damp.holding(now)) return c.damp.reason();
  return c.peer_holds ? "rank " + std::to_string(c.peer) + " holds it out (flapping or losing packets at its end)" : "";
}

std::string TransportImpl::state_signature() const {
  std::lock_guard<std::mutex> g(mu_);
  return state_signature_locked();
}

std::string TransportImpl::state_signature_locked() const {
  // Cheap on purpose (no syscalls, no TCP_INFO): the monitor asks ten times a second, and a
  // full sample (stats() and the rest) cost a rank 0.15-0.5 ms of CPU each time, taken from a
  // spinning caller by a thread that runs at a higher priority.
  const int64_t now = now_ns();
  std::string out = error_;
  for (auto& p : peers_) {
    if (p->rank == rank_) continue;
    out += "|peer" + std::to_string(p->rank) + (p->stalled_since_ns ? " stalled" : "") + (p->closed ? " closed" : "");
    for (auto& c : p->conns)
      out += "|rail" + std::to_string(c->rail) + " " + shown_state_locked(*c) + " " + hold_reason_locked(*c, now) +
             " " + c->st.last_error;
  }
  return out;
}

namespace {
bool modified_since(const std::string& path, int64_t since_ns) {
  struct stat st;
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return false;
  return int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec >= since_ns;
}
}  // namespace

std::string TransportImpl::wait_state_change(const std::string& seen, int poll_ms, int timeout_ms,
                                         const std::string& watch_path, int64_t watch_since_ns) {
  const int64_t until = now_ns() + int64_t(std::max(0, timeout_ms)) * 1000000;
  // A look now, as the seen signature or the request may be older than this call.
  if (modified_since(watch_path, watch_since_ns)) return state_signature();
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t interrupts = state_wait_interrupts_;
  const int64_t every = int64_t(std::max(1, poll_ms)) * 1000000;
  StateWatch watch{&seen, &watch_path, watch_since_ns, every, now_ns() + every};
  state_watches_.push_back(&watch);
  for (;;) {
    const int64_t now = now_ns();
    if (watch.fired || state_signature_locked() != seen || state_wait_interrupts_ != interrupts ||
        stopping_.load() || now >= until)
      break;
    state_cv_.wait_for(lk, std::chrono::nanoseconds(until - now));
  }
  state_watches_.erase(std::find(state_watches_.begin(), state_watches_.end(), &watch));
  return state_signature_locked();
}

void TransportImpl::check_state_watches_locked(int64_t now) {
  // A stat() and the signature's text, at most every poll_ms, on a thread that runs anyway.
  bool wake = false;
  for (StateWatch* w : state_watches_) {
    if (w->fired || now < w->next_ns) continue;
    w->next_ns = now + w->every_ns;
    w->fired = state_signature_locked() != *w->seen || modified_since(*w->path, w->since_ns);
    wake |= w->fired;
  }
  if (wake) state_cv_.notify_all();
}

void TransportImpl::interrupt_state_wait() {
  std::lock_guard<std::mutex> g(mu_);
  state_wait_interrupts_++;
  state_cv_.notify_all();
}

std::vector<ConnStats> TransportImpl::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  const int64_t now = now_ns();
  std::vector<ConnStats> out;
  for (auto& p : peers_) {
    if (p->rank == rank_) continue;
    for (auto& c : p->conns) {
      ConnStats s = c->st;
      s.state = shown_state_locked(*c);
      s.held = rail_held_[c->rail];
      s.flap_penalty = c->damp.penalty(now);
      s.hold_left_s = double(c->damp.hold_left_ns(now)) * 1e-9;
      s.hold_reason = hold_reason_locked(*c, now);
      s.retrans_pct = c->loss.last_pct();
      s.fallback = c->rail >= num_rails() - opt_.fallback_rails;
      s.inflight_bytes = c->inflight_bytes;
      s.suspect_after_s = double(c->quiet.suspect_after_ns(io_->path_info(is_connected(c->state) ? c->fd : -1))) * 1e-9;
      out.push_back(s);
    }
  }
  return out;
}

std::vector<PeerStats> TransportImpl::peer_stats() const {
  std::lock_guard<std::mutex> g(mu_);
  const int64_t now = now_ns();
  std::vector<PeerStats> out;
  for (auto& p : peers_) {
    if (p->rank == rank_) continue;
    PeerStats s;
    s.peer = p->rank;
    s.stalled = p->stalled_since_ns != 0;
    s.stalled_for_s = s.stalled ? double(now - p->stalled_since_ns) * 1e-9 : 0;
    s.stalls = p->stalls;
    s.last_stall_s = p->last_stall_s;
    int64_t heard = 0;
    for (auto& c : p->conns) heard = std::max(heard, c->last_rx_ns.load());
    s.silent_s = heard ? double(now - heard) * 1e-9 : 0;
    s.has_path = peer_has_path_locked(*p);
    s.closed = p->closed;
    s.chunk_bytes = bulk_chunk_locked(*p);
    s.chunk_cost_bytes = chunk_cost_bytes_locked(*p);
    const int rails = rails_taking_chunks_locked(*p);
    // The striping choice as two sizes: from which message up a second rail, and every rail, take a share.
    auto chunks_at = [&](size_t len) {
      return num_chunks(len, chunk_size_for(len, chunk_grain(), stripe_rails(len, rails, s.chunk_cost_bytes)));
    };
    auto smallest_with = [&](size_t want) {  // chunks_at grows with len up to the bulk size
      size_t lo = 1, hi = chunk_grain() * size_t(rails);
      if (chunks_at(hi) < want) return hi + 1;  // only bulk messages (which use every rail)
      while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (chunks_at(mid) >= want) hi = mid;
        else lo = mid + 1;
      }
      return lo;
    };
    s.one_rail_max_bytes = smallest_with(2) - 1;
    s.all_rails_min_bytes = smallest_with(size_t(rails));
    out.push_back(s);
  }
  return out;
}

Counters TransportImpl::counters() const {
  std::lock_guard<std::mutex> g(mu_);
  Counters c = counters_;
  c.spin_hits = spin_hits_.load();
  c.spin_misses = spin_misses_.load();
  c.spin_skips = spin_skips_.load();
  c.spin_briefs = spin_briefs_.load();
  c.cpu_pressure = cpu_pressure_.load();
  return c;
}

}  // namespace r2cc
