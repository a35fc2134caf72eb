// The transport's data path: posting, waiting, the per-connection reader and
// writer loops, acknowledgements.
#include <algorithm>
#include <cstring>

#include "net.h"
#include "transport_internal.h"

namespace r2cc {

namespace {
constexpr int kPollMs = 10;

constexpr size_t kMaxAcksPerWrite = 512;
constexpr int64_t kAckMemoryNs = 2000000000LL;  // acks a dead rail may have swallowed
constexpr uint32_t kMaxAbortReason = 4096;
constexpr int kIdleWriterWaitMs = 100;
constexpr int64_t kEchoEveryNs = 100000000;  // heartbeat echoes (RTT samples): ~10 per second per rail

FrameHeader ctrl_frame(FrameType t, uint64_t seq = 0, uint64_t offset = 0, uint32_t len = 0) {
  return FrameHeader{kFrameMagic, uint32_t(t), seq, offset, 0, len, 0};
}
}  // namespace

// ---- posting and waiting ---------------------------------------------------------

std::function<void()> Transport::sent_progress(Conn& c) const {
  const int64_t pause_ns = int64_t(opt_.rail_timeout_ms) * 1000000 / 2;
  return [&c, pause_ns] { c.note_tx(now_ns(), pause_ns); };
}

void Transport::begin_call(const CallDesc& d) {
  std::lock_guard<std::mutex> g(mu_);
  if (!error_.empty()) throw_error_locked();
  call_desc_ = d;
  cur_seq_ = d.is_p2p() ? kP2PSeq : ++call_seq_;
  // A peer may be a call ahead: its messages for this call may already wait here.
  if (!d.is_p2p())
    for (auto& p : peers_)
      for (auto& [seq, m] : p->in)
        if (m->known && !m->posted && m->sent_seq == cur_seq_) check_call_locked(*p, *m);
  if (!error_.empty()) throw_error_locked();
}

void Transport::check_call_locked(Peer& p, const InMsg& m) {
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

void Transport::check_peer(int peer) const {
  if (peer < 0 || peer >= world_ || peer == rank_)
    throw std::invalid_argument("r2cc: rank " + std::to_string(rank_) + " cannot exchange data with rank " +
                                std::to_string(peer) + " (group of " + std::to_string(world_) + ")");
}

Op Transport::post_send(int peer, const void* buf, size_t len) {
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
  m->chunk = chunk_size_for(len, opt_.chunk_bytes, num_rails());
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
  if (m->nchunks == 1 && try_send_inline(p, Chunk{m, 0}, lk)) {
    // A small message also goes out on a second rail: if the first one dies, the
    // copy is already on its way and nobody waits for the failure to be detected.
    // (Only copied messages: their bytes stay valid however long the copy takes.)
    if (len <= opt_.hedge_bytes && !m->owned.empty() && m->on_rail[0] >= 0 && !m->done)
      try_send_inline(p, Chunk{m, 0}, lk, true);
    return op;
  }
  for (size_t i = 0; i < m->nchunks; ++i) p.queue.push_back(Chunk{m, uint32_t(i)});
  p.cv.notify_all();
  return op;
}

FrameHeader Transport::start_chunk_locked(Conn& c, const Chunk& chunk, int64_t now, bool hedge) {
  OutMsg& m = *chunk.msg;
  const size_t len = m.chunk_len(chunk.idx);
  m.active_writers++;  // released by finish_chunk_write; the caller's buffer is in use until then
  (hedge ? m.hedge_rail : m.on_rail[chunk.idx]) = int8_t(c.rail);
  c.inflight.emplace_back(m.seq, chunk.idx);
  if (c.inflight_bytes == 0) {
    c.busy_since_ns = now;
    c.busy_periods++;
  }
  c.inflight_bytes += len;
  c.st.chunks_sent++;
  c.st.bytes_sent += len;
  c.last_tx_ns = now;
  return FrameHeader{kFrameMagic, uint32_t(FrameType::kData), m.seq, uint64_t(chunk.idx) * m.chunk, m.len,
                     uint32_t(len), uint32_t(m.chunk), m.call_seq, m.call_desc};
}

std::string Transport::stopped_chunk_reason() const {
  // Why a writer let go of a chunk mid-write (the rail itself was fine).
  return aborted_.load() ? "stopped writing a chunk: the group was aborted"
                         : "abandoned a chunk that another rail delivered first";
}

std::string Transport::write_chunk(Conn& c, int fd, const std::vector<FrameHeader>& frames, const Chunk& chunk,
                                   const std::function<bool()>& stale) {
  // A chunk re-sent elsewhere may be delivered and its message finished while this
  // (suspect) rail is still writing it: stop reading the caller's buffer then. A
  // copied message owns its bytes: it is always written out whole.
  OutMsg& m = *chunk.msg;
  const FrameHeader& h = frames.back();
  const bool owned = !m.owned.empty();
  auto stop = [&] { return stale() || (!owned && (m.done.load() || aborted_.load())); };
  std::string err = writev_full(fd, frames.data(), frames.size() * sizeof(FrameHeader), m.data + h.offset, h.len,
                                kPollMs, stop, sent_progress(c));
  if (err == "stopped" && !stale()) err = stopped_chunk_reason();
  return err;
}

size_t Transport::take_acks_locked(Conn& c, Peer& p, std::vector<FrameHeader>& frames, int64_t now,
                                   size_t max_total) {
  // A suspect rail carries no acks: they would sit in its dead buffers while the
  // sender waits for them.
  const size_t before = frames.size();
  max_total = std::min(max_total, kMaxAcksPerWrite);
  while (!c.suspect && !p.acks.empty() && frames.size() < max_total) {
    const AckItem a = p.acks.front();
    p.acks.pop_front();
    frames.push_back(ctrl_frame(a.all ? FrameType::kAckAll : FrameType::kAck, a.seq, a.idx));
    c.acks_carried.emplace_back(now, a);
  }
  while (!c.acks_carried.empty() && now - c.acks_carried.front().first > kAckMemoryNs) c.acks_carried.pop_front();
  return frames.size() - before;
}

void Transport::finish_chunk_write_locked(const Chunk& chunk) {
  if (--chunk.msg->active_writers == 0 && chunk.msg->done) done_cv_.notify_all();
}

bool Transport::try_send_inline(Peer& p, const Chunk& chunk, std::unique_lock<std::mutex>& lk, bool hedge) {
  const int taken = hedge ? chunk.msg->on_rail[chunk.idx] : -1;  // a hedge copy needs another rail
  Conn* best = nullptr;
  for (auto& c : p.conns)
    if (c->rail != taken && !c->writing && c->inflight_bytes < window_for_locked(*c) && c->ctrl.empty() &&
        c->ctrl_abort.empty() && conn_takes_chunks_locked(*c, p) &&
        (!best || c->inflight_bytes < best->inflight_bytes))
      best = c.get();
  if (!best) return false;
  Conn& c = *best;
  const uint64_t epoch = c.epoch.load();
  const int fd = c.fd;
  const int64_t now = now_ns();
  // Acks owed to this peer ride along: no writer wake-up, no extra segment.
  std::vector<FrameHeader> frames;
  take_acks_locked(c, p, frames, now);
  frames.push_back(start_chunk_locked(c, chunk, now, hedge));
  c.writing = true;
  use_fd_locked(c, fd);
  lk.unlock();
  auto stale = [&] { return stopping_.load() || c.epoch.load() != epoch; };
  std::string err = write_chunk(c, fd, frames, chunk, stale);
  lk.lock();
  c.writing = false;
  finish_chunk_write_locked(chunk);
  release_fd_locked(c, fd);
  if (!err.empty())
    fail_conn_locked(c, epoch, "send to rank " + std::to_string(c.peer) + " on rail" + std::to_string(c.rail) +
                                   " failed: " + err);
  // Wake this peer's writers only when one may have work that waited for the socket.
  if (!err.empty() || !p.queue.empty() || !c.ctrl.empty() || !c.ctrl_abort.empty()) p.cv.notify_all();
  return true;
}

Op Transport::post_recv(int peer, void* buf, size_t len) {
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
bool op_done_locked(const Op& op) {
  return op.done_at_post || (op.out && op.out->done && op.out->active_writers == 0) || (op.in && op.in->done);
}
int op_peer(const Op& op) { return op.out ? op.out->peer : op.in->peer; }
}  // namespace

void Transport::wait(const Op& op) {
  if (op.done_at_post) return;
  wait_ops(&op, 1, nullptr);
}

std::vector<size_t> Transport::wait_some(const std::vector<Op>& ops) {
  if (ops.empty()) throw std::invalid_argument("r2cc: wait_some needs at least one op");
  std::vector<size_t> done;
  wait_ops(ops.data(), ops.size(), &done);
  return done;
}

void Transport::wait_ops(const Op* ops, size_t n, std::vector<size_t>* done) {
  const int64_t start = now_ns();
  const int64_t deadline = start + int64_t(opt_.op_timeout_s * 1e9);
  // What this wait depends on, per peer (bit 0: a receive, bit 1: a send): the path checks run
  // once per peer and wake-up, not once per op (an executor may wait on hundreds).
  std::vector<uint8_t> waits_on(size_t(world_), 0);
  for (size_t i = 0; i < n; ++i) waits_on[size_t(op_peer(ops[i]))] |= ops[i].out ? 2 : 1;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    bool any = false;
    for (size_t i = 0; i < n; ++i)
      if (op_done_locked(ops[i])) {
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
    done_cv_.wait_for(lk, std::chrono::milliseconds(50));
  }
}

// ---- acknowledgements --------------------------------------------------------------

void Transport::enqueue_ack_locked(Peer& p, uint64_t seq, uint64_t idx, bool all, bool urgent) {
  p.acks.push_back(AckItem{seq, idx, all});
  // Acks of small chunks ride on the next write or heartbeat (<= heartbeat_ms):
  // their sender does not wait for them, and waking a writer per tiny message
  // costs more than the message. Large chunks free window space: ack at once.
  if (urgent) p.cv.notify_one();
}

void Transport::on_ack_locked(Peer& p, uint64_t seq, uint64_t idx, bool all) {
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
    done_cv_.notify_all();
  }
  // Freed window space matters only to writers with chunks waiting.
  if (!p.queue.empty()) p.cv.notify_all();
}

void Transport::forget_inflight_locked(Peer& p, int rail, uint64_t seq, uint32_t idx, size_t bytes, int64_t now) {
  Conn& c = *p.conns[rail];
  auto f = std::find(c.inflight.begin(), c.inflight.end(), std::make_pair(seq, idx));
  if (f == c.inflight.end()) return;
  c.inflight.erase(f);
  c.inflight_bytes -= bytes;
  c.acked_bytes += bytes;
  if (c.inflight.empty()) {
    c.busy_ns += now - c.busy_since_ns;
    c.busy_since_ns = 0;
    if (c.state == RailState::kDraining) c.state = RailState::kDrained;
  }
}

void Transport::finish_in_locked(Peer& p, InMsg& m) {
  if (!p.is_done(m.seq)) p.mark_done(m.seq);
  if (!m.posted) return;  // complete in the stash; post_recv copies it out
  if (m.data != m.user) std::memcpy(m.user, m.data, m.len);
  m.done = true;
  p.in.erase(m.seq);
  done_cv_.notify_all();
}

// ---- writer ----------------------------------------------------------------

size_t Transport::window_for_locked(const Conn& c) const {
  // A slow rail gets a window of ~10 ms of its own measured bandwidth (at least one
  // chunk): it then holds few bytes when a message ends, so it does not become the
  // straggler that every collective waits for.
  if (c.st.bandwidth_Bps <= 0) return opt_.window_bytes;
  const size_t w = size_t(c.st.bandwidth_Bps * 0.010);
  return std::max(opt_.chunk_bytes, std::min(w, opt_.window_bytes));
}

bool Transport::conn_takes_chunks_locked(const Conn& c, const Peer& p) const {
  // Preference: an undrained primary rail; else a drained primary rail (the
  // operator drained them all, traffic must still flow); else a fallback rail.
  const int primaries = num_rails() - opt_.fallback_rails;
  auto usable = [](const Conn& x) { return x.state == RailState::kUp && !x.peer_drained && !x.suspect; };
  auto alive = [](const Conn& x) { return is_connected(x.state) && !x.suspect; };
  if (!alive(c)) return false;
  const bool primary = c.rail < primaries;
  if (primary && usable(c)) return true;
  for (int r = 0; r < primaries; ++r)
    if (usable(*p.conns[r])) return false;
  if (primary) return true;
  for (int r = 0; r < primaries; ++r)
    if (alive(*p.conns[r])) return false;
  return true;
}

void Transport::writer_loop(Conn& c) {
  Peer& p = *peers_[c.peer];
  std::vector<FrameHeader> frames;
  std::string abort_reason;
  ErrorKind abort_kind = ErrorKind::kAborted;
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    if (!is_connected(c.state)) {
      p.cv.wait_for(lk, std::chrono::milliseconds(20));
      continue;
    }
    const uint64_t epoch = c.epoch.load();
    const int fd = c.fd;
    use_fd_locked(c, fd);
    auto stale = [&] { return stopping_.load() || c.epoch.load() != epoch; };
    while (!stale()) {
      if (c.writing) {  // an inline sender owns the socket right now
        p.cv.wait_for(lk, std::chrono::milliseconds(1));
        continue;
      }
      const int64_t now = now_ns();
      frames.clear();
      abort_reason.swap(c.ctrl_abort);
      c.ctrl_abort.clear();
      if (!abort_reason.empty()) abort_kind = error_kind_;
      while (!c.ctrl.empty()) {
        frames.push_back(c.ctrl.front());
        c.ctrl.pop_front();
      }
      take_acks_locked(c, p, frames, now);
      // Next chunk, if the window allows; chunks acked meanwhile are dropped from the queue.
      Chunk chunk;
      if (error_.empty() && c.inflight_bytes < window_for_locked(c) && conn_takes_chunks_locked(c, p)) {
        while (!p.queue.empty()) {
          Chunk ch = p.queue.front();
          p.queue.pop_front();
          if (!ch.msg->done && !ch.msg->acked[ch.idx]) {
            chunk = ch;
            break;
          }
        }
      }
      if (frames.empty() && !chunk.msg && abort_reason.empty()) {
        // Nothing to write. Work arrives with a notify; acks owed to the peer ride on the
        // watchdog's heartbeats, so an idle writer need not wake every heartbeat period
        // (it did, and spun in 0.1 ms steps until the heartbeat went out).
        p.cv.wait_for(lk, std::chrono::milliseconds(kIdleWriterWaitMs));
        continue;
      }
      // Control frames go first; the chunk's header closes them unless an abort
      // reason (with its own payload) has to go in between.
      std::vector<FrameHeader> tail;
      if (chunk.msg) (abort_reason.empty() ? frames : tail).push_back(start_chunk_locked(c, chunk, now));
      c.last_tx_ns = now;
      c.writing = true;
      lk.unlock();
      std::string err;
      // With a chunk attached the caller's buffer is pinned (active_writers) from here
      // on: give up as soon as its message is done elsewhere, even before the chunk.
      auto stale_or_done = [&] { return stale() || (chunk.msg && chunk.msg->done.load()); };
      if (chunk.msg && abort_reason.empty()) {
        err = write_chunk(c, fd, frames, chunk, stale);
      } else {
        if (!frames.empty())
          err = write_full(fd, frames.data(), frames.size() * sizeof(FrameHeader), kPollMs, stale_or_done,
                           sent_progress(c));
        if (err.empty() && !abort_reason.empty()) {
          FrameHeader ah = ctrl_frame(FrameType::kAbort, 0, uint64_t(abort_kind),
                                      uint32_t(std::min<size_t>(abort_reason.size(), kMaxAbortReason)));
          err = writev_full(fd, &ah, sizeof(ah), abort_reason.data(), ah.len, kPollMs, stale_or_done);
        }
        if (err == "stopped" && !stale()) err = stopped_chunk_reason();
        if (err.empty() && chunk.msg) err = write_chunk(c, fd, tail, chunk, stale);
      }
      lk.lock();
      c.writing = false;
      if (chunk.msg) finish_chunk_write_locked(chunk);
      if (err.empty() && chunk.msg && c.fail_after_chunks > 0 && --c.fail_after_chunks == 0) {
        c.fail_after_chunks = -1;
        err = "injected failure (test)";
      }
      if (!err.empty()) {
        fail_conn_locked(c, epoch,
                         "send to rank " + std::to_string(c.peer) + " on rail" + std::to_string(c.rail) + " failed: " + err);
        break;
      }
    }
    release_fd_locked(c, fd);
  }
}

