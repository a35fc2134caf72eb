// One connection's bytes: its writer loop (control frames, acks, chunks as the window
// allows), its reader loop (frames in, chunks straight into their buffers) and the helpers
// both share with the inline sender in posting.cc.
//
// Contract: only these loops and the inline sender touch a connected socket, at most one
// writer at a time (Conn::writing); no loop holds the transport lock while it blocks on the
// socket. An I/O error fails the rail (fail_conn_locked), never the group; a stale loop (the
// socket was replaced or failed: the epoch moved on) stands down without touching the Conn.
#include <algorithm>
#include <cstring>

#include "net.h"
#include "transport_internal.h"

namespace r2cc {

namespace {
constexpr int kPollMs = 10;
// Chunk payloads from this size are read in bulk (read_full's lowat_cap): fewer wake-ups.
constexpr size_t kBulkReadBytes = 32 * 1024;
constexpr size_t kBulkLowatCap = 128 * 1024;

constexpr size_t kMaxAcksPerWrite = 512;
constexpr int64_t kAckMemoryNs = 2000000000LL;  // acks a dead rail may have swallowed
constexpr uint32_t kMaxAbortReason = 4096;
constexpr int kIdleWriterWaitMs = 100;
constexpr int64_t kEchoEveryNs = 100000000;  // heartbeat echoes (RTT samples): ~10 per second per rail
}  // namespace

std::function<void()> Transport::sent_progress(Conn& c) const {
  const int64_t pause_ns = int64_t(opt_.rail_timeout_ms) * 1000000 / 2;
  return [&c, pause_ns] { c.note_tx(now_ns(), pause_ns); };
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
    frames.push_back(control_frame(a.all ? FrameType::kAckAll : FrameType::kAck, a.seq, a.idx));
    c.acks_carried.emplace_back(now, a);
  }
  while (!c.acks_carried.empty() && now - c.acks_carried.front().first > kAckMemoryNs) c.acks_carried.pop_front();
  return frames.size() - before;
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

void Transport::serve_connection(Conn& c, const std::function<void(std::unique_lock<std::mutex>&, uint64_t, int)>& session) {
  Peer& p = *peers_[c.peer];
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    if (!is_connected(c.state)) {
      p.cv.wait_for(lk, std::chrono::milliseconds(20));
      continue;
    }
    const uint64_t epoch = c.epoch.load();
    const int fd = c.fd;
    use_fd_locked(c, fd);  // the socket stays open while the session may use it
    session(lk, epoch, fd);
    release_fd_locked(c, fd);
  }
}

void Transport::writer_loop(Conn& c) {
  Peer& p = *peers_[c.peer];
  std::vector<FrameHeader> frames;
  std::string abort_reason;
  ErrorKind abort_kind = ErrorKind::kAborted;
  serve_connection(c, [&](std::unique_lock<std::mutex>& lk, uint64_t epoch, int fd) {
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
          FrameHeader ah = control_frame(FrameType::kAbort, 0, uint64_t(abort_kind),
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
  });
}

// ---- reader ----------------------------------------------------------------

void Transport::reader_loop(Conn& c) {
  Peer& p = *peers_[c.peer];
  std::vector<char> scratch;
  serve_connection(c, [&](std::unique_lock<std::mutex>& lk, uint64_t epoch, int fd) {
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
          if (c.epoch.load() == epoch) c.ctrl.push_back(control_frame(FrameType::kHeartbeatEcho, 0, h.offset));
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
  });
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
  const size_t bulk = h.len >= kBulkReadBytes ? kBulkLowatCap : 0;
  if (dest) {
    // Straight into the destination, unless another rail completes this chunk first
    // (this rail fell silent mid-chunk): then the rest of the frame goes aside.
    auto superseded = [&] { return stale() || m->superseded[idx].load() || aborted_.load(); };
    size_t got = 0;
    err = read_full(fd, dest, h.len, kPollMs, superseded, progress, &got, bulk);
    if (err == "stopped" && !stale()) {
      {
        // Out of the buffer first (the message may complete now), then keep the
        // stream in step: what is left of this frame, if it ever comes, goes aside.
        std::lock_guard<std::mutex> g(mu_);
        release_reader_locked(p, *m);
      }
      if (scratch.size() < h.len) scratch.resize(h.len);
      err = read_full(fd, scratch.data(), h.len - got, kPollMs, stale, progress, nullptr, bulk);
      std::lock_guard<std::mutex> g(mu_);
      c.st.bytes_recv += err.empty() ? h.len : 0;
      return err;
    }
  } else {
    if (scratch.size() < h.len) scratch.resize(h.len);
    err = read_full(fd, scratch.data(), h.len, kPollMs, stale, progress, nullptr, bulk);
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

}  // namespace r2cc
