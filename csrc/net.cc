#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sched.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>

namespace r2cc {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::string errno_str(int err) { return std::string(strerror(err)); }

IoCause io_cause_of_errno(int err) {
  switch (err) {
    case ECONNREFUSED:
      return IoCause::kRefused;
    case ECONNRESET:
    case ENETRESET:
    case EPIPE:  // a send after the peer's host reset the connection (whose error was taken)
      return IoCause::kReset;
    case ETIMEDOUT:
      return IoCause::kTimeout;
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
      return IoCause::kUnreachable;
    default:
      return IoCause::kOther;
  }
}

IoResult IoResult::sys_error(const std::string& call, int err) {
  return {IoStatus::kError, io_cause_of_errno(err), err, call + ": " + errno_str(err)};
}

std::string IoResult::text() const {
  switch (status) {
    case IoStatus::kOk: return "";
    case IoStatus::kStopped: return "stopped";
    case IoStatus::kBlocked: return "blocked";
    case IoStatus::kError: return detail;
  }
  return detail;
}

ScopedNetns::ScopedNetns(const std::string& path) {
  if (path.empty()) return;
  saved_fd_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (saved_fd_ < 0) throw std::runtime_error("r2cc: cannot open /proc/thread-self/ns/net: " + errno_str(errno));
  enter_netns_forever(path);
}

ScopedNetns::~ScopedNetns() {
  if (saved_fd_ < 0) return;
  setns(saved_fd_, CLONE_NEWNET);
  close(saved_fd_);
}

void enter_netns_forever(const std::string& path) {
  if (path.empty()) return;
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw std::runtime_error("r2cc: network namespace " + path + " not found (" + errno_str(errno) +
                             "); is the lab up? (`r2cc lab status`)");
  int rc = setns(fd, CLONE_NEWNET);
  int err = errno;
  close(fd);
  if (rc != 0)
    throw std::runtime_error("r2cc: cannot enter network namespace " + path + ": " + errno_str(err) +
                             " (entering a namespace needs root / CAP_SYS_ADMIN)");
}

std::string iface_ipv4(const std::string& ifname) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET || ifname != it->ifa_name) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, buf, sizeof(buf));
    out = buf;
    break;
  }
  freeifaddrs(list);
  return out;
}

static sockaddr_in make_addr(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1)
    throw std::runtime_error("r2cc: '" + ip + "' is not an IPv4 address");
  return a;
}

static void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

int listen_on(const std::string& ip, PortRange ports, int* port) {
  const bool any = ports.first == 0 && ports.second == 0;
  if (!any && !(1 <= ports.first && ports.first <= ports.second && ports.second <= 65535))
    throw std::invalid_argument("r2cc: port range " + std::to_string(ports.first) + "-" +
                                std::to_string(ports.second) + " is not FIRST-LAST within 1-65535");
  for (int p = any ? 0 : ports.first; p <= (any ? 0 : ports.second); ++p) {
    sockaddr_in a = make_addr(ip, p);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("r2cc: socket(): " + errno_str(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // Two sockets with SO_REUSEADDR may both bind a port no one listens on yet; the second
    // listen() then fails with EADDRINUSE: taken too, so the next port.
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && listen(fd, 128) == 0) {
      socklen_t len = sizeof(a);
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
      *port = ntohs(a.sin_port);
      set_nonblocking(fd);
      return fd;
    }
    int err = errno;
    close(fd);
    if (err == EADDRINUSE && !any) continue;
    std::string where = any ? ip : ip + ":" + std::to_string(p);
    throw std::runtime_error("r2cc: cannot listen on " + where + ": " + errno_str(err) +
                             (err == EACCES ? " (ports below 1024 need root or CAP_NET_BIND_SERVICE: check "
                                              "R2CC_PORT_RANGE)"
                                            : " (is that address configured on this host / namespace?)"));
  }
  throw PortRangeError(ip, ports);
}

namespace {
// net.core.wmem_max: the cap on SO_SNDBUF for processes without CAP_NET_ADMIN (0 if unreadable).
int wmem_max() {
  static const int value = [] {
    int v = 0;
    if (FILE* f = fopen("/proc/sys/net/core/wmem_max", "r")) {
      if (fscanf(f, "%d", &v) != 1) v = 0;
      fclose(f);
    }
    return v;
  }();
  return value;
}
}  // namespace

void tune_socket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // A fixed send buffer. Left to autotuning, a rail that had carried only small messages kept
  // ~64 KiB: too little room for an inline chunk (posting.cc), so a 256 KiB all_reduce's chunks
  // waited for writer threads (2 hosts x 4 rails: 0.32-0.39 ms, 0.27 ms fixed). It adds no
  // queueing: a connection never holds more than its window (window_for_locked) of
  // un-acknowledged data. SO_SNDBUF is capped at net.core.wmem_max (4 MiB on the lab machines,
  // 208 KiB by the kernel's default): where that cap is lower and SO_SNDBUFFORCE is not allowed
  // (no CAP_NET_ADMIN), autotuning, which may grow to tcp_wmem's 4 MiB, is the better choice.
  int sndbuf = kSendBufferBytes;
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &sndbuf, sizeof(sndbuf)) != 0 && wmem_max() >= kSendBufferBytes)
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  // Unacknowledged data on a dead path errors out instead of retrying for ~15 min;
  // detection itself is the application heartbeat, this is only the backstop.
  unsigned int user_timeout_ms = 5000;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
  set_nonblocking(fd);
}

