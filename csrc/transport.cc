// Transport life cycle: construction (listening sockets), connect_all (starting every
// thread), the group's error (abort), socket-number bookkeeping, and close. The rest, by
// responsibility: handshake.cc (set-up and re-connects), rx_loop.cc (every socket's incoming
// bytes), conn_io.cc (each connection's writer), posting.cc (posting, waiting, acknowledgements), detector.cc (failure
// detection, stalls, heartbeats), failover.cc (re-sending a failed rail's chunks),
// operator_actions.cc (drain/failover/restore, stats).
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "net.h"
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
    case RailState::kHeld: return "held";
  }
  return "?";
}


TransportImpl::TransportImpl(int rank, int world, std::vector<std::string> rail_ips, std::string netns, std::string secret,
                             uint64_t group_hash, TransportOptions opt)
    : rank_(rank), world_(world), rail_ips_(std::move(rail_ips)), netns_(std::move(netns)),
      group_hash_(group_hash), opt_(opt), io_(&rail_provider_for(rail_ips_)) {
  if (world_ < 1 || rank_ < 0 || rank_ >= world_)
    throw std::invalid_argument("r2cc: rank " + std::to_string(rank) + " is outside world size " +
                                std::to_string(world));
  if (rail_ips_.empty()) throw std::invalid_argument("r2cc: at least one rail is needed");
  if (secret.size() < 16) throw std::invalid_argument("r2cc: the group secret must be at least 16 bytes");
  if (opt_.chunk_bytes == 0 || opt_.min_chunk_bytes == 0 || opt_.window_bytes == 0)
    throw std::invalid_argument("r2cc: R2CC_CHUNK_BYTES, R2CC_MIN_CHUNK_BYTES and R2CC_RAIL_WINDOW_BYTES must be "
                                "positive (got " + std::to_string(opt_.chunk_bytes) + ", " +
                                std::to_string(opt_.min_chunk_bytes) + ", " + std::to_string(opt_.window_bytes) + ")");
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
      c->damp = FlapDampening({opt_.flap_threshold, opt_.flap_half_life_s, opt_.hold_s, opt_.hold_max_s});
      c->loss = LossJudge({opt_.loss_hold_pct, opt_.loss_min_segments});
      c->quiet = QuietJudge({opt_.rail_timeout_ms, opt_.peer_silence_ms});
      peer->conns.push_back(std::move(c));
    }
    peers_.push_back(std::move(peer));
  }
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  rx_ep_ = epoll_create1(EPOLL_CLOEXEC);
  caller_ep_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  caller_bell_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  watchdog_timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
  if (epfd_ < 0 || rx_ep_ < 0 || caller_ep_ < 0 || wake_fd_ < 0 || caller_bell_ < 0 || watchdog_timer_fd_ < 0)
    throw std::runtime_error("r2cc: cannot create the receive epoll sets and the watchdog's timer: " +
                             errno_str(errno));
  // A fifteenth of the rail timeout, at most 4 ms, at most half a heartbeat period. At the
  // defaults a 2 ms tick detected idle-rail faults no sooner (28 link-down and blackhole faults
  // each way: 52-66 ms either way) and cost 37% more watchdog CPU.
  watchdog_tick_ns_ = int64_t(std::max(1, std::min({4, opt_.rail_timeout_ms / 15, opt_.heartbeat_ms / 2}))) * 1000000;
  auto add = [](int set, int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(set, EPOLL_CTL_ADD, fd, &ev);
  };
  add(rx_ep_, epfd_);
  add(rx_ep_, wake_fd_);
  add(caller_ep_, epfd_);
  add(caller_ep_, caller_bell_);
  ScopedNetns in_ns(netns_);
  try {
    for (int r = 0; r < R; ++r) {
      int port = 0;
      listen_fds_.push_back(io_->listen(rail_ips_[r], opt_.port_range, &port));
      ports_.push_back(port);
    }
  } catch (...) {
    // No destructor runs after a throwing constructor: give back the ports (and descriptors)
    // taken so far, or a retry in this process finds its own leftovers in the port range.
    for (int fd : listen_fds_) io_->close(fd);
    for (int fd : {epfd_, rx_ep_, caller_ep_, wake_fd_, caller_bell_, watchdog_timer_fd_}) ::close(fd);
    throw;
  }
}

TransportImpl::~TransportImpl() { close(); }

