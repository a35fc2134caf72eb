// Connection and peer records of the transport (private to its .cc files). Their fields are
// under TransportImpl::mu_ unless a comment says otherwise (atomics, or owned by one thread).
#pragma once

#include <time.h>

#include "dampening.h"
#include "loss_judge.h"
#include "messages.h"
#include "net.h"
#include "progress.h"
#include "quiet_judge.h"
#include "transport_impl.h"

namespace r2cc {

inline double unix_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return double(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

inline int64_t ms_ns(int ms) { return int64_t(ms) * 1000000; }

inline bool is_connected(RailState s) {
  return s == RailState::kUp || s == RailState::kDraining || s == RailState::kDrained || s == RailState::kHeld;
}

struct TransportImpl::Conn {
  int peer = -1, rail = -1;
  bool we_connect = false;  // the higher rank of a pair dials; the lower one accepts
  int fd = -1;
  int sndbuf = 0;  // SO_SNDBUF of the current socket, read at install (send_room_locked)
  // Bumped by every install and failure; a reader/writer holding an older epoch stands down.
  std::atomic<uint64_t> epoch{0};
  std::map<int, int> fd_users;  // reader/writer threads still using a socket; the last one closes a retired fd
  RailState state = RailState::kConnecting;
  bool peer_drained = false;  // the peer asked us not to put new chunks on this rail
  // Flap dampening (dampening.h: the policy; dampening.cc acts on it).
  FlapDampening damp;
  bool peer_holds = false;       // the peer holds the rail out (its kHold frame)
  bool restore_pending = false;  // restored while down: tell the peer at the next install
  // Loss detection (loss_judge.h: the policy; loss.cc acts on it).
  LossJudge loss;
  // Set aside while other rails to the peer deliver: its chunks were re-sent elsewhere and it
  // takes no new ones, but the connection is kept. Why decides what clears it (detector.cc):
  //   kSilent  no bytes from the peer and ours unacknowledged by its host (a dead path);
  //   kMute    no bytes from the peer on it while its other rails deliver (its data is stuck);
  //            bytes arriving again clear either;
  //   kStuck   the peer's host acknowledges none of our outstanding bytes, though it speaks;
  //   kSlow    it delivers our backlog at a small fraction of the usual rate;
  //            all our bytes delivered clears either.
  // Persisting past peer_silence_ms fails it for real (a slow rail excepted: it delivers).
  bool suspect = false;
  SuspectWhy suspect_why = SuspectWhy::kSilent;
  // Counted by flap dampening yet: a gray suspicion that clears by itself within the fail time
  // (a loss that TCP repaired late) is no failure; one that lasts is counted when it fails.
  bool suspect_counted = false;
  int64_t suspect_since_ns = 0;
  // Gray failures (detector.cc): whether our bytes on the current socket move.
  ProgressJudge progress;
  uint64_t progress_epoch = 0;     // the socket progress judges (a new one starts afresh)
  int64_t progress_sampled_ns = 0;
  bool progress_outstanding = false;  // its last sample saw bytes outstanding
  // Full-size probes (send_probe_locked): an idle rail's heartbeats are small frames, which a
  // gray path still passes; a probe fills a whole segment.
  int64_t probe_sent_ns = 0;  // this socket's last probe written (0: none yet)
  // The path carried a full-size probe and every byte before it: until then the rail takes new
  // chunks only when no proven rail can (conn_takes_chunks_locked), so a re-dialed gray path is
  // found by its probe, not by the chunks of a collective. A group's first connections start
  // proven: they all came up together, and none should be favoured over another at the start.
  bool proven = false;
  uint32_t mss = 0;  // the socket's segment size, from its last progress sample (0: not yet known)
  std::vector<std::pair<uint64_t, uint32_t>> inflight;  // (seq, chunk) sent, not acked
  size_t inflight_bytes = 0;
  std::deque<FrameHeader> ctrl;  // frames only this connection may carry (echo, drain)
  std::string ctrl_abort;        // abort reason to send, if any
  // Acks this connection carried recently; if it dies they may be lost in its
  // kernel buffers, so they are handed to the surviving rails again.
  std::deque<std::pair<int64_t, AckItem>> acks_carried;
  std::atomic<int64_t> last_rx_ns{0};
  int64_t last_tx_ns = 0;
  // Bytes handed to the kernel (set after the send call, by any writer). tx_resume_ns is the
  // first send after a pause: a kernel's ACK silence only counts as path evidence once we
  // have been sending without pause for longer than the rail timeout.
  std::atomic<int64_t> tx_done_ns{0};
  std::atomic<int64_t> tx_resume_ns{0};
  QuietJudge quiet;  // quiet-rail detection (quiet_judge.h): whether the path is dead
  // Bytes were handed to the kernel just now (any thread; no lock needed).
  void note_tx(int64_t now, int64_t pause_ns) {
    if (now - tx_done_ns.exchange(now) > pause_ns) tx_resume_ns.store(now);
  }
  RxStream* rx = nullptr;  // the receive stream of the current socket (rx_loop.cc)
  // Test fault injector: fail right after this many more data chunks were written on this
  // connection, by any path (writer, caller inline, a handed-off chunk the writer finished).
  int64_t fail_after_chunks = -1;
  bool injected_failure_due() {  // a data chunk was written: is this the one to fail after?
    if (fail_after_chunks <= 0 || --fail_after_chunks > 0) return false;
    fail_after_chunks = -1;
    return true;
  }
  static IoResult injected_failure() { return IoResult::failure(IoCause::kOther, "injected failure (test)"); }
  bool skip_room_check = false;  // test fault injector (inject_full_socket)
  bool writing = false;  // a thread is writing to the socket outside the lock (writer or inline sender)
  bool window_freed = false;  // the driving caller's read freed window here: it refills it (posting.cc)
  // A chunk a caller began writing inline when the socket stopped taking bytes: this
  // connection's writer writes the rest (writing stays set until then, so nothing else gets in
  // between). A caller never waits on a socket: it is the one reading the peers' acks.
  struct Handoff {
    uint64_t epoch;
    std::vector<FrameHeader> frames;
    Chunk chunk;
    size_t done;  // bytes of frames + payload already written
  };
  std::unique_ptr<Handoff> handoff;
  // This connection's writer waits here. One per connection, not per peer: an ack frees
  // window on its own rail only, and waking every writer of the peer for it cost three
  // useless context switches per 256 KiB chunk at 4 rails.
  std::condition_variable cv;
  int64_t last_probe_ns = 0;
  int64_t last_echoed_ns = 0;  // the peer's clock on the last heartbeat we echoed (the stream's owner only)
  // A heartbeat echo owed to the peer (under mu_): the watchdog pass sends it with how long it
  // waited here, so it needs no writer wake-up and the peer's round trip stays exact.
  uint64_t echo_peer_clock = 0;
  int64_t echo_heard_ns = 0;  // 0: none owed
  // stats
  ConnStats st;
  // Why the connection last failed (st.last_error is the same in words, for people): the
  // detector reads this to tell a peer whose process is gone from a path that is down.
  IoCause last_cause = IoCause::kNone;
  void note_error(IoCause cause, const std::string& text, bool stamp = true) {
    last_cause = cause;
    st.last_error = text;
    if (stamp) st.last_error_time = unix_now();
  }
  int64_t busy_since_ns = 0;  // inflight went non-empty
  int64_t busy_ns = 0;
  uint64_t busy_periods = 0;  // times inflight went non-empty
  uint64_t acked_bytes = 0;
  uint64_t bw_ref_acked = 0;
  int64_t bw_ref_busy = 0;
  uint64_t bw_ref_periods = 0;
  uint64_t bw_ref_chunks = 0;
};

// One installed socket's receive side: a frame parser that keeps its place between events.
// The thread that took its one-shot event owns it (busy); others touch it only under mu_ while
// it is idle.
struct TransportImpl::RxStream {
  enum class Phase { kHeader, kPayload, kAbortReason, kPadding };
  Conn* conn = nullptr;
  int fd = -1;
  uint64_t epoch = 0;  // the Conn's epoch at install: when it moves on, the stream retires
  bool busy = false;
  Phase phase = Phase::kHeader;
  FrameHeader h{};
  size_t have = 0;  // bytes of the current header, payload or reason read so far
  std::shared_ptr<InMsg> msg;  // kPayload: the message the chunk belongs to (null: already complete)
  size_t idx = 0;
  bool urgent = false;  // ack at once: the chunk frees window space at the sender
  char* dest = nullptr;  // the claimed chunk in the message's buffer; null: into scratch
  std::vector<char> scratch;
  std::string reason;
  // Read-ahead: a header or a small remainder is read with one recv of up to kStageBytes, so
  // a small message (header + payload, often the next header too) costs one system call, not
  // three. Bytes in [stage_pos, stage_end) are read from the socket but not yet parsed.
  static constexpr size_t kStageBytes = 16 * 1024;
  std::unique_ptr<char[]> stage{new char[kStageBytes]};
  size_t stage_pos = 0, stage_end = 0;

  // Where the current part (header, payload or abort reason) is read to, and its whole size.
  struct Part {
    char* at;
    size_t size;
  };
  Part part() {
    switch (phase) {
      case Phase::kHeader: return {reinterpret_cast<char*>(&h), sizeof(FrameHeader)};
      case Phase::kPayload: return {dest ? dest : scratch.data(), h.len};
      case Phase::kAbortReason: return {reason.data(), reason.size()};
      case Phase::kPadding: return {scratch.data(), h.len};  // a probe's: read and dropped
    }
    return {nullptr, 0};
  }
};

// What one pass of a connection's writer sends (writer_gather_locked fills it under mu_).
struct TransportImpl::WriterBatch {
  std::vector<FrameHeader> frames;  // control frames and acks (and the chunk's header, unless tail has it)
  std::vector<FrameHeader> tail;    // the chunk's header when an abort reason goes first
  std::string abort_reason;         // to send with an abort frame, if any
  ErrorKind abort_kind = ErrorKind::kAborted;
  Chunk chunk;                      // msg null: no chunk this pass
};

struct TransportImpl::Peer {
  int rank = -1;
  uint64_t next_send_seq = 0, next_recv_seq = 0;
  std::deque<Chunk> queue;                           // waiting for a rail
  std::map<uint64_t, std::shared_ptr<OutMsg>> out;  // sent, not fully acked
  std::map<uint64_t, std::shared_ptr<InMsg>> in;    // incoming, not complete
  uint64_t done_floor = 0;                           // every seq below is complete
  std::set<uint64_t> done_above;                     // complete seqs >= done_floor
  std::deque<AckItem> acks;                          // to send, on any rail
  bool acks_urgent = false;                          // some owed ack frees window space at the sender
  bool acks_refill = false;                          // some owed ack lets the sender send more of its message
  Conn* ack_via = nullptr;  // driving caller: urgent acks owed, to go on this rail once it has read what is ready
  std::vector<std::unique_ptr<Conn>> conns;          // one per rail
  int64_t no_link_since_ns = 0;                      // 0 while some rail is connected
  int64_t no_path_since_ns = 0;                      // 0 while some rail is connected and not suspect
  int64_t stalled_since_ns = 0;                      // the peer's process went silent (its kernel did not)
  uint64_t stalls = 0;
  double last_stall_s = 0;
  int64_t last_heard_ns = 0;                         // any byte from the peer on any rail
  // The peer's process paused (stopped, starved) or ours did: every rail quiet for over half the
  // rail timeout. It resumes its rails one by one, a few ms apart, so a rail quiet now was quiet
  // with all the others: its silence counts from when the peer spoke again (gray.cc, loss.cc).
  int64_t freshest_rx_ns = 0;                        // the newest byte on any rail, at the last pass
  bool all_quiet = false;                            // at the last pass, every rail had been quiet
  int64_t spoke_again_ns = 0;                        // when it spoke again after such a pause
  int64_t pause_ns = 0;                              // how long that pause was (newest byte before to after)
  bool closed = false;                               // the peer closed its communicator (goodbye)

  void wake_writers() {  // work any of this peer's writers may take (new chunks, a state change)
    for (auto& c : conns) c->cv.notify_one();
  }
  // The writer to carry owed acks: a connected, trusted rail (a suspect one carries none).
  void wake_ack_carrier() {
    for (auto& c : conns)
      if (is_connected(c->state) && !c->suspect) return c->cv.notify_one();
  }
  bool is_done(uint64_t seq) const { return seq < done_floor || done_above.count(seq) > 0; }
  void mark_done(uint64_t seq) {
    done_above.insert(seq);
    while (done_above.count(done_floor)) done_above.erase(done_floor++);
  }
};

}  // namespace r2cc
