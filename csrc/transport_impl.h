// The transport's machinery behind its face (transport.h, whose comments say what each public
// call does; they are the same calls here). Private to csrc/transport*.cc and the files named
// below: nothing outside the transport includes this.
//
// Private methods and state are grouped by the .cc file that owns them; each group's comment
// names its lock rule. The rules: "under mu_" (the caller holds mu_; such a method never
// blocks), "lock free" (no mu_; atomics or thread-owned data only), "thread body" (runs until
// close()), "watchdog pass" (under mu_, from a watchdog pass: the watchdog thread or a caller
// running a due pass).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "call.h"
#include "errors.h"
#include "net.h"
#include "protocol.h"
#include "rail_io.h"
#include "stats.h"
#include "transport.h"

namespace r2cc {

class TransportImpl {
 public:
  // The public calls: transport.h says what each does.
  TransportImpl(int rank, int world, std::vector<std::string> rail_ips, std::string netns, std::string secret,
                uint64_t group_hash, TransportOptions opt);
  ~TransportImpl();

  int rank() const { return rank_; }
  int world() const { return world_; }
  int num_rails() const { return int(rail_ips_.size()); }
  const TransportOptions& options() const { return opt_; }

  std::vector<int> listen_ports() const { return ports_; }

  void connect_all(const std::vector<std::vector<std::pair<std::string, int>>>& peer_addrs);

  void begin_call(const CallDesc& d);
  void end_call();

  Op post_send(int peer, const void* buf, size_t len);
  Op post_recv(int peer, void* buf, size_t len);
  void wait(const Op& op);
  std::vector<size_t> wait_some(const std::vector<Op>& ops);

  void drain_rail(int rail, bool force = true);    // no new chunks; in-flight ones finish; peers told
  void undrain_rail(int rail);
  void failover_rail(int rail, bool force = true); // fail now, re-send in-flight chunks, keep it out
  void restore_rail(int rail);  // end an operator failover or a flap hold: probe and re-admit
  void inject_failure(int peer, int rail, int64_t chunks);
  void inject_full_socket(int peer, int rail);

  std::vector<std::string> audit_books() const;

  void abort(const std::string& reason, ErrorKind kind = ErrorKind::kAborted);
  std::string error() const;
  ErrorKind error_kind() const;

  char* scratch(size_t bytes);
  static constexpr size_t kMaxKeptScratch = Transport::kMaxKeptScratch;

  std::vector<ConnStats> stats() const;
  std::vector<PeerStats> peer_stats() const;
  Counters counters() const;
  std::string state_signature() const;
  std::string wait_state_change(const std::string& seen, int poll_ms, int timeout_ms, const std::string& watch_path,
                                int64_t watch_since_ns);
  void interrupt_state_wait();  // the monitor stops: its wait returns at once

  void close();

 private:
  struct Conn;
  struct Peer;
  struct RxStream;
  struct AckItem {
    uint64_t seq;
    uint64_t idx;
    bool all;
  };
  struct Chunk {
    std::shared_ptr<OutMsg> msg;
    uint32_t idx;
  };

  // Private methods by the file that owns them. Unless a name or comment says otherwise, a
  // *_locked method needs mu_ held and never blocks; a *_loop method is a thread body that
  // returns only at close(); anything else takes mu_ itself when it needs it.

  // transport.cc [under mu_, but flush_before_close, which blocks lock free]: the group's error (first one
  // wins; from then on every wait throws it and no thread touches a caller's buffer) and socket-number
  // book-keeping (a socket is closed only once no thread can still be inside recv/send on it).
  void flush_before_close();  // blocks up to ~2.3 s for our sends, owed acks and goodbyes
  void set_error_locked(ErrorKind kind, const std::string& reason);
  void throw_error_locked() const;
  void use_fd_locked(Conn& c, int fd);
  void release_fd_locked(Conn& c, int fd);

  // handshake.cc [thread bodies and blocking handshakes, lock free; install takes mu_]: set-up and
  // re-connects. A failed handshake closes its socket and notes why on the Conn; it never fails the group.
  // install() is the only way a socket enters a Conn.
  void accept_loop(int rail);
  void handshake_incoming(int fd, int rail);  // blocks up to the handshake timeout, lock free
  void connector_loop();
  bool try_connect(Conn& c);  // blocks (dial + handshake), lock free; true when installed
  void install(Conn& c, int fd);

