// The caller's side of the data path: starting a call, posting sends and receives (a
// one-chunk send goes out from the posting thread), waiting for them, and the acknowledgement
// book-keeping that completes them.
//
// Contract: post_* never block (an inline send writes one chunk to an idle socket); wait_ops
// blocks with the transport lock released while asleep, and always ends: done, the group's
// error, or a verdict of the detector (check_wait_locked). A sent buffer belongs to the
// transport until its op is done; a received chunk is written at its offset straight into
// the caller's buffer (or a stash when it came before the receive was posted).
#include <algorithm>
#include <cstring>

#include "net.h"
#include "transport_internal.h"

namespace r2cc {

void TransportImpl::begin_call(const CallDesc& d) {
  std::lock_guard<std::mutex> g(mu_);
  if (!error_.empty()) throw_error_locked();
  call_desc_ = d;
  cur_seq_ = d.is_p2p() ? kP2PSeq : ++call_seq_;
  if (!d.is_p2p()) call_history_[cur_seq_ % call_history_.size()] = {cur_seq_, d};
  // A peer may be a call ahead: its messages for this call may already wait here.
  if (!d.is_p2p())
    for (auto& p : peers_)
      for (auto& [seq, m] : p->in)
        if (m->known && !m->posted && m->sent_seq == cur_seq_) check_call_locked(*p, *m);
  if (!error_.empty()) throw_error_locked();
}

void TransportImpl::end_call() { run_due_pass_on_caller(now_ns()); }

void TransportImpl::check_call_locked(Peer& p, const InMsg& m) {
  // The sender's call (from the message's first frame) against the receiving call: the
  // posted receive's, else this rank's current collective when it has the same number.
  uint64_t seq = 0;
  CallDesc mine;
  if (m.posted) {
    seq = m.want_seq;
    mine = CallDesc::unpack(m.want_desc);
  } else if (m.sent_seq != kP2PSeq && m.sent_seq == cur_seq_) {
    seq = cur_seq_;
    mine = call_desc_;
  } else {
    return;
  }
  const CallDesc theirs = CallDesc::unpack(m.sent_desc);
  // A message from an earlier collective of ours: name the calls that differed back then, as
  // the sender does when it catches ours; both ranks then word the error alike, whichever
  // read the other's message first (bytes are read when someone waits, not on arrival).
  if (m.sent_seq != kP2PSeq && seq != kP2PSeq && m.sent_seq < seq) {
    const auto& then = call_history_[m.sent_seq % call_history_.size()];
    if (then.first == m.sent_seq && then.second.pack() != theirs.pack()) {
      seq = m.sent_seq;
      mine = then.second;
    }
  }
  if (calls_match(m.sent_seq, theirs, seq, mine)) return;
  // Lower rank first: two ranks that each catch the mismatch word it identically.
  std::string a = "rank " + std::to_string(p.rank) + " called " + describe_call(m.sent_seq, theirs);
  std::string b = "rank " + std::to_string(rank_) + " called " + describe_call(seq, mine);
  if (p.rank > rank_) std::swap(a, b);
  set_error_locked(ErrorKind::kCallMismatch,
                   "r2cc: the ranks called different collectives: " + a + ", " + b +
                       ". Every rank must make the same calls in the same order with the same op, dtype, shape and "
                       "root; the group is aborted on all ranks.");
}

void TransportImpl::check_peer(int peer) const {
  if (peer < 0 || peer >= world_ || peer == rank_)
    throw std::invalid_argument("r2cc: rank " + std::to_string(rank_) + " cannot exchange data with rank " +
                                std::to_string(peer) + " (group of " + std::to_string(world_) + ")");
}

Op TransportImpl::post_send(int peer, const void* buf, size_t len) {
  check_peer(peer);
  Op op;
  op.done_at_post = len == 0;  // nothing to move; both sides skip it alike
  if (len == 0) return op;
  std::unique_lock<std::mutex> lk(mu_);
  if (!error_.empty()) throw_error_locked();
  Peer& p = *peers_[peer];
  auto m = std::make_shared<OutMsg>();
  m->peer = peer;
  m->seq = p.next_send_seq++;
  m->call_seq = cur_seq_;
  m->call_desc = call_desc_.pack();
  m->len = len;
  // Cut for the rails that take chunks now: cut for all four with one drained or held, a 2 MiB
  // message became four 512 KiB chunks on three rails, one of which carried two (4 MiB
  // all_reduce at 2 x 4 rails, one drained: 15.8 ms against 10.6 ms on a 3-rail lab).
  // (Below a grain per rail the bulk size makes no difference: skip working it out.)
  // A smaller message goes on as many of them as pay for their chunks (stripe_rails).
  const int rails = rails_taking_chunks_locked(p);
  const bool is_bulk = len > chunk_grain() * size_t(rails);
  const size_t bulk = is_bulk ? bulk_chunk_locked(p) : chunk_grain();
  // (Up to kMinChunkBytes a message is one chunk however many rails: skip the cost.)
  const int stripe = is_bulk || len <= kMinChunkBytes ? rails : stripe_rails(len, rails, chunk_cost_bytes_locked(p));
  m->chunk = chunk_size_for(len, bulk, stripe);
  m->nchunks = num_chunks(len, m->chunk);
  m->acked.assign(m->nchunks, 0);
  m->on_rail.assign(m->nchunks, -1);
  if (len <= opt_.small_msg_bytes) {
    m->owned.assign(static_cast<const char*>(buf), static_cast<const char*>(buf) + len);
    m->data = m->owned.data();
    op.done_at_post = true;
  } else {
    m->data = static_cast<const char*>(buf);
  }
  p.out[m->seq] = m;
  op.out = m;
  // A one-chunk message goes out from this thread when a rail is idle: saves a
  // thread wake-up, which is most of a small message's latency.
  if (m->nchunks == 1 && try_send_inline(p, Chunk{m, 0}, lk, InlineSend::kAny)) {
    // A small message may also go out on a second rail, so that a silently dead first rail
    // costs no failure detection. Not now, though: written here it delayed this rank's read
    // of the peer's message by a send, and the peer's next call by a read. It goes out only
    // if the message is late to be acknowledged (send_due_hedges_locked). (Only copied
    // messages: their bytes stay valid however long the copy waits.)
    if (len <= opt_.hedge_bytes && !m->owned.empty() && m->on_rail[0] >= 0 && !m->done) {
      m->posted_ns = now_ns();
      hedges_due_.push_back(m);
      hedges_due_count_.store(hedges_due_.size(), std::memory_order_relaxed);
    }
    return op;
  }
  for (size_t i = 0; i < m->nchunks; ++i) p.queue.push_back(Chunk{m, uint32_t(i)});
  // The first chunks of a larger message go out from this thread too, one per rail whose
  // socket has room for all of it (the write does not block); the writers take the rest.
  std::vector<bool> rails_used(size_t(num_rails()), false);
  for (int sent = 0; sent < num_rails() && !p.queue.empty() && error_.empty(); ++sent) {
    const Chunk next = p.queue.front();
    p.queue.pop_front();
    if (next.msg->done || next.msg->acked[next.idx]) continue;
    if (!try_send_inline(p, next, lk, InlineSend::kIfRoom, &rails_used)) {
      p.queue.push_front(next);
      break;
    }
  }
  // Writers take the rest; one whose window is full waits for its acks, which refill it
  // (forget_inflight_locked): waking it now only cost a context switch, per rail and message.
  if (!p.queue.empty())
    for (auto& c : p.conns)
      if (c->inflight_bytes < window_for_locked(*c)) c->cv.notify_one();
  return op;
}

void TransportImpl::finish_chunk_write_locked(const Chunk& chunk) {
  if (--chunk.msg->active_writers == 0 && chunk.msg->done) notify_done_locked();
}

bool TransportImpl::try_send_inline(Peer& p, const Chunk& chunk, std::unique_lock<std::mutex>& lk, InlineSend mode,
                                std::vector<bool>* rails_used, Conn* only) {
  const bool hedge = mode == InlineSend::kHedge;
  const bool if_room = mode == InlineSend::kIfRoom || mode == InlineSend::kRefill;
  const int taken = hedge ? chunk.msg->on_rail[chunk.idx] : -1;  // a hedge copy needs another rail
  // kIfRoom: one chunk per rail and message (rails_used): a rail that had room for every chunk
  // took them all (1 MiB at 1gbit went out on one rail), and the others' buffers, never used,
  // never grew to have room. Room: twice the chunk, as the kernel's count of free buffer
  // includes its own overhead.
  const size_t room = 2 * chunk.msg->chunk_len(chunk.idx) + 4096;
  Conn* best = nullptr;
  for (auto& c : p.conns)
    if (c->rail != taken && (!only || c.get() == only) && !c->writing && c->inflight_bytes < window_for_locked(*c) &&
        c->ctrl.empty() && c->ctrl_abort.empty() && conn_takes_chunks_locked(*c, p) &&
        (!best || c->inflight_bytes < best->inflight_bytes) &&
        (!if_room || ((!rails_used || !(*rails_used)[size_t(c->rail)]) &&
                      (send_room_locked(*c, room) >= room || c->skip_room_check))))
      best = c.get();
  if (!best) return false;
  Conn& c = *best;
  if (rails_used) (*rails_used)[size_t(c.rail)] = true;
  const uint64_t epoch = c.epoch.load();
  const int fd = c.fd;
  const int64_t now = now_ns();
  // Acks owed to this peer ride along: no writer wake-up, no extra segment.
  std::vector<FrameHeader> frames;
  take_acks_locked(c, p, frames, now);
  frames.push_back(start_chunk_locked(c, chunk, now, hedge));
  c.writing = true;
  use_fd_locked(c, fd);
  c.skip_room_check = false;
  lk.unlock();
  auto stale = [&] { return stopping_.load() || c.epoch.load() != epoch; };
  size_t done = 0;
  IoResult r = write_chunk(c, fd, frames, chunk, stale, &done, /*may_block=*/false);
  lk.lock();
  const bool handed_off = r.status == IoStatus::kBlocked && c.epoch.load() == epoch;
  if (handed_off) {
    // The room check counts payload, the kernel counts buffer overhead too: when the socket
    // fills up mid-chunk, the rail's writer finishes it. (A caller blocked here while driving
    // read nobody's acks: at 4 hosts a rail fault then took 400 ms instead of 60 to fail over.)
    c.handoff.reset(new Conn::Handoff{epoch, std::move(frames), chunk, done});
    counters_.handoffs++;
    c.cv.notify_one();
    r = IoResult{};
  } else {
    c.writing = false;
    finish_chunk_write_locked(chunk);
  }
  release_fd_locked(c, fd);
  if (r.ok() && !handed_off && c.injected_failure_due()) r = c.injected_failure();  // the writer counts a handed-off one
  if (!r.ok()) fail_conn_locked(c, epoch, r.cause, send_failed(c, r.text()));
  // Wake this peer's writers only when one may have work that waited for the socket (a
  // kIfRoom or kRefill caller wakes the ones it needs once, after its last chunk).
  if (!r.ok() || (!if_room && !p.queue.empty()) || !c.ctrl.empty() || !c.ctrl_abort.empty())
    p.wake_writers();
  return true;
}

size_t TransportImpl::send_due_hedges_locked(std::unique_lock<std::mutex>& lk, int64_t posted_before_ns) {
  if (hedges_due_.empty()) return 0;
  size_t written = 0;
  // Taken out first: try_send_inline unlocks, and a post_send meanwhile appends.
  std::vector<std::shared_ptr<OutMsg>> due, later;
  due.swap(hedges_due_);
  for (auto& m : due) {
    if (m->done || m->acked[0] || m->on_rail[0] < 0 || m->hedge_rail >= 0) continue;  // needs no copy
    // The peer's kernel acknowledged every byte on the first copy's socket: the message waits
    // in the peer's socket, the peer is late, not the rail, and a copy would only cost it a
    // second read when it comes (should the rail fail before that, failover re-sends it).
    // (Idle lab, 4-64 KiB all_reduce: copies in 4-11% of calls before, 4-7% after.)
    const Conn& first = *peers_[m->peer]->conns[size_t(m->on_rail[0])];
    if (first.fd >= 0 && is_connected(first.state) && !first.writing && io_->bytes_unacked(first.fd) == 0) {
      counters_.hedges_unneeded++;
      continue;
    }
    // Not due yet, or no second rail free right now (busy, or the only one): tried again later.
    if (m->posted_ns >= posted_before_ns || !error_.empty() ||
        !try_send_inline(*peers_[m->peer], Chunk{m, 0}, lk, InlineSend::kHedge))
      later.push_back(std::move(m));
    else
      written++;
  }
  counters_.hedges += written;
  hedges_due_.insert(hedges_due_.begin(), later.begin(), later.end());
  hedges_due_count_.store(hedges_due_.size(), std::memory_order_relaxed);
  return written;
}

Op TransportImpl::post_recv(int peer, void* buf, size_t len) {
  check_peer(peer);
  Op op;
  op.done_at_post = len == 0;
  if (len == 0) return op;
  std::lock_guard<std::mutex> g(mu_);
  if (!error_.empty()) throw_error_locked();
  Peer& p = *peers_[peer];
  const uint64_t seq = p.next_recv_seq++;
  auto it = p.in.find(seq);
  std::shared_ptr<InMsg> m;
  if (it != p.in.end()) {  // chunks arrived before the receive was posted
    m = it->second;
    m->posted = true;
    m->want_seq = cur_seq_;
    m->want_desc = call_desc_.pack();
    if (m->known) check_call_locked(p, *m);
    if (error_.empty() && m->len != len)
      set_error_locked(ErrorKind::kCallMismatch, "r2cc: rank " + std::to_string(peer) + " sent " +
                                                     std::to_string(m->len) + " bytes but rank " + std::to_string(rank_) +
                                                     " expected " + std::to_string(len) +
                                                     " (the ranks called different collectives or shapes)");
    if (!error_.empty()) throw_error_locked();
    m->user = static_cast<char*>(buf);
    if (m->known && m->nrecv == m->nchunks && m->active_readers == 0) finish_in_locked(p, *m);
  } else {
    m = std::make_shared<InMsg>();
    m->peer = peer;
    m->seq = seq;
    m->len = len;
    m->posted = true;
    m->want_seq = cur_seq_;
    m->want_desc = call_desc_.pack();
    m->user = m->data = static_cast<char*>(buf);
    p.in[seq] = m;
  }
  op.in = m;
  return op;
}

namespace {
constexpr int kWaitSliceMs = 50;  // a waiter re-checks the detector's verdicts at least this often
// Reads atomic fields only: safe with or without the lock (a spinning waiter has none).
bool op_done(const Op& op) {
  return op.done_at_post || (op.out && op.out->done && op.out->active_writers == 0) || (op.in && op.in->done);
}
int op_peer(const Op& op) { return op.out ? op.out->peer : op.in->peer; }
}  // namespace

void TransportImpl::wait(const Op& op) {
  if (op.done_at_post) return;
  wait_ops(&op, 1, nullptr);
}

std::vector<size_t> TransportImpl::wait_some(const std::vector<Op>& ops) {
  if (ops.empty()) throw std::invalid_argument("r2cc: wait_some needs at least one op");
  std::vector<size_t> done;
  wait_ops(ops.data(), ops.size(), &done);
  return done;
}

bool TransportImpl::any_op_done(const Op* ops, size_t n) const {
  for (size_t i = 0; i < n; ++i)
    if (op_done(ops[i])) return true;
  return false;
}

void TransportImpl::spin_until_any_done(const Op* ops, size_t n, int64_t budget_ns) const {
  // A waiter that does not drive (another caller does): the driver or the receive thread
  // completes the op; this one sees it without the futex sleep and wake-up
  // that a condition variable costs. Only worth it where a core is free to spin.
  const int64_t until = now_ns() + budget_ns;
  for (unsigned k = 0;; ++k) {
    for (size_t i = 0; i < n; ++i)
      if (op_done(ops[i])) return;
    if (aborted_.load() || ((k & 63) == 0 && now_ns() >= until)) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();  // eases the sibling hyper-thread while spinning
#endif
  }
}

void TransportImpl::wait_ops(const Op* ops, size_t n, std::vector<size_t>* done) {
  const int64_t start = now_ns();
  const int64_t deadline = start + int64_t(opt_.op_timeout_s * 1e9);
  // What this wait depends on, per peer (bit 0: a receive, bit 1: a send): the path checks run
  // once per peer and wake-up, not once per op (an executor may wait on hundreds).
  std::vector<uint8_t> waits_on(size_t(world_), 0);
  for (size_t i = 0; i < n; ++i) waits_on[size_t(op_peer(ops[i]))] |= ops[i].out ? 2 : 1;
  std::unique_lock<std::mutex> lk(mu_);
  // The first waiter reads its peers' bytes itself (rx_loop.cc); a second one waits for it.
  struct Driving {
    TransportImpl& t;
    bool on;
    ~Driving() {  // the lock is held on every way out
      if (on) t.rx_stop_driving_locked();
    }
  } driving{*this, false};
  bool spun = false;
  for (;;) {
    bool any = false;
    for (size_t i = 0; i < n; ++i)
      if (op_done(ops[i])) {
        any = true;
        if (done) done->push_back(i);
      }
    if (any) return;
    // Nothing done yet. Stalled peers first, so a timeout names the stalled one.
    for (int pass = 0; pass < 2 && error_.empty(); ++pass)
      for (int peer = 0; peer < world_ && error_.empty(); ++peer) {
        const uint8_t w = waits_on[size_t(peer)];
        if (!w || (peers_[peer]->stalled_since_ns != 0) != (pass == 0)) continue;
        if (peers_[peer]->closed)
          throw AbortedError(ErrorKind::kPeerGone,
                             "r2cc: rank " + std::to_string(peer) + " closed its communicator while rank " +
                                 std::to_string(rank_) + " still " + (w & 2 ? "sent to" : "expected data from") +
                                 " it (the ranks ran different sequences of collectives)");
        check_wait_locked(peer, w & 2, start, deadline);
      }
    if (!error_.empty()) {
      // The caller frees its buffers once this throws: first let any thread still inside
      // one of them step out (they stop within one poll interval after the abort).
      const int64_t until = now_ns() + 200000000LL;
      auto busy = [&] {
        for (size_t i = 0; i < n; ++i)
          if ((ops[i].in && ops[i].in->active_readers > 0) || (ops[i].out && ops[i].out->active_writers > 0))
            return true;
        return false;
      };
      while (busy() && now_ns() < until) done_cv_.wait_for(lk, std::chrono::milliseconds(1));
      throw_error_locked();
    }
    if (!driving.on && !any_op_done(ops, n)) driving.on = rx_start_driving_locked();
    if (driving.on) {
      lk.unlock();
      rx_drive_once(ops, n, kWaitSliceMs);
      lk.lock();
    } else {
      const int64_t budget = spun ? 0 : spin_budget_ns();
      if (budget) {  // once: then sleep like any other waiter
        spun = true;
        lk.unlock();
        spin_until_any_done(ops, n, budget);
        lk.lock();
        continue;
      }
      done_cv_.wait_for(lk, std::chrono::milliseconds(kWaitSliceMs));
    }
  }
}

// ---- acknowledgements --------------------------------------------------------------

void TransportImpl::enqueue_ack_locked(Peer& p, uint64_t seq, uint64_t idx, bool all, bool urgent) {
  p.acks.push_back(AckItem{seq, idx, all});
  // Acks of small chunks ride on the next write or heartbeat (<= heartbeat_ms):
  // their sender does not wait for them, and waking a writer per tiny message
  // costs more than the message. Large chunks free window space: ack at once, from a
  // driving caller itself once it has read what is ready (rx_handle), else by a writer.
  if (urgent && !rx_on_driving_thread()) p.wake_ack_carrier();
  if (urgent) p.acks_urgent = true;
}

void TransportImpl::on_ack_locked(Peer& p, uint64_t seq, uint64_t idx, bool all) {
  auto it = p.out.find(seq);
  if (it == p.out.end()) return;  // duplicate ack of a finished message
  OutMsg& m = *it->second;
  const size_t lo = all ? 0 : idx, hi = all ? m.nchunks : std::min<size_t>(idx + 1, m.nchunks);
  const int64_t now = now_ns();
  for (size_t i = lo; i < hi; ++i) {
    if (m.acked[i]) continue;
    m.acked[i] = 1;
    m.nacked++;
    if (m.on_rail[i] >= 0) forget_inflight_locked(p, m.on_rail[i], seq, uint32_t(i), m.chunk_len(i), now);
    m.on_rail[i] = -1;
  }
  if (m.hedge_rail >= 0 && m.nacked == m.nchunks) {
    forget_inflight_locked(p, m.hedge_rail, seq, 0, m.chunk_len(0), now);
    m.hedge_rail = -1;
  }
  if (m.nacked == m.nchunks) {
    m.done = true;
    p.out.erase(it);
    notify_done_locked();
  }
}

void TransportImpl::forget_inflight_locked(Peer& p, int rail, uint64_t seq, uint32_t idx, size_t bytes, int64_t now) {
  Conn& c = *p.conns[rail];
  auto f = std::find(c.inflight.begin(), c.inflight.end(), std::make_pair(seq, idx));
  if (f == c.inflight.end()) return;
  c.inflight.erase(f);
  c.inflight_bytes -= bytes;
  c.acked_bytes += bytes;
  // Freed window space matters only to writers with chunks waiting, and only on this rail. The
  // driving caller fills it itself after its read (refill_freed_rails_locked): no wake-up.
  if (!p.queue.empty()) {
    if (rx_on_driving_thread()) c.window_freed = true;
    else c.cv.notify_one();
  }
  if (c.inflight.empty()) {
    c.busy_ns += now - c.busy_since_ns;
    c.busy_since_ns = 0;
    if (c.state == RailState::kDraining) c.state = RailState::kDrained;
  }
}

void TransportImpl::refill_freed_rails_locked(Peer& p, std::unique_lock<std::mutex>& lk) {
  // At 4 hosts x 1gbit, waking a rail's writer for each acked 256 KiB chunk was ~8k context
  // switches a second per box; the caller that read the ack is awake anyway.
  for (auto& cp : p.conns) {
    Conn& c = *cp;
    if (!c.window_freed) continue;
    c.window_freed = false;
    while (error_.empty()) {
      const Chunk next = pop_live_chunk_locked(p);
      if (!next.msg) break;
      if (!try_send_inline(p, next, lk, InlineSend::kRefill, nullptr, &c)) {
        p.queue.push_front(next);
        break;
      }
    }
    // Window left but no room in the socket (or it is busy): the writer blocks on it instead.
    if (!p.queue.empty() && c.inflight_bytes < window_for_locked(c)) c.cv.notify_one();
  }
}

void TransportImpl::finish_in_locked(Peer& p, InMsg& m) {
  if (!p.is_done(m.seq)) p.mark_done(m.seq);
  if (!m.posted) return;  // complete in the stash; post_recv copies it out
  if (m.data != m.user) std::memcpy(m.user, m.data, m.len);
  m.done = true;
  p.in.erase(m.seq);
  notify_done_locked();
}

void TransportImpl::release_reader_locked(Peer& p, InMsg& m) {
  // The message is finished only when no reader can still write into its buffer.
  if (--m.active_readers == 0 && m.known && m.nrecv == m.nchunks && !m.done) finish_in_locked(p, m);
}

}  // namespace r2cc
