// Multi-rail point-to-point transport between the ranks of one group.
//
// Per pair of ranks there is one TCP connection per rail. A message is cut into
// chunks; rail writer threads take chunks from the peer's queue as their window
// allows (so striping follows each rail's real bandwidth). A chunk stays owned by
// the sender until the receiver acknowledges it; when a rail fails, its
// un-acknowledged chunks go back to the queue and the surviving rails re-send
// them. Receivers write each chunk at its offset, so a duplicate is harmless.
//
// Threads: per connection one writer (the posting thread also writes one-chunk messages
// itself); per transport one receive thread over an epoll set of every socket (rx_loop.cc;
// while a caller waits, the caller reads its own bytes instead), one accept thread per rail,
// one connector thread (re-connects failed rails) and one watchdog (failure detection from
// path evidence, stalled-peer tracking, heartbeats).
//
// Failure model: a rail fails only on evidence about the path (a socket error, or
// bytes this side sent that the peer's kernel has not acknowledged for rail_timeout_ms).
// A peer whose kernel keeps acknowledging while its process says nothing is a stalled
// peer (stopped, swapping, a long pause): nothing is failed or re-sent; it is reported,
// and only a collective waiting on it past op_timeout_s fails. With no path to a peer,
// nothing fails while no collective waits on it; one that waits gives up after
// all_down_grace_ms (RailsDown, or PeerGone when the peer's process is gone).
//
// This header is the transport's whole face: what callers (bindings, collectives, plans) may
// use. Behind it: TransportImpl (transport_impl.h: private methods and state by owning file and
// lock rule), its records (transport_internal.h), the pure policies it consults as value types
// (dampening.h, loss_judge.h, quiet_judge.h, progress.h) and the rail I/O seam (rail_io.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "call.h"
#include "errors.h"
#include "stats.h"
#include "transport_options.h"

namespace r2cc {

// Rail connection states. Only the transport moves them:
// kConnecting -> kUp <-> kDraining -> kDrained ; any connected state -> kDown
// (failure) -> kRecovering (probe connected, handshaking) -> kUp.
// kUp <-> kHeld: connected, carrying no new chunks while this side or the peer dampens a
// flapping rail (dampening.cc); like a drained rail it carries traffic only when nothing else can.
enum class RailState { kConnecting, kUp, kDraining, kDrained, kDown, kRecovering, kHeld };
const char* rail_state_name(RailState s);

struct OutMsg;
struct InMsg;

// Handle of one posted send or receive. wait() on it through the transport.
struct Op {
  std::shared_ptr<OutMsg> out;
  std::shared_ptr<InMsg> in;
  bool done_at_post = false;  // zero-length, or a small send copied at post time
};

class TransportImpl;

class Transport {
 public:
 public:
  // rail_ips: this rank's address on every rail (all in `netns` when not empty).
  Transport(int rank, int world, std::vector<std::string> rail_ips, std::string netns, std::string secret,
            uint64_t group_hash, TransportOptions opt);
  ~Transport();

  int rank() const;
  int world() const;
  int num_rails() const;
  const TransportOptions& options() const;

  // Ports this rank listens on, one per rail (published through the store).
  std::vector<int> listen_ports() const;

  // Starts connecting to every peer (peer_addrs[peer][rail] = {ip, port}) and
  // blocks until every rail is up or connect_timeout_s passes. Succeeds if every
  // peer has at least one rail up (the rest keep being probed); else throws.
  void connect_all(const std::vector<std::vector<std::pair<std::string, int>>>& peer_addrs);

  // Starts a call: every message posted until the next begin_call carries `d`, and the
  // receiver checks it against its own call (call.h). Collectives are numbered; send/recv
  // are not. Throws AbortedError(kCallMismatch) when a peer's message already here
  // belongs to a different call under this number. Never blocks.
  void begin_call(const CallDesc& d);
  // Ends a call whose result is in hand: a watchdog pass that is due runs here, on the caller,
  // before it goes back to its own work (a rank whose peers' bytes are always there when it
  // waits never spins, and its watchdog thread woke every tick and preempted some caller).
  void end_call();

