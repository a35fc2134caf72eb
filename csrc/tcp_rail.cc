// The TCP rail provider (rail_io.h): each call is the socket helper of net.cc or tcp_path.cc that
// the transport called directly before the seam existed, so TCP behaves exactly as it did.
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "net.h"
#include "rail_io.h"

namespace r2cc {

namespace {

class TcpRail final : public RailProvider {
 public:
  const char* name() const override { return "tcp"; }

  int listen(const std::string& ip, PortRange ports, int* port) override { return listen_on(ip, ports, port); }
  int accept(int listener) override {
    const int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) tune_socket(fd);
    return fd;
  }
  int connect(const std::string& local_ip, const std::string& ip, int port, int timeout_ms, IoResult* err) override {
    return connect_to(local_ip, ip, port, timeout_ms, err);
  }

  IoResult read_full(int link, void* buf, size_t n, int poll_ms, const std::function<bool()>& should_stop) override {
    return r2cc::read_full(link, buf, n, poll_ms, should_stop);
  }
  IoResult write_full(int link, const void* a, size_t na, const void* b, size_t nb, int poll_ms,
                      const std::function<bool()>& should_stop, const std::function<void()>& on_progress,
                      size_t* sent) override {
    return writev_full(link, a, na, b, nb, poll_ms, should_stop, on_progress, sent);
  }
  ssize_t read_some(int link, void* buf, size_t n) override { return recv(link, buf, n, 0); }
  IoResult send_small_nonblocking(int link, const void* buf, size_t n) override {
    return r2cc::send_small_nonblocking(link, buf, n);
  }
  ssize_t send_nonblocking(int link, const void* a, size_t na, const void* b, size_t nb) override {
    iovec iov[2] = {{const_cast<void*>(a), na}, {const_cast<void*>(b), nb}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = nb ? 2 : 1;
    return sendmsg(link, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  PathInfo path_info(int link) override { return r2cc::path_info(link); }
  int bytes_unacked(int link) override { return r2cc::bytes_unacked(link); }
  int bytes_readable(int link) override { return r2cc::bytes_readable(link); }
  int send_space(int link, int buffer_size) override { return r2cc::send_space(link, buffer_size); }
  int send_buffer_size(int link) override { return r2cc::send_buffer_size(link); }

  void shutdown(int link) override { ::shutdown(link, SHUT_RDWR); }
  void close(int link) override { ::close(link); }
};

}  // namespace

RailProvider& tcp_rail_provider() {
  static TcpRail tcp;
  return tcp;
}

}  // namespace r2cc
