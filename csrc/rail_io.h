// The I/O of one rail: the seam between the transport and the network it runs on. TCP is the
// one provider today (tcp_rail.cc, over the socket helpers of net.cc and tcp_path.cc); an RDMA
// verbs provider would plug in here. The transport holds one provider, fixed at construction
// (TransportImpl::io_), and makes every call on a rail's link through it.
//
// A link is an int the provider hands out (TCP: the socket's descriptor; -1: none). The
// transport also waits on links with poll/epoll, so a provider must give handles that are file
// descriptors which turn readable when the link has bytes (a listener: when a peer dials); a
// verbs provider would hand out its completion channel's descriptor and keep the queue pair
// behind it. Links carry one ordered, reliable byte stream each way (the wire format, frames
// and handshake, is the transport's, protocol.h).
//
// What a provider must do:
//   - never block longer than it is told: calls with poll_ms/timeout_ms/stop give up when stop
//     turns true or the time passes; the *_nonblocking calls and the evidence calls never block;
//   - be callable from any thread, with no lock of its own held across calls: the transport
//     calls in from its writer threads, the receive thread, the watchdog, the connector and
//     callers, sometimes holding its own lock (mu_) for the non-blocking calls only;
//   - report failures as IoResult (net.h) with a cause (kRefused/kReset/kEof tell the detector
//     that the peer's host is up and its process is gone; kTimeout/kUnreachable that the path
//     is down);
//   - give health evidence in PathInfo's terms (what TCP_INFO says): bytes outstanding and how
//     long since the peer's side acknowledged, round-trip estimates, retransmissions.
// What the transport guarantees:
//   - at most one thread writes to a link at a time (Conn::writing), and at most one reads it
//     (the thread that took its stream's event);
//   - shutdown() may come from any thread while another is inside a read or write of the link:
//     it must make those return (kError or kStopped) without freeing the link;
//   - close() comes once per link, after no thread can still be inside a call on it.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "net.h"

namespace r2cc {

class RailProvider {
 public:
  virtual ~RailProvider() = default;
  virtual const char* name() const = 0;

  // ---- set-up ----
  // A listening link on ip, on the first free port of `ports` (net.h's listen_on says the rest).
  virtual int listen(const std::string& ip, PortRange ports, int* port) = 0;
  // A dialed peer's link, ready for data; -1 when none is pending (never blocks).
  virtual int accept(int listener) = 0;
  // Dials ip:port from local_ip within timeout_ms: a link ready for data, or -1 and *err.
  virtual int connect(const std::string& local_ip, const std::string& ip, int port, int timeout_ms,
                      IoResult* err) = 0;

  // ---- data ----
  // Exactly n bytes, polling every poll_ms; kStopped when should_stop() turns true.
  virtual IoResult read_full(int link, void* buf, size_t n, int poll_ms, const std::function<bool()>& should_stop) = 0;
  // a then b (nb may be 0). poll_ms 0: kBlocked as soon as the link takes no more. *sent (if
  // given) counts bytes written across calls; on_progress runs after every call that moved bytes.
  virtual IoResult write_full(int link, const void* a, size_t na, const void* b, size_t nb, int poll_ms,
                              const std::function<bool()>& should_stop,
                              const std::function<void()>& on_progress = nullptr, size_t* sent = nullptr) = 0;
  // What is ready, up to n bytes, never blocking: > 0 bytes read, 0 at the peer's end of stream,
  // -1 with errno (EAGAIN: nothing ready).
  virtual ssize_t read_some(int link, void* buf, size_t n) = 0;
  // A small buffer, all or nothing, never blocking: kOk, kBlocked (nothing written) or kError.
  virtual IoResult send_small_nonblocking(int link, const void* buf, size_t n) = 0;
  // a then b in one call, never blocking: bytes written, or -1 with errno (EAGAIN: none).
  virtual ssize_t send_nonblocking(int link, const void* a, size_t na, const void* b, size_t nb) = 0;

  // ---- health evidence (never block; a bad link reads as "unknown": ok false, 0 or -1) ----
  virtual PathInfo path_info(int link) = 0;
  virtual int bytes_unacked(int link) = 0;   // written, not yet acknowledged by the peer's side
  virtual int bytes_readable(int link) = 0;  // arrived, not yet read
  virtual int send_space(int link, int buffer_size = 0) = 0;  // free room to write without blocking
  virtual int send_buffer_size(int link) = 0;  // the limit on bytes queued in the link

  // ---- teardown ----
  virtual void shutdown(int link) = 0;  // both directions; the link stays valid until close()
  virtual void close(int link) = 0;

  // Why the link failed in the provider's own words ("" when errno says it all, as for TCP):
  // the rail's last_error shows it instead of the errno's text.
  virtual std::string failure(int link) { return {}; }
};

// The TCP provider (tcp_rail.cc): one socket per link. Stateless; one instance for the process.
RailProvider& tcp_rail_provider();

// The provider for a transport's rails: TCP alone, or TCP and verbs side by side when any rail
// is named "rdma:<ip>" (verbs/rail.cc; a build without verbs headers refuses such rails).
RailProvider& rail_provider_for(const std::vector<std::string>& rails);

}  // namespace r2cc