  // failover.cc [under mu_, never blocks]: acting on a failed or quiet rail: its un-acked chunks go back to
  // the queue. `cause` is kept beside the reason's text on the Conn (Conn::note_error): the detector reads
  // it.
  void fail_conn_locked(Conn& c, uint64_t epoch, IoCause cause, const std::string& reason);  // no-op if epoch moved on
  // Why a rail is set aside (Conn::suspect in transport_internal.h says what clears each).
  enum class SuspectWhy { kSilent, kMute, kStuck, kSlow };
  // Sets c aside (its chunks re-queued, no new ones). Only a quiet rail's suspicion counts for
  // flap dampening at once; a gray one counts if it fails (gray.cc).
  void suspect_conn_locked(Conn& c, IoCause cause, const std::string& reason, SuspectWhy why = SuspectWhy::kSilent);
  void drop_handoff_locked(Conn& c);  // the socket is gone: a chunk handed to its writer is let go
  // count_failure: flap dampening counts this one (not for a gray suspicion: see gray.cc).
  void requeue_inflight_locked(Conn& c, IoCause cause, const std::string& reason, int64_t now,
                               bool count_failure = true);
  void peer_closed_locked(Peer& p);
  bool peer_has_link_locked(const Peer& p) const;
  bool peer_has_path_locked(const Peer& p) const;

  // detector.cc [watchdog pass: under mu_, from the watchdog thread or a caller running a due pass;
  // watchdog_loop and run_due_pass_on_caller take mu_, arm_watchdog_timer is lock free; check_wait_locked
  // runs on a waiting caller]: failure detection from path evidence, stalled peers, heartbeats, bandwidth,
  // and the verdicts of a waiting collective (check_wait_locked sets the group's error).
  void watchdog_loop();
  // One pass: heartbeats, path evidence, holds, loss and bandwidth samples, stale hedges, the
  // host's CPU pressure. Due every watchdog_tick_ns_. The watchdog thread runs it, or a caller
  // that spins anyway or has just finished a call (run_due_pass_on_caller): on a host whose
  // cores all spin, the watchdog's real-time wake-up preempted a caller ~70 times per 1000 small
  // all_reduces, and in traces four in five of those calls took over 0.2 ms (the median is
  // under 0.1).
  void watchdog_pass_locked(std::unique_lock<std::mutex>& lk, int64_t now);
  void run_due_pass_on_caller(int64_t now);
  bool watchdog_pass_due(int64_t now) const;
  void arm_watchdog_timer(int64_t at_ns);  // absolute, CLOCK_MONOTONIC (now_ns's clock)
  void check_peer_rails_locked(Peer& p, int64_t now, int64_t stall_end_ns);
  void track_stall_locked(Peer& p, int64_t now, bool silent_alive, int64_t least_silence);
  void send_heartbeat_locked(Conn& c, Peer& p, int64_t now);
  void update_bandwidth_locked(Conn& c, int64_t now);
  void check_wait_locked(int peer, bool sending, int64_t wait_start_ns, int64_t deadline_ns);
  std::string no_path_error_locked(const Peer& p, ErrorKind* kind) const;

  // books.cc [under mu_]: the books' audit (audit_books() takes mu_ for it).
  std::vector<std::string> audit_books_locked() const;

  // gray.cc [watchdog pass, never blocks]: rails on which the peer still speaks while data does not move
  // (see its header). judge_progress_locked: our bytes stuck or slow on c (new verdicts only while we hear
  // the peer on it: a quiet rail is detector.cc's); clears or fails c's own earlier verdict.
  void judge_progress_locked(Peer& p, Conn& c, int64_t now, int64_t stall_end_ns, bool hears);
  // c silent for its quiet time, its path alive: mute when another rail of p spoke just now.
  void judge_mute_locked(Peer& p, Conn& c, int64_t now, int64_t silent_ns, int64_t quiet_ns, int64_t freshest_rx_ns);
  void send_probe_locked(Conn& c, const Peer& p, int64_t now);  // a full-size frame on an idle rail, when due
  double usual_rate_locked(const Peer& p) const;  // the fastest measured rate of p's rails

