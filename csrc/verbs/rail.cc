// The verbs rail provider (rail_io.h) and the mixed provider a transport with RDMA rails uses.
//
// A verbs link is set up over a TCP connection between the two rail addresses (the port the
// transport listens on): each end sends its queue pair's number, first packet number and GID,
// both bring their queue pairs to ready-to-send, then trade one byte so that neither sends before
// the other can receive. The TCP connection stays open beside the queue pair: its end of stream
// says the peer's process is gone, which RDMA itself does not say (a killed peer's adapter just
// stops answering).
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>

#include "rail_io.h"
#include "verbs/link.h"

namespace r2cc {

namespace {

// Bounds the queue pair set-up once the TCP connection stands (the peer's process answers): it
// registers 8 MiB and moves a queue pair through three states at each end, milliseconds on real
// adapters and a second or more under emulation. It also bounds how long one dialing peer can
// hold a rail's accept loop.
constexpr int kSetupMs = 5000;
constexpr const char kRdmaPrefix[] = "rdma:";

bool is_rdma(const std::string& rail) { return rail.rfind(kRdmaPrefix, 0) == 0; }
std::string strip(const std::string& rail) { return rail.substr(sizeof kRdmaPrefix - 1); }

class VerbsRails final : public RailProvider {
 public:
  const char* name() const override { return "rdma"; }

  bool owns(int link) {
    std::shared_lock<std::shared_mutex> g(mu_);
    return links_.count(link) || listeners_.count(link);
  }

  int listen(const std::string& ip, PortRange ports, int* port) override {
    verbs_port_for_ip(ip);  // no RDMA port for this address: say so now, not at the first dial
    const int fd = listen_on(ip, ports, port);
    std::unique_lock<std::shared_mutex> g(mu_);
    listeners_[fd] = ip;
    return fd;
  }

  int accept(int listener) override {
    std::string ip;
    {
      std::shared_lock<std::shared_mutex> g(mu_);
      auto it = listeners_.find(listener);
      if (it == listeners_.end()) return -1;
      ip = it->second;
    }
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return -1;
    IoResult err;
    return set_up(ip, fd, now_ns() + int64_t(kSetupMs) * 1000000, &err);
  }

  int connect(const std::string& local_ip, const std::string& ip, int port, int timeout_ms, IoResult* err) override {
    const int fd = connect_to(local_ip, ip, port, timeout_ms, err);
    if (fd < 0) return -1;
    return set_up(local_ip, fd, now_ns() + int64_t(std::max(timeout_ms, kSetupMs)) * 1000000, err);
  }

  IoResult read_full(int link, void* buf, size_t n, int poll_ms, const std::function<bool()>& should_stop) override {
    auto l = find(link);
    if (!l) return IoResult::sys_error("rdma read", EBADF);
    char* p = static_cast<char*>(buf);
    while (n > 0) {
      const ssize_t k = l->read_some(p, n);
      if (k > 0) {
        p += k;
        n -= size_t(k);
        continue;
      }
      if (k == 0) return IoResult::eof();
      if (errno != EAGAIN) return failed(*l, "rdma read", errno);
      if (should_stop && should_stop()) return IoResult::stopped();
      pollfd pf{link, POLLIN, 0};
      poll(&pf, 1, poll_ms);
    }
    return {};
  }

  IoResult write_full(int link, const void* a, size_t na, const void* b, size_t nb, int poll_ms,
                      const std::function<bool()>& should_stop, const std::function<void()>& on_progress,
                      size_t* sent) override {
    auto l = find(link);
    if (!l) return IoResult::sys_error("rdma write", EBADF);
    const char* pa = static_cast<const char*>(a);
    const char* pb = static_cast<const char*>(b);
    while (na + nb > 0) {
      const ssize_t k = l->send_some(pa, na, pb, nb);
      if (k > 0) {
        const size_t ka = std::min(size_t(k), na);
        pa += ka;
        na -= ka;
        pb += size_t(k) - ka;
        nb -= size_t(k) - ka;
        if (sent) *sent += size_t(k);
        if (on_progress) on_progress();
        continue;
      }
      if (errno != EAGAIN) return failed(*l, "rdma write", errno);
      if (poll_ms == 0) return IoResult::blocked();
      if (should_stop && should_stop()) return IoResult::stopped();
      l->wait_send_room(poll_ms);
    }
    return {};
  }