// ---- reader ----------------------------------------------------------------

void Transport::reader_loop(Conn& c) {
  Peer& p = *peers_[c.peer];
  std::vector<char> scratch;
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    if (!is_connected(c.state)) {
      p.cv.wait_for(lk, std::chrono::milliseconds(20));
      continue;
    }
    const uint64_t epoch = c.epoch.load();
    const int fd = c.fd;
    use_fd_locked(c, fd);
    lk.unlock();
    auto stale = [&] { return stopping_.load() || c.epoch.load() != epoch; };
    auto progress = [&] { c.last_rx_ns.store(now_ns()); };
    std::string err;
    while (err.empty() && !stale()) {
      FrameHeader h;
      err = read_full(fd, &h, sizeof(h), kPollMs, stale, progress);
      if (!err.empty()) break;
      if (h.magic != kFrameMagic) {
        err = "corrupt frame (bad magic)";
        break;
      }
      switch (FrameType(h.type)) {
        case FrameType::kData:
          err = read_data(c, epoch, fd, h, scratch);
          break;
        case FrameType::kAck:
        case FrameType::kAckAll: {
          std::lock_guard<std::mutex> g(mu_);
          on_ack_locked(p, h.seq, h.offset, FrameType(h.type) == FrameType::kAckAll);
          break;
        }
        case FrameType::kHeartbeat: {
          // Echo a few per second (the RTT estimate needs no more): an echo per heartbeat
          // woke this rail's writer and the peer's reader 200 times a second for nothing.
          const int64_t sent = int64_t(h.offset);
          if (sent - c.last_echoed_ns < kEchoEveryNs && sent >= c.last_echoed_ns) break;
          std::lock_guard<std::mutex> g(mu_);
          c.last_echoed_ns = sent;
          if (c.epoch.load() == epoch) c.ctrl.push_back(ctrl_frame(FrameType::kHeartbeatEcho, 0, h.offset));
          p.cv.notify_all();
          break;
        }
        case FrameType::kHeartbeatEcho: {
          double rtt = double(now_ns() - int64_t(h.offset)) * 1e-9;
          std::lock_guard<std::mutex> g(mu_);
          c.st.rtt_s = c.st.rtt_s == 0 ? rtt : 0.8 * c.st.rtt_s + 0.2 * rtt;
          break;
        }
        case FrameType::kAbort: {
          std::string reason(std::min(h.len, kMaxAbortReason), '\0');
          err = read_full(fd, reason.data(), reason.size(), kPollMs, stale, progress);
          if (err.empty()) {
            std::lock_guard<std::mutex> g(mu_);
            set_error_locked(error_kind_from_wire(h.offset), reason);
          }
          break;
        }
        case FrameType::kGoodbye: {
          std::lock_guard<std::mutex> g(mu_);
          peer_closed_locked(p);
          break;
        }
        case FrameType::kDrain:
        case FrameType::kUndrain: {
          // The peer drained (or undrained) its end of this rail: the link is out of
          // use in both directions, and this side's state says so too.
          std::lock_guard<std::mutex> g(mu_);
          c.peer_drained = FrameType(h.type) == FrameType::kDrain;
          if (c.peer_drained && c.state == RailState::kUp)
            c.state = c.inflight.empty() ? RailState::kDrained : RailState::kDraining;
          else if (!c.peer_drained && !rail_drained_[c.rail] &&
                   (c.state == RailState::kDraining || c.state == RailState::kDrained))
            c.state = RailState::kUp;
          p.cv.notify_all();
          break;
        }
        default:
          err = "corrupt frame (unknown type " + std::to_string(h.type) + ")";
      }
    }
    lk.lock();
    if (!err.empty() && err != "stopped")
      fail_conn_locked(c, epoch, "receive from rank " + std::to_string(c.peer) + " on rail" + std::to_string(c.rail) +
                                     " failed: " + err);
    release_fd_locked(c, fd);
  }
}