  // dampening.cc [under mu_, never blocks; the arithmetic is FlapDampening's, dampening.h]: flap dampening.
  // A rail's failures (a failover of its chunks, not an operator's) raise a decaying penalty; at the
  // threshold the rail is held: kept connected and probed by its heartbeats, but given no new chunks, until
  // the hold ends (watchdog) or restore_rail.
  void note_rail_failure_locked(Conn& c, const std::string& reason, int64_t now);
  void start_hold_locked(Conn& c, int64_t now, const std::string& reason);
  void end_hold_locked(Conn& c, const char* why);
  void check_holds_locked(Peer& p, int64_t now);  // watchdog: ends holds whose time is up
  void on_peer_hold_locked(Conn& c, bool held, bool restored);  // the peer's kHold / kRelease frame
  void forgive_locked(Conn& c, const char* why);  // no penalty, no hold (this side)
  void restore_conn_locked(Conn& c);  // restore_rail: no hold, no penalty, at both ends
  // The state a connected rail settles in: drained (by either side) before held before up.
  RailState connected_state_locked(const Conn& c) const;
  // An operator drained this rail, at this end or the peer's.
  bool drained_locked(const Conn& c) const;

  // operator_actions.cc [under mu_; the public calls take it]: each action atomic under mu_; a refused one
  // changes nothing. Also the stats and the state signature (copies under mu_).
  void check_rail(int rail) const;  // throws out_of_range
  void check_conn(int peer, int rail) const;  // throws out_of_range
  void check_last_rail_locked(int rail, const char* action) const;  // throws LastRailError
  std::vector<std::pair<Peer*, Conn*>> conns_on_rail_locked(int rail) const;  // one per peer
  void set_rail_drained_locked(int rail, bool drained);
  std::string state_signature_locked() const;
  // A wait_state_change under way, looked at by the watchdog's passes.
  struct StateWatch {
    const std::string* seen;
    const std::string* path;  // "": none
    int64_t since_ns;         // wall clock
    int64_t every_ns;
    int64_t next_ns;
    bool fired = false;
  };
  void check_state_watches_locked(int64_t now);
  std::string shown_state_locked(const Conn& c) const;  // the state rail_stats() reports
  std::string hold_reason_locked(const Conn& c, int64_t now) const;

  // posting.cc [caller threads; *_locked under mu_; wait_ops and try_send_inline release it while they
  // sleep or write]: the caller's side. Posting never blocks; wait_ops blocks with mu_ released while
  // asleep and always ends (done, the group's error, or a detector verdict).
  void check_peer(int peer) const;  // throws invalid_argument
  void check_call_locked(Peer& p, const InMsg& m);  // a mismatch aborts the group
  // Writes one chunk from the calling thread when a rail is idle (unlocks lk while writing; never
  // waits on the socket: what it cannot take now the rail's writer finishes, Conn::handoff);
  // false when no rail could take it now. kHedge: a second copy, on another rail; kIfRoom: only
  // on a rail whose socket buffer has room for the whole chunk (the write does not block);
  // kRefill: as kIfRoom, on rail `only`, any number of chunks per message.
  enum class InlineSend { kAny, kHedge, kIfRoom, kRefill };
  bool try_send_inline(Peer& p, const Chunk& chunk, std::unique_lock<std::mutex>& lk, InlineSend mode,
                       std::vector<bool>* rails_used = nullptr,  // kIfRoom: rails this message took
                       Conn* only = nullptr);
  // Hedge copies (a small message's second copy, on another rail) are insurance for a message
  // lost on a rail that died silently, so they go out only while the message is unacknowledged
  // and late: from a spinning caller whose peer said nothing for kHedgeAfterUs, else from the
  // watchdog kHedgeStaleNs after posting. Sent with every message they cost a 4 KiB all_reduce
  // a second write and a second read (lab: p50 ~17 us without, 22-50 us with). A copy whose
  // message was acknowledged, or whose chunk left its rail, is dropped unsent. Sends those
  // posted before posted_before_ns and says how many it wrote. Unlocks lk while writing, never
  // blocks.
  size_t send_due_hedges_locked(std::unique_lock<std::mutex>& lk, int64_t posted_before_ns);
  static constexpr int kHedgeAfterUs = 50;
  static constexpr int64_t kHedgeStaleNs = 1000000;
  // The driving caller read acks that freed window on rails of p: it writes their next chunks
  // itself where the socket has room, and wakes the writer of a rail where it had none.
  void refill_freed_rails_locked(Peer& p, std::unique_lock<std::mutex>& lk);
  // wait() and wait_some(): returns once any of ops[0..n) is done (their indices into *done if given).
  void wait_ops(const Op* ops, size_t n, std::vector<size_t>* done);
  void spin_until_any_done(const Op* ops, size_t n, int64_t budget_ns) const;  // lock free
  bool any_op_done(const Op* ops, size_t n) const;  // lock free (atomics only)
  void on_ack_locked(Peer& p, uint64_t seq, uint64_t idx, bool all);
  void enqueue_ack_locked(Peer& p, uint64_t seq, uint64_t idx, bool all, bool urgent);
  void forget_inflight_locked(Peer& p, int rail, uint64_t seq, uint32_t idx, size_t bytes, int64_t now);
  void finish_in_locked(Peer& p, InMsg& m);
  void release_reader_locked(Peer& p, InMsg& m);
  void finish_chunk_write_locked(const Chunk& chunk);