  ssize_t read_some(int link, void* buf, size_t n) override {
    auto l = find(link);
    if (!l) {
      errno = EBADF;
      return -1;
    }
    return l->read_some(buf, n);
  }

  IoResult send_small_nonblocking(int link, const void* buf, size_t n) override {
    auto l = find(link);
    if (!l) return IoResult::sys_error("rdma send", EBADF);
    if (l->send_room() < n) return IoResult::blocked();  // one writer at a time: the room stays
    const ssize_t k = l->send_some(buf, n, nullptr, 0);
    if (k == ssize_t(n)) return {};
    return failed(*l, "rdma send", k < 0 ? errno : EIO);
  }

  ssize_t send_nonblocking(int link, const void* a, size_t na, const void* b, size_t nb) override {
    auto l = find(link);
    if (!l) {
      errno = EBADF;
      return -1;
    }
    return l->send_some(a, na, b, nb);
  }

  PathInfo path_info(int link) override {
    auto l = find(link);
    return l ? l->path_info() : PathInfo{};
  }
  int bytes_unacked(int link) override {
    auto l = find(link);
    return l ? l->unacked_bytes() : -1;
  }
  int bytes_readable(int link) override {
    auto l = find(link);
    return l ? l->readable_bytes() : 0;
  }
  int send_space(int link, int) override {
    auto l = find(link);
    return l ? int(l->send_room()) : 0;
  }
  int send_buffer_size(int link) override { return int(VerbsLink::kSlots * VerbsLink::kSlotBytes); }
  std::string failure(int link) override {
    auto l = find(link);
    return l ? l->failure() : std::string();
  }

  void shutdown(int link) override {
    if (auto l = find(link)) l->shutdown();
    else ::shutdown(link, SHUT_RDWR);  // a listener
  }
  void close(int link) override {
    std::shared_ptr<VerbsLink> l;
    {
      std::unique_lock<std::shared_mutex> g(mu_);
      if (listeners_.erase(link)) {
        ::close(link);
        return;
      }
      auto it = links_.find(link);
      if (it == links_.end()) return;
      l = std::move(it->second);
      links_.erase(it);
    }
    // l's last reference frees the queue pair and closes the handle, after the map forgot it
  }

 private:
  std::shared_ptr<VerbsLink> find(int link) {
    std::shared_lock<std::shared_mutex> g(mu_);
    auto it = links_.find(link);
    return it == links_.end() ? nullptr : it->second;
  }

  static IoResult failed(const VerbsLink& l, const std::string& call, int err) {
    IoResult r = IoResult::sys_error(call, err);
    const std::string why = l.failure();
    if (!why.empty()) r.detail = why;
    return r;
  }

  // Queue pair set-up over the connected TCP socket fd (which the link then owns).
  int set_up(const std::string& local_ip, int fd, int64_t deadline, IoResult* err) {
    auto stop = [deadline] { return now_ns() > deadline; };
    auto fail = [&](IoCause cause, const std::string& why) {
      if (err) *err = IoResult::failure(cause, "rdma set-up with the peer: " + why);
      return -1;
    };
    std::shared_ptr<VerbsLink> l;
    std::string why;
    try {
      const VerbsPort& port = verbs_port_for_ip(local_ip);
      l = VerbsLink::create(port, dup(fd), &why);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!l) {  // tell the other end why, or it sees a reset only
      const VerbsLink::Endpoint note = VerbsLink::failed_endpoint(why);
      r2cc::write_full(fd, &note, sizeof note, 10, stop);
      ::close(fd);
      return fail(IoCause::kOther, why);
    }
    ::close(fd);  // the link holds its own descriptor of the socket
    fd = l->boot_fd();
    const VerbsLink::Endpoint mine = l->local();
    VerbsLink::Endpoint theirs;
    IoResult r = r2cc::write_full(fd, &mine, sizeof mine, 10, stop);
    if (r.ok()) r = r2cc::read_full(fd, &theirs, sizeof theirs, 10, stop);
    if (!r.ok()) return fail(r.status == IoStatus::kStopped ? IoCause::kTimeout : r.cause, r.text());
    if (VerbsLink::is_failure(theirs)) {
      theirs.note[sizeof theirs.note - 1] = 0;
      return fail(IoCause::kOther, std::string("the peer's end failed: ") + theirs.note);
    }
    // Second round: each end says it is ready to receive, or why it is not.
    const bool ready = l->connect(theirs, &why);
    const VerbsLink::Endpoint status = ready ? mine : VerbsLink::failed_endpoint(why);
    r = r2cc::write_full(fd, &status, sizeof status, 10, stop);
    if (!ready) return fail(IoCause::kOther, why);
    if (r.ok()) r = r2cc::read_full(fd, &theirs, sizeof theirs, 10, stop);
    if (!r.ok()) return fail(r.status == IoStatus::kStopped ? IoCause::kTimeout : r.cause, r.text());
    if (VerbsLink::is_failure(theirs)) {
      theirs.note[sizeof theirs.note - 1] = 0;
      return fail(IoCause::kOther, std::string("the peer's end failed: ") + theirs.note);
    }
    std::unique_lock<std::shared_mutex> g(mu_);
    links_[l->handle()] = l;
    return l->handle();
  }