void TransportImpl::connect_all(const std::vector<std::vector<std::pair<std::string, int>>>& peer_addrs) {
  // Named, so that `top -H` and perf tell them apart (15 characters at most).
  auto named = [](std::string name, auto body) {
    return [name, body] {
      pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
      body();
    };
  };
  {
    // The threads start under mu_, where close() sets stopping_: it joins all of them or there
    // are none. Started after close(), none was joined and ~Transport ended the process
    // (std::terminate: a joinable std::thread destroyed).
    std::lock_guard<std::mutex> g(mu_);
    if (connect_started_) throw std::logic_error("r2cc: connect_all called twice");
    if (stopping_) throw_error_locked();
    connect_started_ = true;
    peer_addrs_ = peer_addrs;
    for (int r = 0; r < num_rails(); ++r)
      threads_.emplace_back(named("r2cc-accept" + std::to_string(r), [this, r] { accept_loop(r); }));
    threads_.emplace_back(named("r2cc-rx", [this] { rx_loop(); }));
    for (auto& p : peers_) {
      if (p->rank == rank_) continue;
      for (auto& c : p->conns) {
        Conn* cp = c.get();
        threads_.emplace_back(named("r2cc-tx" + std::to_string(cp->peer) + "." + std::to_string(cp->rail),
                                    [this, cp] { writer_loop(*cp); }));
      }
    }
    threads_.emplace_back(named("r2cc-connect", [this] { connector_loop(); }));
    threads_.emplace_back(named("r2cc-watchdog", [this] { watchdog_loop(); }));
  }

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
void TransportImpl::flush_before_close() {
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
    for (auto& p : peers_) p->wake_writers();
    done_cv_.wait_for(lk, std::chrono::milliseconds(2));
  }
  for (auto& p : peers_)
    for (auto& c : p->conns)
      if (is_connected(c->state)) c->ctrl.push_back(control_frame(FrameType::kGoodbye));
  for (auto& p : peers_) p->wake_writers();
  auto goodbyes_out = [&] {
    for (auto& p : peers_)
      for (auto& c : p->conns)
        if (is_connected(c->state) && (!c->ctrl.empty() || c->writing)) return false;
    return true;
  };
  const int64_t bye_deadline = now_ns() + 300000000LL;
  while (!goodbyes_out() && now_ns() < bye_deadline) done_cv_.wait_for(lk, std::chrono::milliseconds(1));
}

void TransportImpl::set_error_locked(ErrorKind kind, const std::string& reason) {
  if (!error_.empty()) return;
  error_ = reason;
  error_kind_ = kind;
  aborted_ = true;
  for (auto& p : peers_)
    for (auto& c : p->conns)
      if (is_connected(c->state)) c->ctrl_abort = reason;
  rx_drop_idle_claims_locked();
  for (auto& p : peers_) p->wake_writers();
  notify_done_locked();
}

void TransportImpl::abort(const std::string& reason, ErrorKind kind) {
  std::lock_guard<std::mutex> g(mu_);
  set_error_locked(kind, reason);
}

std::string TransportImpl::error() const {
  std::lock_guard<std::mutex> g(mu_);
  return error_;
}

ErrorKind TransportImpl::error_kind() const {
  std::lock_guard<std::mutex> g(mu_);
  return error_kind_;
}

char* TransportImpl::scratch(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  if (bytes > scratch_bytes_ || (scratch_bytes_ > kMaxKeptScratch && bytes <= kMaxKeptScratch)) {
    scratch_.reset();  // no zero-fill: every collective writes its scratch before reading it
    scratch_.reset(new char[bytes]);
    scratch_bytes_ = bytes;
  }
  return scratch_.get();
}

void TransportImpl::throw_error_locked() const { throw AbortedError(error_kind_, error_); }

void TransportImpl::use_fd_locked(Conn& c, int fd) { c.fd_users[fd]++; }

void TransportImpl::release_fd_locked(Conn& c, int fd) {
  // A socket is closed only when no thread can still be inside recv/send on it,
  // so its number cannot be reused under a stale reader.
  if (--c.fd_users[fd] == 0 && fd != c.fd) {
    io_->close(fd);
    c.fd_users.erase(fd);
  }
}

void TransportImpl::close() {
  if (!stopping_.load()) flush_before_close();
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_.exchange(true)) return;
    for (auto& p : peers_) {
      for (auto& c : p->conns)
        if (c->fd >= 0) io_->shutdown(c->fd);
      p->wake_writers();
    }
    if (error_.empty()) {
      error_ = "r2cc: the communicator was closed";
      error_kind_ = ErrorKind::kClosed;
    }
    notify_done_locked();
    dial_cv_.notify_all();
  }
  const uint64_t one = 1;
  for (int bell : {wake_fd_, caller_bell_})  // the receive thread and a driving caller return at once
    if (write(bell, &one, sizeof(one)) < 0) {}
  arm_watchdog_timer(now_ns());  // and the watchdog
  {
    std::lock_guard<std::mutex> g(mu_);
    state_cv_.notify_all();  // and a monitor's wait_state_change
  }
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
  {
    // A caller still driving (woken by the bell, it throws the closed error) may be inside a
    // stream: the streams go only once it has left.
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait_for(lk, std::chrono::seconds(2), [&] { return !caller_driving_; });
  }
  rx_streams_.clear();  // their sockets are closed below with the rest
  for (auto& p : peers_)
    for (auto& c : p->conns) {
      for (auto& [fd, users] : c->fd_users)
        if (fd != c->fd) io_->close(fd);
      c->fd_users.clear();
      if (c->fd >= 0) {
        io_->close(c->fd);
        c->fd = -1;
      }
    }
  for (int i = 0; i < 200 && handshakes_active_.load() > 0; ++i) usleep(10000);
  for (int fd : listen_fds_) io_->close(fd);
  listen_fds_.clear();
  for (int fd : {caller_ep_, rx_ep_, epfd_, wake_fd_, caller_bell_, watchdog_timer_fd_}) ::close(fd);
}

}  // namespace r2cc