  // rx_loop.cc [the receive thread or the driving caller; *_locked under mu_]: the receive side of every socket: one epoll set, one-shot per
  // stream (the thread that took a stream's event owns it until it re-arms). Handlers never block and never
  // hold mu_ inside recv(); an I/O error fails the rail, never the group.
  void rx_loop();
  // One stream's event: take it (rx_take), read and parse what is ready (rx_read, lock free),
  // then fail the rail on an error, re-arm or retire the stream and see to its acks.
  void rx_handle(RxStream& s);
  bool rx_take(RxStream& s);  // false: closing, or the stream was stale and is retired now
  IoResult rx_read(RxStream& s);  // up to kRxBudgetBytes from the socket; stops at an error
  IoResult rx_advance(RxStream& s, size_t part_size, size_t k);  // k more bytes of the current part
  bool rx_claim_lost(const RxStream& s) const;  // another rail completed its chunk, or the group died
  // The stream is read: fail its rail on r's error, retire or re-arm it, see to the acks it owes.
  void rx_after_read_locked(RxStream& s, const IoResult& r, std::unique_lock<std::mutex>& lk);
  void rx_plan_acks_locked(Peer& p, Conn& c);  // urgent acks now, or after this pass (ack_via)
  // A waiting caller reads its own bytes (no hand-off from the receive thread): at most one
  // caller drives at a time; the receive thread stands aside meanwhile.
  bool rx_start_driving_locked();
  void rx_stop_driving_locked();
  void rx_readmit_locked(int64_t now);  // watchdog: the receive thread back in after a quiet spell
  static bool rx_on_driving_thread();   // the calling thread is the driving caller
  // Blocks up to timeout_ms (after spinning up to spin_us), taking mu_ only to send due hedge
  // copies when idle; returns after any progress or a bell.
  void rx_drive_once(const Op* ops, size_t n, int timeout_ms);
  bool rx_drive_ready(const Op* ops, size_t n);  // never blocks; true if it handled a stream
  void rx_send_owed_acks_locked();  // the driving caller's acks of what it read, one write per peer
  void rx_ack_now_locked(Peer& p, Conn& c);  // p's owed acks on c now, else by a writer
  // Adaptive spinning (spin_us > 0): how long this wait may poll before it sleeps, in ns (0:
  // sleep at once; *brief: a brief poll under CPU pressure), and how a spin ended (data or done
  // within its budget, or not). Lock free; only a driving caller notes.
  int64_t spin_budget_ns(bool* brief = nullptr);
  void note_spin(bool hit, bool brief);
  // A spinning caller's copies are due once its peer is kHedgeLateFactor times later than
  // peers usually answer its spins (spin_reply_ns_), within [kHedgeAfterUs, kHedgeStaleNs].
  static constexpr int64_t kHedgeLateFactor = 4;
  int64_t hedge_after_ns() const;
  // A sleeping waiter's hedge copies: writes those stale (kHedgeStaleNs after posting) and says
  // when the next one falls due (0: none it can wake for).
  int64_t send_stale_hedges();
  void note_reply(int64_t waited_ns);  // a spin got bytes after waited_ns: the smoothed reply time
  void notify_done_locked();  // ops may have completed or failed: wake every kind of waiter
  std::string rx_frame_done(RxStream& s);  // a header, payload or abort reason is complete
  void rx_start_locked(Conn& c, int fd);   // a socket was installed: a stream for it
  void rx_arm_locked(RxStream& s, bool first = false);  // (re-)registers its one-shot event
  void rx_retire_locked(RxStream& s);      // frees s: its socket was failed or replaced
  void rx_release_claim_locked(RxStream& s, bool incomplete);  // out of the caller's buffer
  void rx_drop_idle_claims_locked();       // the group died: nobody stays in a caller's buffer
  std::string rx_data_begin_locked(RxStream& s);  // claims the chunk, or picks the scratch
  void rx_data_done_locked(RxStream& s);

