// Connection set-up: listening and accepting, dialing (first connects and re-connects of
// failed rails), the authenticated handshake, and installing a socket into its Conn.
//
// Contract: accept_loop and connector_loop run on their own threads until close(); a handshake
// never blocks longer than kHandshakeTimeoutMs and never holds the transport lock while it
// reads or writes. A failed handshake closes its socket and records why on the Conn
// (last_error); it never fails the group. install() is the only way a socket enters a Conn.
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "net.h"
#include "siphash.h"
#include "transport_internal.h"

namespace r2cc {

namespace {

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
// The connector with nothing to dial still looks once a second (a rail whose going down it
// was somehow not told of is then dialed that late, not never).
constexpr int64_t kDialerIdleNs = 1000000000;

}  // namespace

// ---- accepting side --------------------------------------------------------

void TransportImpl::accept_loop(int rail) {
  const int lfd = listen_fds_[rail];
  while (!stopping_) {
    // Asleep until a peer dials or close() rings wake_fd_ (it stays readable once rung); it
    // polled every 50 ms, 20 wake-ups a second per rail for nothing.
    pollfd p[2] = {{lfd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(p, 2, -1) <= 0 || !(p[0].revents & POLLIN)) continue;
    const int fd = io_->accept(lfd);
    if (fd < 0) continue;
    // A slow or hostile client must not hold up the accept loop.
    handshakes_active_++;
    std::thread([this, fd, rail] {
      handshake_incoming(fd, rail);
      handshakes_active_--;
    }).detach();
  }
}

void TransportImpl::handshake_incoming(int fd, int rail) {
  auto stop = [this] { return stopping_.load(); };
  const int64_t deadline = now_ns() + int64_t(kHandshakeTimeoutMs) * 1000000;
  auto timed_stop = [&] { return stop() || now_ns() > deadline; };
  HelloListener hl{kFrameMagic, kProtocolVersion, {}};
  random_nonce(hl.nonce);
  HelloConnector hc{};
  bool ok = io_->write_full(fd, &hl, sizeof(hl), nullptr, 0, 20, timed_stop).ok() &&
            io_->read_full(fd, &hc, sizeof(hc), 20, timed_stop).ok() && hc.magic == kFrameMagic &&
            hc.version == kProtocolVersion && hc.group_hash == group_hash_ && int(hc.rank) < world_ &&
            int(hc.rank) > rank_ && int(hc.rail) == rail &&
            hc.mac == handshake_mac(key_, 'C', hl.nonce, hc.rank, hc.rail);
  if (!ok) {
    std::lock_guard<std::mutex> g(mu_);
    counters_.rejected_handshakes++;
    io_->close(fd);
    return;
  }
  HelloReply rep{uint32_t(HelloStatus::kOk), uint32_t(rank_), handshake_mac(key_, 'L', hc.nonce, rank_, rail)};
  {
    std::lock_guard<std::mutex> g(mu_);
    if (rail_held_[rail] || stopping_ || peers_[hc.rank]->closed) rep.status = uint32_t(HelloStatus::kRailHeld);
  }
  if (!io_->write_full(fd, &rep, sizeof(rep), nullptr, 0, 20, timed_stop).ok() || rep.status != uint32_t(HelloStatus::kOk)) {
    io_->close(fd);
    return;
  }
  install(*peers_[hc.rank]->conns[rail], fd);
}

// ---- connecting side -------------------------------------------------------

void TransportImpl::connector_loop() {
  try {
    enter_netns_forever(netns_);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> g(mu_);
    set_error_locked(ErrorKind::kAborted, e.what());
    return;
  }
  const int64_t interval_ns = int64_t(opt_.probe_interval_ms) * 1000000;
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    std::vector<Conn*> todo;
    const int64_t now = now_ns();
    int64_t next_due = now + kDialerIdleNs;
    for (auto& p : peers_)
      for (auto& c : p->conns) {
        if (!c->we_connect || p->closed || is_connected(c->state) || rail_held_[c->rail]) continue;
        const int64_t due = c->state == RailState::kConnecting ? now : c->last_probe_ns + interval_ns;
        if (due <= now) todo.push_back(c.get());
        else next_due = std::min(next_due, due);
      }
    if (todo.empty()) {
      // Every rail this rank dials is connected (or waits for its next probe): sleep until a
      // probe is due or a rail goes down (dial_cv_), not in 10 ms steps. A thread waking 100
      // times a second took a core from a spinning caller on a busy host each time.
      dial_cv_.wait_for(lk, std::chrono::nanoseconds(next_due - now));
      continue;
    }
    lk.unlock();
    for (Conn* c : todo) {
      if (stopping_) break;
      try_connect(*c);
    }
    // Short sleep: the first connects of a group race the peers' listeners.
    struct timespec ts{0, 10 * 1000000};
    nanosleep(&ts, nullptr);
    lk.lock();
  }
}

bool TransportImpl::try_connect(Conn& c) {
  std::string local_ip = rail_ips_[c.rail];
  std::string ip;
  int port;
  {
    std::lock_guard<std::mutex> g(mu_);
    c.last_probe_ns = now_ns();
    ip = peer_addrs_[c.peer][c.rail].first;
    port = peer_addrs_[c.peer][c.rail].second;
  }
  IoResult err;
  int fd = io_->connect(local_ip, ip, port, std::max(opt_.probe_interval_ms, 100), &err);
  // A failed handshake is no evidence about the peer's process: its cause is kOther.
  auto note = [&](const std::string& e, IoCause cause = IoCause::kOther) {
    std::lock_guard<std::mutex> g(mu_);
    if (c.state == RailState::kRecovering) c.state = RailState::kDown;
    if (c.state != RailState::kConnecting) c.note_error(cause, "reconnect: " + e);
    else c.note_error(cause, e, /*stamp=*/false);  // first connects race the peers' listeners
  };
  if (fd < 0) {
    note(err.text(), err.cause);
    return false;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    if (c.state == RailState::kDown) c.state = RailState::kRecovering;
  }
  const int64_t deadline = now_ns() + int64_t(kHandshakeTimeoutMs) * 1000000;
  auto timed_stop = [&] { return stopping_.load() || now_ns() > deadline; };
  HelloListener hl{};
  if (!io_->read_full(fd, &hl, sizeof(hl), 20, timed_stop).ok() || hl.magic != kFrameMagic ||
      hl.version != kProtocolVersion) {
    io_->close(fd);
    note("handshake: no valid greeting from rank " + std::to_string(c.peer));
    return false;
  }
  HelloConnector hc{kFrameMagic, kProtocolVersion, group_hash_, uint32_t(rank_), uint32_t(c.rail), {}, 0};
  random_nonce(hc.nonce);
  hc.mac = handshake_mac(key_, 'C', hl.nonce, hc.rank, hc.rail);
  HelloReply rep{};
  if (!io_->write_full(fd, &hc, sizeof(hc), nullptr, 0, 20, timed_stop).ok() ||
      !io_->read_full(fd, &rep, sizeof(rep), 20, timed_stop).ok()) {
    io_->close(fd);
    note("handshake with rank " + std::to_string(c.peer) + " failed (wrong group secret or peer restarting)");
    return false;
  }
  if (rep.status != uint32_t(HelloStatus::kOk) || int(rep.rank) != c.peer ||
      rep.mac != handshake_mac(key_, 'L', hc.nonce, uint32_t(c.peer), uint32_t(c.rail))) {
    io_->close(fd);
    note(rep.status == uint32_t(HelloStatus::kRailHeld) ? "peer holds this rail out (operator failover)"
                                                         : "peer failed authentication");
    return false;
  }
  install(c, fd);
  return true;
}

void TransportImpl::install(Conn& c, int fd) {
  std::lock_guard<std::mutex> g(mu_);
  if (stopping_) {
    io_->close(fd);
    return;
  }
  if (is_connected(c.state)) {
    const std::string why = "replaced by a new connection from rank " + std::to_string(c.peer);
    fail_conn_locked(c, c.epoch.load(), IoCause::kOther, why);
  }
  if (c.fd >= 0 && c.fd_users[c.fd] == 0) {
    io_->close(c.fd);
    c.fd_users.erase(c.fd);
  }
  const bool first = c.state == RailState::kConnecting;
  c.fd = fd;
  c.sndbuf = io_->send_buffer_size(fd);
  c.epoch++;
  c.peer_drained = false;
  c.peer_holds = false;  // the peer says again at its install
  c.state = connected_state_locked(c);
  c.ctrl.clear();
  c.last_rx_ns = now_ns();
  c.last_tx_ns = 0;
  c.tx_resume_ns = now_ns();
  c.quiet.reset();
  c.probe_sent_ns = 0;  // a new path is probed with a full-size frame at the next pass (gray.cc)
  c.proven = first;     // a re-dialed one takes chunks once that probe is delivered
  if (!first) c.st.reconnects++;
  if (rail_drained_[c.rail]) c.ctrl.push_back(control_frame(FrameType::kDrain));
  if (c.damp.holding(now_ns())) c.ctrl.push_back(control_frame(FrameType::kHold));
  if (c.restore_pending) c.ctrl.push_back(control_frame(FrameType::kRelease, 0, kReleaseRestored));
  c.restore_pending = false;
  rx_start_locked(c, fd);
  Peer& p = *peers_[c.peer];
  p.no_link_since_ns = 0;
  p.wake_writers();
  notify_done_locked();
}

}  // namespace r2cc
