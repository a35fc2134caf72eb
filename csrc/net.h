// Socket and network-namespace helpers. Every blocking call takes a deadline or
// an abort predicate: nothing here waits forever.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace r2cc {

int64_t now_ns();

// Enters the network namespace at `path` (e.g. /var/run/netns/r2cc-h0) on the
// calling thread for the lifetime of the object; empty path = no-op.
// Throws std::runtime_error naming the namespace when it cannot.
class ScopedNetns {
 public:
  explicit ScopedNetns(const std::string& path);
  ~ScopedNetns();
  ScopedNetns(const ScopedNetns&) = delete;
  ScopedNetns& operator=(const ScopedNetns&) = delete;

 private:
  int saved_fd_ = -1;
};

// Moves the calling thread into `path` for good (threads that create sockets
// for a rank whose rails live in a lab host). Empty path = no-op.
void enter_netns_forever(const std::string& path);

// IPv4 address of interface `ifname` in the current namespace; "" if none.
std::string iface_ipv4(const std::string& ifname);

// Listening TCP socket bound to ip:0 (non-blocking). Returns fd; *port gets the port.
int listen_on(const std::string& ip, int* port);

// Non-blocking connect from local_ip to ip:port within timeout_ms. Returns fd or -1
// with *err describing why (for the rail's last_error).
int connect_to(const std::string& local_ip, const std::string& ip, int port, int timeout_ms,
               std::string* err);

// Sets the data-socket options every rail uses (nodelay, non-blocking, user timeout, a fixed
// send buffer of kSendBufferBytes).
constexpr int kSendBufferBytes = 4 << 20;
void tune_socket(int fd);

// Reads/writes exactly n bytes on a non-blocking fd. Polls in slices of
// poll_ms and gives up when should_stop() turns true or on socket error.
// Returns "" on success, otherwise a description of the failure.
std::string read_full(int fd, void* buf, size_t n, int poll_ms, const std::function<bool()>& should_stop);
// `on_progress` (if given) runs after every send call that moved bytes.
std::string write_full(int fd, const void* buf, size_t n, int poll_ms, const std::function<bool()>& should_stop,
                       const std::function<void()>& on_progress = nullptr);
// With `sent` given, *sent counts the bytes written (of a, then b); poll_ms 0 returns "blocked"
// at the first moment the socket takes no more, instead of waiting.
std::string writev_full(int fd, const void* a, size_t na, const void* b, size_t nb, int poll_ms,
                        const std::function<bool()>& should_stop, const std::function<void()>& on_progress = nullptr,
                        size_t* sent = nullptr);

// What the kernel knows of a connection's path (TCP_INFO): segments sent but not yet
// acknowledged by the peer's kernel, and how long ago the last ACK came. A stopped peer
// process still has a kernel that acknowledges; a dead link or a blackhole does not.
struct PathInfo {
  bool ok = false;  // false: the socket could not be queried
  uint32_t unacked = 0;
  uint32_t last_ack_recv_ms = 0;
  uint32_t retransmits = 0;
  uint32_t notsent_bytes = 0;  // queued, not yet sent (e.g. no route while our link is down)
  uint32_t snd_wnd = 0;        // the peer's advertised window (0: its process stopped reading)
  uint32_t rtt_us = 0, rttvar_us = 0;  // the kernel's smoothed round trip and its variation
};
PathInfo path_info(int fd);

// Bytes waiting in the socket's receive queue (0 on error).
int bytes_readable(int fd);

// Lets the calling thread run ahead of ordinary threads: SCHED_FIFO if allowed, else a
// lower nice value. Returns what it got ("fifo", "nice" or "none").
std::string raise_thread_priority();
// Free space in the socket's send buffer (0 on error).
int send_space(int fd, int size = 0);  // size: the socket's SO_SNDBUF if known (saves a call)
int send_buffer_size(int fd);  // SO_SNDBUF: the limit on bytes queued in the socket
// Writes a small buffer without blocking. Returns 1 if all of it went out, 0 if none
// did (buffer full; nothing written), -1 on a socket error or a partial write.
int send_small_nonblocking(int fd, const void* buf, size_t n);

std::string errno_str(int err);

}  // namespace r2cc
