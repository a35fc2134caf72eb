// One connection's outgoing bytes: its writer loop (control frames, acks, chunks as the window
// allows) and the helpers it shares with the inline sender in posting.cc. (Incoming bytes:
// rx_loop.cc.)
//
// Contract: only the writer loop and the inline sender write to a connected socket, at most one
// at a time (Conn::writing); neither holds the transport lock while it blocks on the socket.
// An I/O error fails the rail (fail_conn_locked), never the group; a stale loop (the socket was
// replaced or failed: the epoch moved on) stands down without touching the Conn.
#include <algorithm>
#include <cstring>

#include "net.h"
#include "transport_internal.h"

namespace r2cc {

namespace {
constexpr int kPollMs = 10;

constexpr size_t kMaxAcksPerWrite = 512;
constexpr int64_t kAckMemoryNs = 2000000000LL;  // acks a dead rail may have swallowed
// Work reaches a writer with a notify; this wait is only a backstop. At 100 ms each idle rail's
// writer woke 10 times a second, and on a busy host each wake-up preempted some caller.
constexpr int kIdleWriterWaitMs = 1000;
}  // namespace

std::function<void()> TransportImpl::sent_progress(Conn& c) const {
  const int64_t pause_ns = int64_t(opt_.rail_timeout_ms) * 1000000 / 2;
  return [&c, pause_ns] { c.note_tx(now_ns(), pause_ns); };
}

FrameHeader TransportImpl::start_chunk_locked(Conn& c, const Chunk& chunk, int64_t now, bool hedge) {
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

std::string TransportImpl::stopped_chunk_reason() const {
  // Why a writer let go of a chunk mid-write (the rail itself was fine).
  return aborted_.load() ? "stopped writing a chunk: the group was aborted"
                         : "abandoned a chunk that another rail delivered first";
}

std::string TransportImpl::send_failed(const Conn& c, const std::string& why) {
  return "send to rank " + std::to_string(c.peer) + " on rail" + std::to_string(c.rail) + " failed" +
         (why.empty() ? "" : ": " + why);
}

TransportImpl::Chunk TransportImpl::pop_live_chunk_locked(Peer& p) {
  while (!p.queue.empty()) {
    Chunk ch = p.queue.front();
    p.queue.pop_front();
    if (!ch.msg->done && !ch.msg->acked[ch.idx]) return ch;
  }
  return Chunk{};
}

IoResult TransportImpl::write_chunk(Conn& c, int fd, const std::vector<FrameHeader>& frames, const Chunk& chunk,
                                const std::function<bool()>& stale, size_t* done, bool may_block) {
  // A chunk re-sent elsewhere may be delivered and its message finished while this
  // (suspect) rail is still writing it: stop reading the caller's buffer then. A
  // copied message owns its bytes: it is always written out whole.
  OutMsg& m = *chunk.msg;
  const FrameHeader& h = frames.back();
  const bool owned = !m.owned.empty();
  auto stop = [&] { return stale() || (!owned && (m.done.load() || aborted_.load())); };
  const char* a = reinterpret_cast<const char*>(frames.data());
  size_t na = frames.size() * sizeof(FrameHeader);
  const char* b = m.data + h.offset;
  size_t nb = h.len;
  const size_t skip = done ? *done : 0;  // resuming a chunk another thread began
  if (skip < na) {
    a += skip;
    na -= skip;
  } else {
    b += skip - na;
    nb -= skip - na;
    na = 0;
  }
  IoResult r = io_->write_full(fd, a, na, b, nb, may_block ? kPollMs : 0, stop, sent_progress(c), done);
  if (r.status == IoStatus::kStopped && !stale()) r = IoResult::failure(IoCause::kOther, stopped_chunk_reason());
  return r;
}

size_t TransportImpl::take_acks_locked(Conn& c, Peer& p, std::vector<FrameHeader>& frames, int64_t now,
                                   size_t max_total) {
  // A suspect rail carries no acks: they would sit in its dead buffers while the
  // sender waits for them. Nor does a held one (flapping or lossy: an ack lost there waits for a
  // retransmission timeout, the sender's window with it) while another rail to the peer is up.
  const size_t before = frames.size();
  max_total = std::min(max_total, kMaxAcksPerWrite);
  const bool held_elsewhere_up =
      c.state == RailState::kHeld &&
      std::any_of(p.conns.begin(), p.conns.end(), [](const auto& o) { return o->state == RailState::kUp && !o->suspect; });
  while (!c.suspect && !held_elsewhere_up && !p.acks.empty() && frames.size() < max_total) {
    const AckItem a = p.acks.front();
    p.acks.pop_front();
    frames.push_back(control_frame(a.all ? FrameType::kAckAll : FrameType::kAck, a.seq, a.idx));
    c.acks_carried.emplace_back(now, a);
  }
  while (!c.acks_carried.empty() && now - c.acks_carried.front().first > kAckMemoryNs) c.acks_carried.pop_front();
  return frames.size() - before;
}

size_t TransportImpl::send_room_locked(const Conn& c, size_t want) const {
  // The socket holds at most what this rank wrote on it that the peer has not acknowledged
  // (inflight_bytes) plus frames and headers (kUnbookedBytes). Where that leaves `want`, the
  // kernel need not be asked: it cost two system calls per chunk and per ack sent.
  const size_t booked = c.inflight_bytes + kUnbookedBytes;
  if (c.sndbuf > 0 && size_t(c.sndbuf) >= booked + want) return size_t(c.sndbuf) - booked;
  return size_t(std::max(0, io_->send_space(c.fd, c.sndbuf)));
}

int TransportImpl::send_frames_now_locked(Conn& c, Peer& p, const FrameHeader& lead, int64_t now) {
  if (!is_connected(c.state) || c.writing) return 0;
  constexpr size_t kSlack = 4096;
  const size_t room = send_room_locked(c, kSlack + kMaxAcksPerWrite * sizeof(FrameHeader));
  if (room < kSlack + sizeof(FrameHeader)) return 0;
  std::vector<FrameHeader> frames;
  if (lead.magic == kFrameMagic) frames.push_back(lead);
  const size_t acks = take_acks_locked(c, p, frames, now, (room - kSlack) / sizeof(FrameHeader));
  if (frames.empty()) return 1;
  const IoResult r = io_->send_small_nonblocking(c.fd, frames.data(), frames.size() * sizeof(FrameHeader));
  if (r.ok()) {
    c.last_tx_ns = now;
    c.note_tx(now, int64_t(opt_.rail_timeout_ms) * 1000000 / 2);
    return 1;
  }
  if (r.status == IoStatus::kBlocked) {  // nothing left: the acks go back in front, in order
    for (size_t i = frames.size(); i-- > frames.size() - acks;) {
      p.acks.push_front(c.acks_carried.back().second);
      c.acks_carried.pop_back();
    }
    return 0;
  }
  // Bytes from the peer still wait unread: its reader goes first. A peer that said goodbye and
  // closed resets the connection when our heartbeat or probe meets its closed socket, and the
  // goodbye in our receive queue must be read as such, not lost under a send failure.
  if (io_->bytes_readable(c.fd) > 0) return 0;
  // The message names no reason (as before); the cause still tells the detector what happened:
  // a heartbeat to a peer whose process died is often the first write to meet the reset.
  fail_conn_locked(c, c.epoch.load(), r.cause, send_failed(c, ""));
  return -1;
}

// ---- writer ----------------------------------------------------------------

size_t TransportImpl::window_for_locked(const Conn& c) const {
  // A slow rail gets a window of ~10 ms of its own measured bandwidth (at least one
  // chunk): it then holds few bytes when a message ends, so it does not become the
  // straggler that every collective waits for. A chunk is ~8 ms of the slowest rail
  // (bulk_chunk_locked), so a measured slow rail keeps two in flight; a fast one stops at
  // window_bytes (1 MiB: a 4 MiB cap cost 2 hosts 8-11% of busbw). An unmeasured one holds a
  // few small chunks: it may be slow, and a deep queue delays its heartbeats and acks.
  const size_t grain = chunk_grain();
  if (c.st.bandwidth_Bps <= 0) return std::min(opt_.window_bytes, 4 * grain);
  const size_t w = size_t(c.st.bandwidth_Bps * 0.010);
  return std::max(grain, std::min(w, opt_.window_bytes));
}

size_t TransportImpl::bulk_chunk_locked(const Peer& p) const {
  // Per chunk the transport pays a frame, an ack and a few thread wake-ups, so large chunks
  // cost less CPU per byte (1 MiB instead of 256 KiB: ~6% less per byte at 4 hosts). But
  // every message waits for its last chunk, and on a slow rail a large one arrives last
  // (1 MiB at 100mbit is 84 ms). So: a rail to p much slower than p's fastest (the admin
  // API's slow-rail bar, 1/4), or one not measured yet, keeps the small chunk; otherwise a
  // chunk carries ~kChunkTimeMs of the slowest rail as a whole (its connections to every
  // peer together: they split the rail, and one peer's connection gets all of it as the
  // others finish).
  const size_t grain = chunk_grain();
  if (grain >= opt_.chunk_bytes) return opt_.chunk_bytes;
  double slowest = 0, fastest = 0, slowest_rail = 0;
  for (auto& c : p.conns) {
    if (!conn_takes_chunks_locked(*c, p)) continue;
    const double bw = c->st.bandwidth_Bps;
    if (bw <= 0) return grain;
    slowest = slowest == 0 ? bw : std::min(slowest, bw);
    fastest = std::max(fastest, bw);
    double rail = 0;
    for (auto& q : peers_)
      if (q->rank != rank_) rail += q->conns[c->rail]->st.bandwidth_Bps;
    slowest_rail = slowest_rail == 0 ? rail : std::min(slowest_rail, rail);
  }
  if (slowest < fastest / 4) return grain;
  const size_t fits = size_t(slowest_rail * kChunkTimeMs * 1e-3) / grain * grain;  // whole grains
  return std::min(opt_.chunk_bytes, std::max(grain, fits));
}

double TransportImpl::chunk_cost_bytes_locked(const Peer& p) const {
  double slowest = 0;
  for (auto& c : p.conns) {
    if (!conn_takes_chunks_locked(*c, p)) continue;
    const double bw = c->st.bandwidth_Bps;
    if (bw <= 0) return kAssumedChunkCostBytes;
    slowest = slowest == 0 ? bw : std::min(slowest, bw);
  }
  return slowest * kChunkCostUs * 1e-6;
}

int TransportImpl::rails_taking_chunks_locked(const Peer& p) const {
  int n = 0;
  for (auto& c : p.conns) n += conn_takes_chunks_locked(*c, p);
  return n > 0 ? n : num_rails();  // none now (all down): cut as if every rail comes back
}

bool TransportImpl::conn_takes_chunks_locked(const Conn& c, const Peer& p) const {
  // Preference: an undrained primary rail; else a drained primary rail (the
  // operator drained them all, traffic must still flow); else a fallback rail.
  const int primaries = num_rails() - opt_.fallback_rails;
  auto usable = [](const Conn& x) { return x.state == RailState::kUp && !x.peer_drained && !x.suspect && x.proven; };
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

void TransportImpl::serve_connection(Conn& c, const std::function<void(std::unique_lock<std::mutex>&, uint64_t, int)>& session) {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    if (!is_connected(c.state)) {
      c.cv.wait_for(lk, std::chrono::milliseconds(20));
      continue;
    }
    const uint64_t epoch = c.epoch.load();
    const int fd = c.fd;
    use_fd_locked(c, fd);  // the socket stays open while the session may use it
    session(lk, epoch, fd);
    release_fd_locked(c, fd);
  }
}

void TransportImpl::writer_loop(Conn& c) {
  Peer& p = *peers_[c.peer];
  WriterBatch b;  // kept across passes: its frame vector keeps its capacity
  serve_connection(c, [&](std::unique_lock<std::mutex>& lk, uint64_t epoch, int fd) {
    auto stale = [&] { return stopping_.load() || c.epoch.load() != epoch; };
    while (!stale()) {
      if (c.handoff && c.handoff->epoch == epoch) {
        if (!writer_finish_handoff(c, epoch, fd, lk, stale)) break;
        continue;
      }
      if (c.writing) {  // an inline sender owns the socket right now
        c.cv.wait_for(lk, std::chrono::milliseconds(1));
        continue;
      }
      const int64_t now = now_ns();
      if (!writer_gather_locked(c, p, b, now)) {
        // Nothing to write. Work arrives with a notify; acks owed to the peer ride on the
        // watchdog's heartbeats, so an idle writer need not wake every heartbeat period
        // (it did, and spun in 0.1 ms steps until the heartbeat went out).
        c.cv.wait_for(lk, std::chrono::milliseconds(kIdleWriterWaitMs));
        continue;
      }
      c.last_tx_ns = now;
      c.writing = true;
      lk.unlock();
      IoResult r = writer_write(c, fd, b, stale);
      lk.lock();
      c.writing = false;
      if (b.chunk.msg) {
        finish_chunk_write_locked(b.chunk);
        if (r.ok() && c.injected_failure_due()) r = c.injected_failure();
      }
      b.chunk = Chunk{};  // written: the writer keeps no hold on its message
      if (!r.ok()) {
        fail_conn_locked(c, epoch, r.cause, send_failed(c, r.text()));
        break;
      }
    }
  });
}

bool TransportImpl::writer_finish_handoff(Conn& c, uint64_t epoch, int fd, std::unique_lock<std::mutex>& lk,
                                      const std::function<bool()>& stale) {
  std::unique_ptr<Conn::Handoff> h = std::move(c.handoff);
  lk.unlock();
  IoResult r = write_chunk(c, fd, h->frames, h->chunk, stale, &h->done);
  lk.lock();
  c.writing = false;
  finish_chunk_write_locked(h->chunk);
  if (r.ok() && c.injected_failure_due()) r = c.injected_failure();
  if (r.ok()) return true;
  fail_conn_locked(c, epoch, r.cause, send_failed(c, r.text()));
  return false;
}

bool TransportImpl::writer_gather_locked(Conn& c, Peer& p, WriterBatch& b, int64_t now) {
  b.frames.clear();
  b.tail.clear();
  b.abort_reason.swap(c.ctrl_abort);
  c.ctrl_abort.clear();
  if (!b.abort_reason.empty()) b.abort_kind = error_kind_;
  while (!c.ctrl.empty()) {
    b.frames.push_back(c.ctrl.front());
    c.ctrl.pop_front();
  }
  take_acks_locked(c, p, b.frames, now);
  // Next chunk, if the window allows; chunks acked meanwhile are dropped from the queue.
  b.chunk = Chunk{};
  if (error_.empty() && c.inflight_bytes < window_for_locked(c) && conn_takes_chunks_locked(c, p))
    b.chunk = pop_live_chunk_locked(p);
  if (b.frames.empty() && !b.chunk.msg && b.abort_reason.empty()) return false;
  // Control frames go first; the chunk's header closes them unless an abort
  // reason (with its own payload) has to go in between.
  if (b.chunk.msg) {
    (b.abort_reason.empty() ? b.frames : b.tail).push_back(start_chunk_locked(c, b.chunk, now));
    counters_.writer_chunks++;
  }
  return true;
}

IoResult TransportImpl::writer_write(Conn& c, int fd, const WriterBatch& b, const std::function<bool()>& stale) {
  if (b.chunk.msg && b.abort_reason.empty()) return write_chunk(c, fd, b.frames, b.chunk, stale);
  // With a chunk attached the caller's buffer is pinned (active_writers) from here
  // on: give up as soon as its message is done elsewhere, even before the chunk.
  auto stale_or_done = [&] { return stale() || (b.chunk.msg && b.chunk.msg->done.load()); };
  IoResult r;
  if (!b.frames.empty())
    r = io_->write_full(fd, b.frames.data(), b.frames.size() * sizeof(FrameHeader), nullptr, 0, kPollMs,
                        stale_or_done, sent_progress(c));
  if (r.ok() && !b.abort_reason.empty()) {
    FrameHeader ah = control_frame(FrameType::kAbort, 0, uint64_t(b.abort_kind),
                                   uint32_t(std::min<size_t>(b.abort_reason.size(), kMaxAbortReason)));
    r = io_->write_full(fd, &ah, sizeof(ah), b.abort_reason.data(), ah.len, kPollMs, stale_or_done);
  }
  if (r.status == IoStatus::kStopped && !stale()) r = IoResult::failure(IoCause::kOther, stopped_chunk_reason());
  if (r.ok() && b.chunk.msg) r = write_chunk(c, fd, b.tail, b.chunk, stale);
  return r;
}

}  // namespace r2cc