std::string Transport::read_data(Conn& c, uint64_t epoch, int fd, const FrameHeader& h, std::vector<char>& scratch) {
  Peer& p = *peers_[c.peer];
  auto stale = [&] { return stopping_.load() || c.epoch.load() != epoch; };
  auto progress = [&] { c.last_rx_ns.store(now_ns()); };
  if (h.chunk_bytes == 0 || h.offset % h.chunk_bytes != 0 || h.offset + h.len > h.total)
    return "corrupt data frame (offset/length out of range)";
  const size_t idx = h.offset / h.chunk_bytes;
  const bool urgent = h.total > opt_.small_msg_bytes;
  std::shared_ptr<InMsg> m;
  char* dest = nullptr;  // set when this reader claimed the chunk
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!p.is_done(h.seq)) {
      auto& slot = p.in[h.seq];
      if (!slot) {  // arrived before the receive was posted: keep it in a stash
        slot = std::make_shared<InMsg>();
        slot->peer = c.peer;
        slot->seq = h.seq;
        slot->len = h.total;
        slot->stash.reset(new char[h.total]);  // not zero-filled: every byte will be written
        slot->data = slot->stash.get();
      }
      m = slot;
      if (!m->known) {
        m->sent_seq = h.call_seq;
        m->sent_desc = h.call_desc;
        check_call_locked(p, *m);  // on a mismatch the group aborts: nothing below claims the chunk
      }
      if (error_.empty() && m->len != h.total) {
        set_error_locked(ErrorKind::kCallMismatch,
                         "r2cc: rank " + std::to_string(c.peer) + " sent " + std::to_string(h.total) +
                             " bytes but rank " + std::to_string(rank_) + " expected " + std::to_string(m->len) +
                             " (the ranks called different collectives or shapes)");
        return "message size mismatch";
      }
      if (!m->known) {
        m->known = true;
        m->chunk = h.chunk_bytes;
        m->nchunks = num_chunks(m->len, m->chunk);
        m->state.assign(m->nchunks, kChunkNone);
        m->superseded.reset(new std::atomic<bool>[m->nchunks]);
        for (size_t i = 0; i < m->nchunks; ++i) m->superseded[i] = false;
      }
      if (m->chunk != h.chunk_bytes || idx >= m->nchunks) return "corrupt data frame (chunking changed)";
      if (m->state[idx] == kChunkNone && !aborted_) {
        m->state[idx] = kChunkClaimed;
        m->active_readers++;
        dest = m->data + h.offset;
      }
    }
  }
  std::string err;
  if (dest) {
    // Straight into the destination, unless another rail completes this chunk first
    // (this rail fell silent mid-chunk): then the rest of the frame goes aside.
    auto superseded = [&] { return stale() || m->superseded[idx].load() || aborted_.load(); };
    size_t got = 0;
    err = read_full(fd, dest, h.len, kPollMs, superseded, progress, &got);
    if (err == "stopped" && !stale()) {
      {
        // Out of the buffer first (the message may complete now), then keep the
        // stream in step: what is left of this frame, if it ever comes, goes aside.
        std::lock_guard<std::mutex> g(mu_);
        release_reader_locked(p, *m);
      }
      if (scratch.size() < h.len) scratch.resize(h.len);
      err = read_full(fd, scratch.data(), h.len - got, kPollMs, stale, progress);
      std::lock_guard<std::mutex> g(mu_);
      c.st.bytes_recv += err.empty() ? h.len : 0;
      return err;
    }
  } else {
    if (scratch.size() < h.len) scratch.resize(h.len);
    err = read_full(fd, scratch.data(), h.len, kPollMs, stale, progress);
  }
  std::lock_guard<std::mutex> g(mu_);
  c.st.bytes_recv += err.empty() ? h.len : 0;
  if (!m) {  // whole message already complete: only re-acknowledge
    if (err.empty()) enqueue_ack_locked(p, h.seq, idx, false, urgent);
    return err;
  }
  auto complete_chunk = [&] {
    m->state[idx] = kChunkDone;
    m->nrecv++;
    enqueue_ack_locked(p, h.seq, idx, false, urgent);
  };
  if (dest) {
    if (m->state[idx] == kChunkClaimed) {
      if (err.empty()) complete_chunk();
      else m->state[idx] = kChunkNone;  // the sender re-sends it on another rail
    }
    release_reader_locked(p, *m);
    return err;
  }
  if (!err.empty() || aborted_) return err;  // after an abort the buffer may be gone
  if (m->state[idx] == kChunkDone) {
    enqueue_ack_locked(p, h.seq, idx, false, urgent);  // duplicate: the sender may have lost the first ack
  } else {
    // First complete copy. If a reader holds the claim it is stuck mid-chunk on a
    // silent rail: this copy wins (same bytes) and that reader is told to stand aside.
    std::memcpy(m->data + h.offset, scratch.data(), h.len);
    if (m->state[idx] == kChunkClaimed) m->superseded[idx] = true;
    complete_chunk();
    if (m->nrecv == m->nchunks && m->active_readers == 0) finish_in_locked(p, *m);
  }
  return err;
}

void Transport::release_reader_locked(Peer& p, InMsg& m) {
  // The message is finished only when no reader can still write into its buffer.
  if (--m.active_readers == 0 && m.known && m.nrecv == m.nchunks && !m.done) finish_in_locked(p, m);
}

}  // namespace r2cc
