// Transport life cycle: listening, handshakes, (re)connecting, failure handling,
// operator actions and stats. The byte-moving loops are in transport_io.cc, failure
// detection in detector.cc.
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>

#include "net.h"
#include "siphash.h"
#include "transport_internal.h"

namespace r2cc {

const char* rail_state_name(RailState s) {
  switch (s) {
    case RailState::kConnecting: return "connecting";
    case RailState::kUp: return "up";
    case RailState::kDraining: return "draining";
    case RailState::kDrained: return "drained";
    case RailState::kDown: return "down";
    case RailState::kRecovering: return "recovering";
  }
  return "?";
}

namespace {

double unix_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return double(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

void random_nonce(uint8_t out[16]) {
  std::random_device rd;
  for (int i = 0; i < 16; i += 4) {
    uint32_t v = rd();
    std::memcpy(out + i, &v, 4);
  }
}

uint64_t handshake_mac(const uint8_t key[16], char side, const uint8_t nonce[16], uint32_t rank, uint32_t rail) {
  uint8_t buf[1 + 16 + 4 + 4];
  buf[0] = uint8_t(side);
  std::memcpy(buf + 1, nonce, 16);
  std::memcpy(buf + 17, &rank, 4);
  std::memcpy(buf + 21, &rail, 4);
  return siphash24(key, buf, sizeof(buf));
}

constexpr int kHandshakeTimeoutMs = 1000;

}  // namespace

Transport::Transport(int rank, int world, std::vector<std::string> rail_ips, std::string netns, std::string secret,
                     uint64_t group_hash, TransportOptions opt)
    : rank_(rank), world_(world), rail_ips_(std::move(rail_ips)), netns_(std::move(netns)),
      group_hash_(group_hash), opt_(opt) {
  if (world_ < 1 || rank_ < 0 || rank_ >= world_)
    throw std::invalid_argument("r2cc: rank " + std::to_string(rank) + " is outside world size " +
                                std::to_string(world));
  if (rail_ips_.empty()) throw std::invalid_argument("r2cc: at least one rail is needed");
  if (secret.size() < 16) throw std::invalid_argument("r2cc: the group secret must be at least 16 bytes");
  std::memcpy(key_, secret.data(), 16);
  const int R = num_rails();
  rail_drained_.assign(R, false);
  rail_held_.assign(R, false);
  for (int p = 0; p < world_; ++p) {
    auto peer = std::make_unique<Peer>();
    peer->rank = p;
    for (int r = 0; r < R; ++r) {
      auto c = std::make_unique<Conn>();
      c->peer = p;
      c->rail = r;
      c->we_connect = rank_ > p;
      c->st.peer = p;
      c->st.rail = r;
      peer->conns.push_back(std::move(c));
    }
    peers_.push_back(std::move(peer));
  }
  ScopedNetns in_ns(netns_);
  for (int r = 0; r < R; ++r) {
    int port = 0;
    listen_fds_.push_back(listen_on(rail_ips_[r], &port));
    ports_.push_back(port);
  }
}

Transport::~Transport() { close(); }

void Transport::connect_all(const std::vector<std::vector<std::pair<std::string, int>>>& peer_addrs) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (connect_started_) throw std::logic_error("r2cc: connect_all called twice");
    connect_started_ = true;
    peer_addrs_ = peer_addrs;
  }
  for (int r = 0; r < num_rails(); ++r) threads_.emplace_back([this, r] { accept_loop(r); });
  for (auto& p : peers_) {
    if (p->rank == rank_) continue;
    for (auto& c : p->conns) {
      Conn* cp = c.get();
      threads_.emplace_back([this, cp] { reader_loop(*cp); });
      threads_.emplace_back([this, cp] { writer_loop(*cp); });
    }
  }
  threads_.emplace_back([this] { connector_loop(); });
  threads_.emplace_back([this] { watchdog_loop(); });