  // host_load.cc [watchdog pass; lock free but for psi_*, under mu_]: the host's CPU pressure, which gates
  // spinning.
  void sample_cpu_pressure(int64_t now);

  // loss.cc [watchdog pass, never blocks; the verdict is LossJudge's, loss_judge.h]: a connection whose
  // retransmissions show a lossy path is held (dampening.cc).
  void check_loss_locked(Peer& p, Conn& c, int64_t now);

  // conn_io.cc [the connection's writer thread, or an inline sender holding Conn::writing; *_locked
  // under mu_]: one connection's writer. Only it and the inline
  // sender write to a connected socket (one at a time: Conn::writing); neither holds mu_ while blocked on
  // the socket; an I/O error fails the rail, never the group. Each pass: finish a caller's handoff, or
  // gather under mu_ what is due (writer_gather_locked) and write it with mu_ released (writer_write); a
  // failed write fails the rail.
  void writer_loop(Conn& c);
  struct WriterBatch;  // transport_internal.h
  // Finishes the chunk a caller began writing inline (writing stays set until then); unlocks lk
  // while writing. False: the write failed and the rail with it.
  bool writer_finish_handoff(Conn& c, uint64_t epoch, int fd, std::unique_lock<std::mutex>& lk,
                             const std::function<bool()>& stale);
  // Control frames, owed acks, an abort reason and the next chunk the window allows (its header
  // started). False: nothing to write.
  bool writer_gather_locked(Conn& c, Peer& p, WriterBatch& b, int64_t now);
  // Lock free: frames and chunk in one write when it can, else frames, abort frame and reason,
  // then the chunk behind its header (b.tail).
  IoResult writer_write(Conn& c, int fd, const WriterBatch& b, const std::function<bool()>& stale);
  // Runs session(lk, epoch, fd) for every socket installed in c in turn, lk held on entry and
  // exit, the socket kept open meanwhile; returns at close().
  void serve_connection(Conn& c, const std::function<void(std::unique_lock<std::mutex>&, uint64_t, int)>& session);
  bool conn_takes_chunks_locked(const Conn& c, const Peer& p) const;
  int rails_taking_chunks_locked(const Peer& p) const;  // how many rails a new message is cut for
  size_t window_for_locked(const Conn& c) const;
  // Chunk size of the next bulk message to p: ~kChunkTimeMs of its slowest rail, in whole
  // grains (min_chunk_bytes) up to chunk_bytes; one grain while a rail to p is slow or unmeasured.
  size_t bulk_chunk_locked(const Peer& p) const;
  size_t chunk_grain() const { return std::min(opt_.min_chunk_bytes, opt_.chunk_bytes); }
  static constexpr int kChunkTimeMs = 8;
  // What a chunk's fixed cost (kChunkCostUs of CPU at the two ends) is worth in bytes on p's
  // slowest rail taking chunks (stripe_rails, messages.h). Until every such rail is measured
  // (bulk traffic measures them; decode-sized messages never do) kAssumedChunkCostBytes: a
  // 64 KiB message then goes on two rails. Unshaped 2-host lab, 8 alternated launches of 1000
  // all_reduces: 64 KiB p50 0.080 ms on two rails against 0.108 on four, 96 KiB 0.109 against
  // 0.136; at 1gbit two 32 KiB chunks were at least as fast as four of 16 (the shaper's bucket
  // passes a burst that small at once).
  double chunk_cost_bytes_locked(const Peer& p) const;
  static constexpr double kChunkCostUs = 8;
  static constexpr double kAssumedChunkCostBytes = 16 * 1024;
  FrameHeader start_chunk_locked(Conn& c, const Chunk& chunk, int64_t now, bool hedge = false);
  // Writes `frames` (control frames, then the chunk's header last) and the chunk's bytes;
  // blocks, lock free. A write the caller's own stop cut short (the chunk was delivered
  // elsewhere, the group aborted) is a failure of cause kOther: the stream is mid-frame.
  // *done (if given): bytes of frames + payload written before (in) and after (out) the call;
  // without may_block it returns kBlocked when the socket takes no more.
  IoResult write_chunk(Conn& c, int fd, const std::vector<FrameHeader>& frames, const Chunk& chunk,
                          const std::function<bool()>& stale, size_t* done = nullptr, bool may_block = true);
  // Moves owed acks into `frames` (at most `max_total` frames in all); returns how many.
  size_t take_acks_locked(Conn& c, Peer& p, std::vector<FrameHeader>& frames, int64_t now,
                          size_t max_total = 512);
  std::function<void()> sent_progress(Conn& c) const;  // for write loops: bytes left for the kernel
  // Sends `lead` (unless its magic is 0) and the acks owed to p on c right now, from this thread
  // and without blocking: room in the send buffer makes a partial write impossible. 1: sent (or
  // nothing to send); 0: no room or the socket is busy (acks stay owed); -1: the rail failed.
  int send_frames_now_locked(Conn& c, Peer& p, const FrameHeader& lead, int64_t now);
  // Free bytes in c's send buffer: at least `want` when this side's own books show that much
  // (no system call), else the kernel's count (SIOCOUTQ), which may be less.
  size_t send_room_locked(const Conn& c, size_t want) const;
  static constexpr size_t kUnbookedBytes = 256 * 1024;  // frames and headers written, not in inflight_bytes
  std::string stopped_chunk_reason() const;
  static std::string send_failed(const Conn& c, const std::string& why);  // "send to rank N on railK failed: why"
  // Pops p's next queued chunk that still needs sending (chunks acked or finished meanwhile are
  // dropped); an empty Chunk (msg null) when there is none.
  static Chunk pop_live_chunk_locked(Peer& p);

