// Socket and network-namespace helpers. Every blocking call takes a deadline or
// an abort predicate: nothing here waits forever.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

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

// The ports a listener may take, first to last (R2CC_PORT_RANGE); {0, 0}: any port the kernel
// picks (ephemeral), which no firewall rule can name in advance.
using PortRange = std::pair<int, int>;

// Every port of a listener's range was in use (other ranks' listeners, or other programs).
// r2cc_serve/comm/errors.py turns it into a PortRangeError that says what to do.
class PortRangeError : public std::runtime_error {
 public:
  PortRangeError(const std::string& address, PortRange ports)
      : std::runtime_error("r2cc: no free port on " + address + " in " + std::to_string(ports.first) + "-" +
                           std::to_string(ports.second) + ": every one is in use"),
        address(address), ports(ports) {}
  std::string address;
  PortRange ports;
};

// Listening TCP socket (non-blocking) on ip and the first port of `ports` no other socket holds
// (any port with {0, 0}). Returns fd; *port gets the port. Throws PortRangeError when every
// port of the range is taken, std::runtime_error for any other failure.
int listen_on(const std::string& ip, PortRange ports, int* port);

// How an I/O helper ended. kStopped: should_stop() turned true; kBlocked: the socket took no
// more and the caller asked not to wait; kError: the socket failed (see IoCause).
enum class IoStatus : uint8_t { kOk, kStopped, kBlocked, kError };

// Why a socket failed, decided where it failed: from errno, or from recv() returning 0 (kEof).
// The detector reads it to tell a peer whose process is gone (its host refused, reset or
// closed the connection) from a path that is down; nobody parses the text for it.
enum class IoCause : uint8_t { kNone, kRefused, kReset, kEof, kTimeout, kUnreachable, kOther };
IoCause io_cause_of_errno(int err);

// The outcome of an I/O helper: a status, and for a failure its cause, errno and the text
// users read in last_error and error messages (e.g. "recv: Connection reset by peer").
struct IoResult {
  IoStatus status = IoStatus::kOk;
  IoCause cause = IoCause::kNone;
  int err = 0;         // errno of a failed call (0 for EOF and for failures of our own)
  std::string detail;  // kError only

  bool ok() const { return status == IoStatus::kOk; }
  // For messages only: "" when ok, "stopped", "blocked", or the failure's detail.
  std::string text() const;

  static IoResult stopped() { return {IoStatus::kStopped, IoCause::kNone, 0, {}}; }
  static IoResult blocked() { return {IoStatus::kBlocked, IoCause::kNone, 0, {}}; }
  static IoResult eof() { return {IoStatus::kError, IoCause::kEof, 0, "connection closed by peer"}; }
  // A system call failed: "<call>: <strerror>", the cause from errno.
  static IoResult sys_error(const std::string& call, int err);
  // A failure this side decided on (a corrupt frame, an abandoned chunk, a test injection).
  static IoResult failure(IoCause cause, std::string detail) {
    return {IoStatus::kError, cause, 0, std::move(detail)};
  }
};

// Non-blocking connect from local_ip to ip:port within timeout_ms. Returns fd, or -1 with
// *err saying why (its text goes to the rail's last_error, its cause to the detector).
int connect_to(const std::string& local_ip, const std::string& ip, int port, int timeout_ms, IoResult* err);

// Sets the data-socket options every rail uses (nodelay, non-blocking, user timeout, a fixed
// send buffer of kSendBufferBytes).
constexpr int kSendBufferBytes = 4 << 20;
void tune_socket(int fd);

// Reads/writes exactly n bytes on a non-blocking fd. Polls in slices of poll_ms and gives
// up when should_stop() turns true (kStopped) or on a socket error or EOF (kError).
IoResult read_full(int fd, void* buf, size_t n, int poll_ms, const std::function<bool()>& should_stop);
// `on_progress` (if given) runs after every send call that moved bytes.
IoResult write_full(int fd, const void* buf, size_t n, int poll_ms, const std::function<bool()>& should_stop,
                    const std::function<void()>& on_progress = nullptr);
// With `sent` given, *sent counts the bytes written (of a, then b); poll_ms 0 returns kBlocked
// at the first moment the socket takes no more, instead of waiting.
IoResult writev_full(int fd, const void* a, size_t na, const void* b, size_t nb, int poll_ms,
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
  uint32_t total_retrans = 0;  // segments retransmitted over the socket's life
  uint32_t data_segs_out = 0;  // segments with data sent (retransmissions included; no pure ACKs)
  uint32_t dsack_dups = 0;     // segments the peer reported receiving twice (D-SACK): needless retransmissions
  uint64_t bytes_acked = 0;    // our bytes the peer's kernel acknowledged over the socket's life
  uint32_t snd_mss = 0;        // the largest segment the socket sends (a full-size frame's payload)
};
PathInfo path_info(int fd);

// Bytes waiting in the socket's receive queue (0 on error).
int bytes_readable(int fd);

// Lets the calling thread run ahead of ordinary threads: SCHED_FIFO if allowed, else a
// lower nice value. Returns what it got ("fifo", "nice" or "none").
std::string raise_thread_priority();
// Free space in the socket's send buffer (0 on error).
int send_space(int fd, int size = 0);  // size: the socket's SO_SNDBUF if known (saves a call)
// Bytes written on the socket that the peer's kernel has not acknowledged yet (-1 on error).
int bytes_unacked(int fd);
int send_buffer_size(int fd);  // SO_SNDBUF: the limit on bytes queued in the socket
// Writes a small buffer without blocking: kOk when all of it went out, kBlocked when none did
// (buffer full; nothing written), kError on a socket error or a partial write (kOther).
IoResult send_small_nonblocking(int fd, const void* buf, size_t n);

std::string errno_str(int err);

}  // namespace r2cc