  // Posting never blocks. `buf` must stay valid until wait() returns for the op.
  Op post_send(int peer, const void* buf, size_t len);
  Op post_recv(int peer, void* buf, size_t len);
  // Blocks (GIL must be released by the caller) until op completes. Throws the
  // group's error when the group was aborted; aborts the group (on every rank) when the
  // peer had no path for all_down_grace_ms while this op waited, or after op_timeout_s
  // (naming a stalled peer when that is why). Same as wait_some({op}).
  void wait(const Op& op);
  // Blocks (GIL released by the caller) until at least one op of `ops` has completed, then
  // returns the ascending indices of every op in `ops` that has (an op done at post counts
  // at once). Lets a caller progress out of order (csrc/sched/executor.cc). Errors as wait(),
  // with its time limits counted from this call: every listed op's peer is watched; when the
  // group's error is thrown, no transport thread is inside any listed op's buffer any more
  // (the caller may free them all). Throws std::invalid_argument for an empty list.
  std::vector<size_t> wait_some(const std::vector<Op>& ops);

  // Operator actions on rail `rail` of this rank (all its peer connections). Atomic under
  // the transport lock. Without `force`, drain and failover throw LastRailError (and change
  // nothing) when some peer would be left with no healthy primary rail.
  void drain_rail(int rail, bool force = true);    // no new chunks; in-flight ones finish; peers told
  void undrain_rail(int rail);
  void failover_rail(int rail, bool force = true); // fail now, re-send in-flight chunks, keep it out
  void restore_rail(int rail);  // end an operator failover or a flap hold: probe and re-admit
  // Test fault injector: rail `rail` to `peer` fails (as on a socket error) right after
  // its writer thread (or a caller refilling its window) has sent `chunks` more data chunks,
  // i.e. with a chunk surely in flight. Chunks sent by the posting thread do not count.
  void inject_failure(int peer, int rail, int64_t chunks);
  // Test fault injector: the calling thread's next inline chunk may go on rail `rail` to `peer`
  // without the room check, as when the kernel's count of buffer overhead outgrows the check: a
  // chunk larger than the socket takes fills it part-way, and the rail's writer must finish it.
  void inject_full_socket(int peer, int rail);

  // The books (books.cc): every unacknowledged chunk queued or in flight on the connected rail
  // that carries it, every rail's in-flight bytes those of its live chunks. One line per breach
  // (empty: sound). Takes the lock; never blocks otherwise.
  std::vector<std::string> audit_books() const;

  // Kills the group: every rank's next (or current) wait throws `reason`.
  void abort(const std::string& reason, ErrorKind kind = ErrorKind::kAborted);
  std::string error() const;
  ErrorKind error_kind() const;

  // A buffer the collectives reuse from call to call (bytes need not be zero): a fresh one per
  // call cost a page fault per 4 KiB, ~6% of a 64 MiB all_reduce's CPU at 4 hosts. Valid until
  // the next call; one collective at a time per transport (the communicator serializes them).
  // Above kMaxKeptScratch it is allocated for this call only (held until the next call).
  char* scratch(size_t bytes);
  static constexpr size_t kMaxKeptScratch = size_t(128) << 20;

  // Copies taken under the lock (stats.h lists the fields).
  std::vector<ConnStats> stats() const;
  std::vector<PeerStats> peer_stats() const;
  Counters counters() const;
  // What the status file's readers act on at once, as text: the group's error, each peer's
  // stall and goodbye, each rail's shown state, hold reason and last error. Unchanged text means
  // nothing of that changed, so the rail monitor skips its full sample (operator_actions.cc).
  std::string state_signature() const;
  // Blocks until the signature differs from `seen`, the file at watch_path (if not empty) was
  // modified at or after watch_since_ns (wall clock), interrupt_state_wait() is called while it
  // waits (one called before it began does not count), or timeout_ms passes; returns the
  // signature then. The watchdog's passes look every poll_ms (check_state_watches_locked), on
  // whichever thread runs them, and wake the waiter only when it has something to return: the
  // waiter looking for itself woke ten times a second at a raised priority and took a core
  // from the rank's caller each time (in Python it also took the GIL).
  std::string wait_state_change(const std::string& seen, int poll_ms, int timeout_ms, const std::string& watch_path,
                                int64_t watch_since_ns);
  void interrupt_state_wait();  // the monitor stops: its wait returns at once

  // Stops all threads and closes every socket. Idempotent.
  void close();

 private:
  std::unique_ptr<TransportImpl> impl_;
};

}  // namespace r2cc