int connect_to(const std::string& local_ip, const std::string& ip, int port, int timeout_ms, IoResult* err) {
  sockaddr_in dst = make_addr(ip, port);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = IoResult::sys_error("socket()", errno);
    return -1;
  }
  if (!local_ip.empty()) {
    sockaddr_in src = make_addr(local_ip, 0);
    if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0) {
      const int e = errno;  // before building the text: an allocation may change errno
      *err = IoResult::sys_error("bind " + local_ip, e);
      close(fd);
      return -1;
    }
  }
  tune_socket(fd);
  const std::string where = "connect " + ip + ":" + std::to_string(port);
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst));
  if (rc != 0 && errno != EINPROGRESS) {
    *err = IoResult::sys_error(where, errno);
    close(fd);
    return -1;
  }
  if (rc != 0) {
    pollfd p{fd, POLLOUT, 0};
    int n = poll(&p, 1, timeout_ms);
    int soerr = 0;
    socklen_t len = sizeof(soerr);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (n <= 0 || soerr != 0) {
      *err = n <= 0 ? IoResult::failure(IoCause::kTimeout,
                                        where + ": timed out after " + std::to_string(timeout_ms) + " ms")
                    : IoResult::sys_error(where, soerr);
      close(fd);
      return -1;
    }
  }
  return fd;
}

IoResult read_full(int fd, void* buf, size_t n, int poll_ms, const std::function<bool()>& should_stop) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    if (should_stop && should_stop()) return IoResult::stopped();
    ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= size_t(r);
      continue;
    }
    if (r == 0) return IoResult::eof();
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IoResult::sys_error("recv", errno);
    if (should_stop && should_stop()) return IoResult::stopped();
    pollfd pf{fd, POLLIN, 0};
    poll(&pf, 1, poll_ms);
  }
  return {};
}

IoResult writev_full(int fd, const void* a, size_t na, const void* b, size_t nb, int poll_ms,
                     const std::function<bool()>& should_stop, const std::function<void()>& on_progress,
                     size_t* sent) {
  iovec iov[2] = {{const_cast<void*>(a), na}, {const_cast<void*>(b), nb}};
  int idx = 0;
  while (idx < 2) {
    if (iov[idx].iov_len == 0) {
      ++idx;
      continue;
    }
    if (should_stop && should_stop()) return IoResult::stopped();
    msghdr msg{};
    msg.msg_iov = &iov[idx];
    msg.msg_iovlen = size_t(2 - idx);
    ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w > 0 && on_progress) on_progress();
    if (w > 0 && sent) *sent += size_t(w);
    if (w >= 0) {
      size_t left = size_t(w);
      while (idx < 2 && left >= iov[idx].iov_len) {
        left -= iov[idx].iov_len;
        iov[idx].iov_len = 0;
        ++idx;
      }
      if (idx < 2) {
        iov[idx].iov_base = static_cast<char*>(iov[idx].iov_base) + left;
        iov[idx].iov_len -= left;
      }
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IoResult::sys_error("send", errno);
    if (should_stop && should_stop()) return IoResult::stopped();
    if (poll_ms == 0) return IoResult::blocked();
    pollfd pf{fd, POLLOUT, 0};
    poll(&pf, 1, poll_ms);
  }
  return {};
}

IoResult write_full(int fd, const void* buf, size_t n, int poll_ms, const std::function<bool()>& should_stop,
                    const std::function<void()>& on_progress) {
  return writev_full(fd, buf, n, nullptr, 0, poll_ms, should_stop, on_progress);
}

int send_buffer_size(int fd) {
  int size = 0;
  socklen_t len = sizeof(size);
  return getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, &len) == 0 ? size : 0;
}

int bytes_unacked(int fd) {
  int queued = 0;
  return ioctl(fd, SIOCOUTQ, &queued) == 0 ? queued : -1;
}

int send_space(int fd, int size) {
  const int queued = bytes_unacked(fd);
  if (queued < 0) return 0;
  return (size > 0 ? size : send_buffer_size(fd)) - queued;
}

IoResult send_small_nonblocking(int fd, const void* buf, size_t n) {
  ssize_t w = send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (w == ssize_t(n)) return {};
  if (w >= 0) return IoResult::failure(IoCause::kOther, "partial write");  // the stream is mid-frame
  if (errno == EAGAIN || errno == EWOULDBLOCK) return IoResult::blocked();
  return IoResult::sys_error("send", errno);
}

std::string raise_thread_priority() {
  sched_param sp{};
  sp.sched_priority = 1;
  if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) == 0) return "fifo";
  if (setpriority(PRIO_PROCESS, pid_t(syscall(SYS_gettid)), -10) == 0) return "nice";
  return "none";
}

int bytes_readable(int fd) {
  int n = 0;
  if (ioctl(fd, FIONREAD, &n) != 0) return 0;
  return n;
}

}  // namespace r2cc