  std::shared_mutex mu_;
  std::map<int, std::shared_ptr<VerbsLink>> links_;  // by handle
  std::map<int, std::string> listeners_;              // listening socket -> rail address
};

// Rails named "rdma:<ip>" go to verbs, the rest to TCP; every other call follows its link.
class MixedRails final : public RailProvider {
 public:
  MixedRails(RailProvider& tcp, VerbsRails& verbs) : tcp_(tcp), verbs_(verbs) {}
  const char* name() const override { return "tcp+rdma"; }

  int listen(const std::string& ip, PortRange ports, int* port) override {
    return is_rdma(ip) ? verbs_.listen(strip(ip), ports, port) : tcp_.listen(ip, ports, port);
  }
  int accept(int listener) override { return of(listener).accept(listener); }
  int connect(const std::string& local_ip, const std::string& ip, int port, int timeout_ms, IoResult* err) override {
    return is_rdma(local_ip) ? verbs_.connect(strip(local_ip), ip, port, timeout_ms, err)
                             : tcp_.connect(local_ip, ip, port, timeout_ms, err);
  }
  IoResult read_full(int link, void* buf, size_t n, int poll_ms, const std::function<bool()>& should_stop) override {
    return of(link).read_full(link, buf, n, poll_ms, should_stop);
  }
  IoResult write_full(int link, const void* a, size_t na, const void* b, size_t nb, int poll_ms,
                      const std::function<bool()>& should_stop, const std::function<void()>& on_progress,
                      size_t* sent) override {
    return of(link).write_full(link, a, na, b, nb, poll_ms, should_stop, on_progress, sent);
  }
  ssize_t read_some(int link, void* buf, size_t n) override { return of(link).read_some(link, buf, n); }
  IoResult send_small_nonblocking(int link, const void* buf, size_t n) override {
    return of(link).send_small_nonblocking(link, buf, n);
  }
  ssize_t send_nonblocking(int link, const void* a, size_t na, const void* b, size_t nb) override {
    return of(link).send_nonblocking(link, a, na, b, nb);
  }
  PathInfo path_info(int link) override { return of(link).path_info(link); }
  int bytes_unacked(int link) override { return of(link).bytes_unacked(link); }
  int bytes_readable(int link) override { return of(link).bytes_readable(link); }
  int send_space(int link, int size) override { return of(link).send_space(link, size); }
  int send_buffer_size(int link) override { return of(link).send_buffer_size(link); }
  void shutdown(int link) override { of(link).shutdown(link); }
  void close(int link) override { of(link).close(link); }
  std::string failure(int link) override { return of(link).failure(link); }

 private:
  RailProvider& of(int link) { return verbs_.owns(link) ? static_cast<RailProvider&>(verbs_) : tcp_; }
  RailProvider& tcp_;
  VerbsRails& verbs_;
};

}  // namespace

RailProvider& rail_provider_for(const std::vector<std::string>& rails) {
  for (const auto& r : rails)
    if (is_rdma(r)) {
      static VerbsRails verbs;
      static MixedRails mixed(tcp_rail_provider(), verbs);
      return mixed;
    }
  return tcp_rail_provider();
}

}  // namespace r2cc