  // ---- State, by owner and lock rule ----

  // Fixed at construction (transport.cc), read-only after: any thread.
  int rank_, world_;
  std::vector<std::string> rail_ips_;
  std::string netns_;
  uint8_t key_[16];
  uint64_t group_hash_;
  TransportOptions opt_;
  RailProvider* const io_;  // every call on a rail's link goes through it (rail_io.h)
  std::vector<int> listen_fds_;  // closed at close(), after the accept threads are joined
  std::vector<int> ports_;
  // Set by connect_all before any thread starts, read-only after.
  std::vector<std::vector<std::pair<std::string, int>>> peer_addrs_;

  // The lock, its condition variables, and what it guards: under mu_ (the records in peers_ too,
  // but for the fields transport_internal.h marks atomic or thread-owned).
  mutable std::mutex mu_;
  std::condition_variable done_cv_;  // waiters of ops
  std::condition_variable state_cv_;  // wait_state_change: interrupt_state_wait() and close()
  // Counts interrupt_state_wait() calls: every wait under way when one comes returns (a flag
  // cleared by the first to see it kept a second waiter waiting to its timeout).
  uint64_t state_wait_interrupts_ = 0;
  std::vector<StateWatch*> state_watches_;  // the waits under way (operator_actions.cc)
  std::condition_variable dial_cv_;  // the connector: a rail it dials went down or was restored, or close()
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<bool> rail_drained_;  // operator drain of this rank's rail
  std::vector<bool> rail_held_;     // operator failover of this rank's rail
  std::string error_;
  ErrorKind error_kind_ = ErrorKind::kNone;
  Counters counters_;
  uint64_t call_seq_ = 0;  // collectives begun so far (the current one's number)
  CallDesc call_desc_;     // the current call
  std::array<std::pair<uint64_t, CallDesc>, 64> call_history_{};  // recent collectives by number
  uint64_t cur_seq_ = 0;   // call_seq_ for a collective, kP2PSeq for send/recv
  std::vector<std::shared_ptr<OutMsg>> hedges_due_;  // posted, hedge copy not yet sent (posting.cc)
  bool connect_started_ = false;
  std::vector<std::thread> threads_;  // started by connect_all, joined by close()