  const int64_t deadline = now_ns() + int64_t(opt_.connect_timeout_s * 1e9);
  std::unique_lock<std::mutex> lk(mu_);
  auto all_up = [&] {
    for (auto& p : peers_)
      if (p->rank != rank_)
        for (auto& c : p->conns)
          if (!is_connected(c->state)) return false;
    return true;
  };
  while (!all_up() && now_ns() < deadline && error_.empty())
    done_cv_.wait_for(lk, std::chrono::milliseconds(20));
  if (!error_.empty()) throw_error_locked();
  for (auto& p : peers_) {
    if (p->rank == rank_) continue;
    if (!peer_has_link_locked(*p)) {
      std::string why;
      for (auto& c : p->conns) why += " rail" + std::to_string(c->rail) + ": " + c->st.last_error + ";";
      throw std::runtime_error("r2cc: no rail to rank " + std::to_string(p->rank) + " came up within " +
                               std::to_string(opt_.connect_timeout_s) + " s (" + why +
                               " ) Check that every rank started and that the rail addresses are reachable.");
    }
  }
}

// ---- accepting side --------------------------------------------------------

void Transport::accept_loop(int rail) {
  const int lfd = listen_fds_[rail];
  while (!stopping_) {
    pollfd p{lfd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    tune_socket(fd);
    // A slow or hostile client must not hold up the accept loop.
    handshakes_active_++;
    std::thread([this, fd, rail] {
      handshake_incoming(fd, rail);
      handshakes_active_--;
    }).detach();
  }
}

void Transport::handshake_incoming(int fd, int rail) {
  auto stop = [this] { return stopping_.load(); };
  const int64_t deadline = now_ns() + int64_t(kHandshakeTimeoutMs) * 1000000;
  auto timed_stop = [&] { return stop() || now_ns() > deadline; };
  HelloListener hl{kFrameMagic, kProtocolVersion, {}};
  random_nonce(hl.nonce);
  HelloConnector hc{};
  bool ok = write_full(fd, &hl, sizeof(hl), 20, timed_stop).empty() &&
            read_full(fd, &hc, sizeof(hc), 20, timed_stop).empty() && hc.magic == kFrameMagic &&
            hc.version == kProtocolVersion && hc.group_hash == group_hash_ && int(hc.rank) < world_ &&
            int(hc.rank) > rank_ && int(hc.rail) == rail &&
            hc.mac == handshake_mac(key_, 'C', hl.nonce, hc.rank, hc.rail);
  if (!ok) {
    std::lock_guard<std::mutex> g(mu_);
    counters_.rejected_handshakes++;
    ::close(fd);
    return;
  }
  HelloReply rep{uint32_t(HelloStatus::kOk), uint32_t(rank_), handshake_mac(key_, 'L', hc.nonce, rank_, rail)};
  {
    std::lock_guard<std::mutex> g(mu_);
    if (rail_held_[rail] || stopping_ || peers_[hc.rank]->closed) rep.status = uint32_t(HelloStatus::kRailHeld);
  }
  if (!write_full(fd, &rep, sizeof(rep), 20, timed_stop).empty() || rep.status != uint32_t(HelloStatus::kOk)) {
    ::close(fd);
    return;
  }
  install(*peers_[hc.rank]->conns[rail], fd);
}

// ---- connecting side -------------------------------------------------------

void Transport::connector_loop() {
  try {
    enter_netns_forever(netns_);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> g(mu_);
    set_error_locked(ErrorKind::kAborted, e.what());
    return;
  }
  while (!stopping_) {
    std::vector<Conn*> todo;
    {
      std::lock_guard<std::mutex> g(mu_);
      const int64_t now = now_ns();
      for (auto& p : peers_)
        for (auto& c : p->conns)
          if (c->we_connect && !p->closed && !is_connected(c->state) && !rail_held_[c->rail] &&
              (c->state == RailState::kConnecting || now - c->last_probe_ns >= int64_t(opt_.probe_interval_ms) * 1000000))
            todo.push_back(c.get());
    }
    for (Conn* c : todo) {
      if (stopping_) break;
      try_connect(*c);
    }
    // Short sleep: the first connects of a group race the peers' listeners.
    struct timespec ts{0, 10 * 1000000};
    nanosleep(&ts, nullptr);
  }
}

bool Transport::try_connect(Conn& c) {
  std::string local_ip = rail_ips_[c.rail];
  std::string ip;
  int port;
  {
    std::lock_guard<std::mutex> g(mu_);
    c.last_probe_ns = now_ns();
    ip = peer_addrs_[c.peer][c.rail].first;
    port = peer_addrs_[c.peer][c.rail].second;
  }
  std::string err;
  int fd = connect_to(local_ip, ip, port, std::max(opt_.probe_interval_ms, 100), &err);
  auto note = [&](const std::string& e) {
    std::lock_guard<std::mutex> g(mu_);
    if (c.state == RailState::kRecovering) c.state = RailState::kDown;
    if (c.state != RailState::kConnecting) {
      c.st.last_error = "reconnect: " + e;
      c.st.last_error_time = unix_now();
    } else {
      c.st.last_error = e;
    }
  };
  if (fd < 0) {
    note(err);
    return false;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    if (c.state == RailState::kDown) c.state = RailState::kRecovering;
  }
  const int64_t deadline = now_ns() + int64_t(kHandshakeTimeoutMs) * 1000000;
  auto timed_stop = [&] { return stopping_.load() || now_ns() > deadline; };
  HelloListener hl{};
  if (!read_full(fd, &hl, sizeof(hl), 20, timed_stop).empty() || hl.magic != kFrameMagic ||
      hl.version != kProtocolVersion) {
    ::close(fd);
    note("handshake: no valid greeting from rank " + std::to_string(c.peer));
    return false;
  }
  HelloConnector hc{kFrameMagic, kProtocolVersion, group_hash_, uint32_t(rank_), uint32_t(c.rail), {}, 0};
  random_nonce(hc.nonce);
  hc.mac = handshake_mac(key_, 'C', hl.nonce, hc.rank, hc.rail);
  HelloReply rep{};
  if (!write_full(fd, &hc, sizeof(hc), 20, timed_stop).empty() ||
      !read_full(fd, &rep, sizeof(rep), 20, timed_stop).empty()) {
    ::close(fd);
    note("handshake with rank " + std::to_string(c.peer) + " failed (wrong group secret or peer restarting)");
    return false;
  }
  if (rep.status != uint32_t(HelloStatus::kOk) || int(rep.rank) != c.peer ||
      rep.mac != handshake_mac(key_, 'L', hc.nonce, uint32_t(c.peer), uint32_t(c.rail))) {
    ::close(fd);
    note(rep.status == uint32_t(HelloStatus::kRailHeld) ? "peer holds this rail out (operator failover)"
                                                         : "peer failed authentication");
    return false;
  }
  install(c, fd);
  return true;
}

void Transport::install(Conn& c, int fd) {
  std::lock_guard<std::mutex> g(mu_);
  if (stopping_) {
    ::close(fd);
    return;
  }
  if (is_connected(c.state)) fail_conn_locked(c, c.epoch.load(), "replaced by a new connection from rank " + std::to_string(c.peer));
  if (c.fd >= 0 && c.fd_users[c.fd] == 0) {
    ::close(c.fd);
    c.fd_users.erase(c.fd);
  }
  const bool first = c.state == RailState::kConnecting;
  c.fd = fd;
  c.epoch++;
  c.state = rail_drained_[c.rail] ? RailState::kDrained : RailState::kUp;
  c.peer_drained = false;
  c.ctrl.clear();
  c.last_rx_ns = now_ns();
  c.last_tx_ns = 0;
  c.tx_resume_ns = now_ns();
  c.path_dead = false;
  if (!first) c.st.reconnects++;
  if (rail_drained_[c.rail]) c.ctrl.push_back(FrameHeader{kFrameMagic, uint32_t(FrameType::kDrain), 0, 0, 0, 0, 0});
  Peer& p = *peers_[c.peer];
  p.no_link_since_ns = 0;
  p.cv.notify_all();
  done_cv_.notify_all();
}

// ---- failure ---------------------------------------------------------------

bool Transport::peer_has_link_locked(const Peer& p) const {
  for (auto& c : p.conns)
    if (is_connected(c->state)) return true;
  return false;
}

bool Transport::peer_has_path_locked(const Peer& p) const {
  for (auto& c : p.conns)
    if (is_connected(c->state) && !c->suspect) return true;
  return false;
}

void Transport::requeue_inflight_locked(Conn& c, const std::string& reason, int64_t now) {
  Peer& p = *peers_[c.peer];
  c.st.failovers++;
  counters_.failovers++;
  c.st.last_error = reason;
  c.st.last_error_time = unix_now();
  c.st.last_detect_s = double(now - c.last_rx_ns.load()) * 1e-9;
  // Un-acknowledged chunks go back to the front of the queue, in order, for the
  // surviving rails; the receiver ignores whichever copy arrives second.
  for (auto it = c.inflight.rbegin(); it != c.inflight.rend(); ++it) {
    auto m = p.out.find(it->first);
    if (m == p.out.end() || m->second->acked[it->second]) continue;
    OutMsg& msg = *m->second;
    // A hedged message whose other copy travels on another rail needs no re-send.
    if (msg.hedge_rail == c.rail) {
      msg.hedge_rail = -1;
      continue;
    }
    if (msg.hedge_rail >= 0 && msg.on_rail[it->second] == c.rail) {
      msg.on_rail[it->second] = msg.hedge_rail;
      msg.hedge_rail = -1;
      continue;
    }
    msg.on_rail[it->second] = -1;
    p.queue.push_front(Chunk{m->second, it->second});  // the shared_ptr, not the alias
    const size_t bytes = msg.chunk_len(it->second);
    c.st.chunks_resent++;
    c.st.bytes_resent += bytes;
    counters_.chunks_resent++;
    counters_.bytes_resent += bytes;
  }
  c.inflight.clear();
  if (c.busy_since_ns) c.busy_ns += now - c.busy_since_ns;
  c.busy_since_ns = 0;
  c.inflight_bytes = 0;
  for (auto& a : c.acks_carried) p.acks.push_back(a.second);  // they may be stuck in its buffers
  c.acks_carried.clear();
  p.cv.notify_all();
  done_cv_.notify_all();
}

void Transport::suspect_conn_locked(Conn& c, const std::string& reason) {
  if (c.suspect || !is_connected(c.state)) return;
  c.suspect = true;
  requeue_inflight_locked(c, reason, now_ns());
}

void Transport::fail_conn_locked(Conn& c, uint64_t epoch, const std::string& reason) {
  if (c.epoch.load() != epoch || !is_connected(c.state)) return;
  // Shut the socket down before re-queueing: after this no byte of a re-queued
  // chunk can still leave through the dead connection.
  ::shutdown(c.fd, SHUT_RDWR);
  Peer& p = *peers_[c.peer];
  c.state = RailState::kDown;
  c.epoch++;  // the reader/writer of the old socket stand down
  const int64_t now = now_ns();
  c.last_probe_ns = now;  // the first probe waits one interval: the peer needs to notice too
  if (c.suspect) {  // already counted and re-queued when it fell silent
    c.st.last_error = reason;
    c.st.last_error_time = unix_now();
  } else {
    requeue_inflight_locked(c, reason, now);
  }
  c.suspect = false;
  if (!peer_has_link_locked(p)) p.no_link_since_ns = now;
  p.cv.notify_all();
  done_cv_.notify_all();
}

void Transport::peer_closed_locked(Peer& p) {
  p.closed = true;
  p.no_link_since_ns = 0;
  for (auto& c : p.conns) {
    if (!is_connected(c->state)) continue;
    ::shutdown(c->fd, SHUT_RDWR);
    c->state = RailState::kDown;
    c->epoch++;
    c->st.last_error = "rank " + std::to_string(p.rank) + " closed its communicator";
    c->st.last_error_time = unix_now();
  }
  p.cv.notify_all();
  done_cv_.notify_all();
}

void Transport::flush_before_close() {
  // Let what peers still need leave first: our un-acked sends and the acks we owe.
  // Bounded: a dead peer must not hold up close().
  const int64_t deadline = now_ns() + 2000000000LL;
  std::unique_lock<std::mutex> lk(mu_);
  if (!connect_started_) return;
  auto pending = [&] {
    for (auto& p : peers_)
      if (!p->closed && peer_has_link_locked(*p) && (!p->out.empty() || !p->acks.empty())) return true;
    return false;
  };
  while (error_.empty() && pending() && now_ns() < deadline) {
    for (auto& p : peers_) p->cv.notify_all();
    done_cv_.wait_for(lk, std::chrono::milliseconds(2));
  }
  for (auto& p : peers_)
    for (auto& c : p->conns)
      if (is_connected(c->state)) c->ctrl.push_back(FrameHeader{kFrameMagic, uint32_t(FrameType::kGoodbye), 0, 0, 0, 0, 0});
  for (auto& p : peers_) p->cv.notify_all();
  auto goodbyes_out = [&] {
    for (auto& p : peers_)
      for (auto& c : p->conns)
        if (is_connected(c->state) && (!c->ctrl.empty() || c->writing)) return false;
    return true;
  };
  const int64_t bye_deadline = now_ns() + 300000000LL;
  while (!goodbyes_out() && now_ns() < bye_deadline) done_cv_.wait_for(lk, std::chrono::milliseconds(1));
}

void Transport::set_error_locked(ErrorKind kind, const std::string& reason) {
  if (!error_.empty()) return;
  error_ = reason;
  error_kind_ = kind;
  aborted_ = true;
  for (auto& p : peers_)
    for (auto& c : p->conns)
      if (is_connected(c->state)) c->ctrl_abort = reason;
  for (auto& p : peers_) p->cv.notify_all();
  done_cv_.notify_all();
}

void Transport::abort(const std::string& reason, ErrorKind kind) {
  std::lock_guard<std::mutex> g(mu_);
  set_error_locked(kind, reason);
}

std::string Transport::error() const {
  std::lock_guard<std::mutex> g(mu_);
  return error_;
}

ErrorKind Transport::error_kind() const {
  std::lock_guard<std::mutex> g(mu_);
  return error_kind_;
}

void Transport::throw_error_locked() const { throw AbortedError(error_kind_, error_); }

void Transport::use_fd_locked(Conn& c, int fd) { c.fd_users[fd]++; }

void Transport::release_fd_locked(Conn& c, int fd) {
  // A socket is closed only when no thread can still be inside recv/send on it,
  // so its number cannot be reused under a stale reader.
  if (--c.fd_users[fd] == 0 && fd != c.fd) {
    ::close(fd);
    c.fd_users.erase(fd);
  }
}

// ---- operator actions --------------------------------------------------------

void Transport::check_rail(int rail) const {
  if (rail < 0 || rail >= num_rails())
    throw std::out_of_range("r2cc: no rail " + std::to_string(rail) + "; this group has rails 0.." +
                            std::to_string(num_rails() - 1));
}

void Transport::check_last_rail_locked(int rail, const char* action) const {
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

void Transport::drain_rail(int rail, bool force) {
  check_rail(rail);
  std::lock_guard<std::mutex> g(mu_);
  if (!force) check_last_rail_locked(rail, "drain");
  rail_drained_[rail] = true;
  for (auto& p : peers_)
    for (auto& c : p->conns)
      if (c->rail == rail && is_connected(c->state)) {
        c->state = c->inflight.empty() ? RailState::kDrained : RailState::kDraining;
        c->ctrl.push_back(FrameHeader{kFrameMagic, uint32_t(FrameType::kDrain), 0, 0, 0, 0, 0});
        p->cv.notify_all();
      }
}

void Transport::undrain_rail(int rail) {
  check_rail(rail);
  std::lock_guard<std::mutex> g(mu_);
  rail_drained_[rail] = false;
  for (auto& p : peers_)
    for (auto& c : p->conns)
      if (c->rail == rail && is_connected(c->state)) {
        c->state = c->peer_drained ? RailState::kDrained : RailState::kUp;
        c->ctrl.push_back(FrameHeader{kFrameMagic, uint32_t(FrameType::kUndrain), 0, 0, 0, 0, 0});
        p->cv.notify_all();
      }
}

void Transport::failover_rail(int rail, bool force) {
  check_rail(rail);
  std::lock_guard<std::mutex> g(mu_);
  if (!force) check_last_rail_locked(rail, "fail over");
  rail_held_[rail] = true;
  for (auto& p : peers_)
    for (auto& c : p->conns)
      if (c->rail == rail) fail_conn_locked(*c, c->epoch.load(), "operator failover");
}

void Transport::inject_failure(int peer, int rail, int64_t chunks) {
  if (peer < 0 || peer >= world_ || peer == rank_ || rail < 0 || rail >= num_rails())
    throw std::out_of_range("r2cc: no connection to rank " + std::to_string(peer) + " on rail " + std::to_string(rail));
  std::lock_guard<std::mutex> g(mu_);
  peers_[peer]->conns[rail]->fail_after_chunks = chunks;
}

void Transport::restore_rail(int rail) {
  check_rail(rail);
  std::lock_guard<std::mutex> g(mu_);
  rail_held_[rail] = false;
  for (auto& p : peers_)
    for (auto& c : p->conns)
      if (c->rail == rail) c->last_probe_ns = 0;
}

// ---- stats -------------------------------------------------------------------

std::vector<ConnStats> Transport::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<ConnStats> out;
  for (auto& p : peers_) {
    if (p->rank == rank_) continue;
    for (auto& c : p->conns) {
      ConnStats s = c->st;
      // After an abort no rail carries the group's data, whatever its socket says.
      s.state = aborted_ ? "aborted" : c->suspect ? "down" : rail_state_name(c->state);
      s.held = rail_held_[c->rail];
      s.fallback = c->rail >= num_rails() - opt_.fallback_rails;
      s.inflight_bytes = c->inflight_bytes;
      out.push_back(s);
    }
  }
  return out;
}

std::vector<PeerStats> Transport::peer_stats() const {
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
    out.push_back(s);
  }
  return out;
}

Counters Transport::counters() const {
  std::lock_guard<std::mutex> g(mu_);
  return counters_;
}

void Transport::close() {
  if (!stopping_.load()) flush_before_close();
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_.exchange(true)) return;
    for (auto& p : peers_) {
      for (auto& c : p->conns)
        if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
      p->cv.notify_all();
    }
    if (error_.empty()) {
      error_ = "r2cc: the communicator was closed";
      error_kind_ = ErrorKind::kClosed;
    }
    done_cv_.notify_all();
  }
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
  for (auto& p : peers_)
    for (auto& c : p->conns) {
      for (auto& [fd, users] : c->fd_users)
        if (fd != c->fd) ::close(fd);
      c->fd_users.clear();
      if (c->fd >= 0) {
        ::close(c->fd);
        c->fd = -1;
      }
    }
  for (int i = 0; i < 200 && handshakes_active_.load() > 0; ++i) usleep(10000);
  for (int fd : listen_fds_) ::close(fd);
  listen_fds_.clear();
}

}  // namespace r2cc