  // Atomic, any thread.
  std::atomic<size_t> hedges_due_count_{0};  // hedges_due_'s size, for a lock-free look
  std::atomic<bool> stopping_{false};
  // Set with error_: from then on no thread touches a caller's buffer (callers free them
  // once wait() throws), so late bytes on a rail that comes back go aside.
  std::atomic<bool> aborted_{false};
  std::atomic<int> handshakes_active_{0};

  // rx_loop.cc: receive sets. Descriptors fixed at construction. epfd_ holds every stream's
  // socket (one-shot). The receive thread sleeps on rx_ep_ = {epfd_, wake_fd_}; a driving caller
  // on caller_ep_ = {epfd_, caller_bell_}, and takes epfd_ out of rx_ep_ while it drives (and for
  // a quiet spell after), so data wakes the caller and only the caller.
  int epfd_ = -1;
  int rx_ep_ = -1;
  int caller_ep_ = -1;
  int wake_fd_ = -1;      // eventfd: written at close() so the receive and accept threads return at once
  int caller_bell_ = -1;  // eventfd: rung when another thread completed or failed something
  // Under mu_.
  bool caller_driving_ = false;
  bool rx_admitted_ = true;  // epfd_ is in rx_ep_
  int64_t last_drive_end_ns_ = 0;
  std::vector<std::unique_ptr<RxStream>> rx_streams_;  // one per socket not yet retired
  // The driving caller only.
  bool rx_acks_owed_ = false;  // some Peer::ack_via is set
  // rx_loop.cc: adaptive spinning, atomic, any thread. Share of recent spins that ended in data
  // (an average over ~8); spinning stops below kSpinKeepRate. Starts at 1: spin until shown useless.
  static constexpr float kSpinKeepRate = 0.5f;
  static constexpr unsigned kSpinProbeEvery = 16;
  std::atomic<float> spin_hit_rate_{1.0f};
  std::atomic<unsigned> spin_probe_{0};
  std::atomic<uint64_t> spin_hits_{0}, spin_misses_{0}, spin_skips_{0}, spin_briefs_{0};
  // Under CPU pressure a waiter still polls for up to kBriefSpinUs while such brief polls
  // usually end in data (their own hit rate, same keep rate and probes). A sleep costs a reply
  // that comes within them a wake-up, 50-80 us on this box: a 4 KiB all_reduce took 0.10 ms
  // instead of 0.025 whenever the gate was shut, and with two ranks spinning on a 2-core lab
  // host the pressure crossed the bar about a third of the time (p90 4x the median). A brief
  // poll takes a core another thread wants for at most kBriefSpinUs; one that misses stops.
  static constexpr int kBriefSpinUs = 50;
  std::atomic<float> brief_hit_rate_{1.0f};
  // How long a spinning caller usually waits for its peer's bytes (smoothed over ~8 spins
  // that got them): a fixed 50 us hedge delay sent nearly every 4 KiB message twice on a
  // loaded VM where replies took 50-80 us, and the copies' own CPU made replies later still.
  std::atomic<int64_t> spin_reply_ns_{0};

  // transport.cc: scratch(), the one caller running a collective (the communicator serializes them).
  std::unique_ptr<char[]> scratch_;
  size_t scratch_bytes_ = 0;

  // host_load.cc: host CPU pressure, sampled by the watchdog pass, read lock free by waiters.
  std::atomic<bool> spin_host_ok_{false};
  std::atomic<float> cpu_pressure_{0};
  int64_t psi_total_us_ = -1, psi_sampled_ns_ = 0;  // under mu_ (a watchdog pass)

  // detector.cc: watchdog passes. The thread sleeps on watchdog_timer_fd_ (fixed at
  // construction); a spinning caller that runs a pass pushes the timer back, so while callers
  // spin the thread stays asleep.
  int64_t watchdog_tick_ns_ = 4000000;  // set at construction
  int watchdog_timer_fd_ = -1;
  std::atomic<int64_t> last_pass_ns_{0};
  int64_t stall_end_ns_ = 0;  // under mu_: when this process was last seen held up (QuietJudge::held_up)
  int64_t progress_from_ns_ = 0;  // under mu_: our bytes' progress is not judged before this (after a stall)
};

}  // namespace r2cc
