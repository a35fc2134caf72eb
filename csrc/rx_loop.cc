// The receive side of every connection of the rank: one epoll set, one receive thread.
//
// Each installed socket has an RxStream: a frame parser that keeps its place across calls, so
// a thread handles whatever bytes are in the kernel and moves on (it never waits for the rest
// of a frame). A stream's epoll registration is one-shot: the thread that took its event owns
// the stream (busy) until it re-arms it, so one stream is never read by two threads. This
// replaced a reader thread per connection (at 4 hosts x 4 rails, 12 readers per rank, each
// waking per arriving segment and every 10 ms when idle).
//
// Contract: handlers never block and never hold mu_ while in recv(); an I/O error fails the
// rail (fail_conn_locked), never the group. A stream whose socket was failed or replaced (the
// epoch moved on) is retired by the next thread that sees it: its chunk claim released, its
// registration removed, its socket released. Chunks go straight into the receiver's buffer
// when they can (or a stash before the receive is posted), as before.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "net.h"
#include "transport_internal.h"

namespace r2cc {

namespace {
constexpr int64_t kEchoEveryNs = 100000000;  // heartbeat echoes (RTT samples): ~10 per second per rail
// A handler moves at most this much before re-arming, so one busy rail cannot hold a thread.
constexpr size_t kRxBudgetBytes = 1 << 20;
constexpr int kIdleWaitMs = 100;
// A caller that stopped driving this long ago is not coming back soon: the receive thread
// takes over (acks, heartbeats, control frames and early data do not wait longer than this).
constexpr int64_t kRxReadmitNs = 10000000;

// The parser's word on a complete frame ("" or why it is corrupt) as an I/O result: a corrupt
// frame leaves the stream out of step, so the rail fails as on a socket error.
IoResult frame_verdict(std::string bad) {
  return bad.empty() ? IoResult{} : IoResult::failure(IoCause::kOther, std::move(bad));
}
}  // namespace

void TransportImpl::rx_start_locked(Conn& c, int fd) {
  auto s = std::make_unique<RxStream>();
  s->conn = &c;
  s->fd = fd;
  s->epoch = c.epoch.load();
  use_fd_locked(c, fd);  // released when the stream retires
  c.rx = s.get();
  rx_arm_locked(*s, true);
  rx_streams_.push_back(std::move(s));
}

void TransportImpl::rx_arm_locked(RxStream& s, bool first) {
  // No receive low-water mark: it suppresses the readiness a stalled frame needs (the kernel
  // also clamps the window to it), and a bench with a rail going down hung on it.
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  ev.data.ptr = &s;
  epoll_ctl(epfd_, first ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, s.fd, &ev);
}

void TransportImpl::rx_release_claim_locked(RxStream& s, bool incomplete) {
  if (!s.dest) return;
  // An incomplete chunk goes back to nobody: the sender re-sends it on another rail.
  if (incomplete && s.msg->state[s.idx] == kChunkClaimed) s.msg->state[s.idx] = kChunkNone;
  s.dest = nullptr;
  if (s.scratch.size() < s.h.len) s.scratch.resize(s.h.len);
  release_reader_locked(*peers_[s.conn->peer], *s.msg);
}

void TransportImpl::rx_retire_locked(RxStream& s) {
  Conn& c = *s.conn;
  rx_release_claim_locked(s, true);
  s.msg.reset();
  epoll_ctl(epfd_, EPOLL_CTL_DEL, s.fd, nullptr);
  if (c.rx == &s) c.rx = nullptr;
  release_fd_locked(c, s.fd);
  rx_streams_.erase(std::find_if(rx_streams_.begin(), rx_streams_.end(),
                                 [&](const std::unique_ptr<RxStream>& x) { return x.get() == &s; }));
}

namespace {
thread_local bool tl_driving = false;  // this thread is the driving caller (it needs no bell)
}  // namespace

void TransportImpl::rx_loop() {
  epoll_event ev[2], ready[16];
  while (!stopping_.load()) {
    // epfd_ is in rx_ep_ only while no caller drives: then its data wakes this thread.
    if (epoll_wait(rx_ep_, ev, 2, kIdleWaitMs) <= 0) continue;
    const int n = epoll_wait(epfd_, ready, 16, 0);
    for (int i = 0; i < n; ++i) rx_handle(*static_cast<RxStream*>(ready[i].data.ptr));
  }
}

void TransportImpl::notify_done_locked() {
  done_cv_.notify_all();
  if (caller_driving_ && !tl_driving) {
    const uint64_t one = 1;
    if (write(caller_bell_, &one, sizeof(one)) < 0) {}  // a full counter is still a rung bell
  }
}

bool TransportImpl::rx_start_driving_locked() {
  if (caller_driving_ || stopping_) return false;  // another caller drives: wait on done_cv_
  caller_driving_ = true;
  tl_driving = true;
  if (rx_admitted_) {
    rx_admitted_ = false;
    epoll_ctl(rx_ep_, EPOLL_CTL_DEL, epfd_, nullptr);
  }
  return true;
}

void TransportImpl::rx_stop_driving_locked() {
  tl_driving = false;
  caller_driving_ = false;
  last_drive_end_ns_ = now_ns();
  // The receive thread is re-admitted only after a quiet spell (rx_readmit_locked): between
  // back-to-back collectives the next message then waits in the socket for this caller, who
  // reads it straight into the posted buffer, instead of waking that thread to stash it.
  done_cv_.notify_all();  // a second waiter may drive now; close() waits for the driver to leave
}

void TransportImpl::rx_readmit_locked(int64_t now) {
  if (rx_admitted_ || caller_driving_ || stopping_ || now - last_drive_end_ns_ < kRxReadmitNs) return;
  rx_admitted_ = true;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = epfd_;
  epoll_ctl(rx_ep_, EPOLL_CTL_ADD, epfd_, &ev);  // wakes the receive thread if data is waiting
}

bool TransportImpl::rx_drive_ready(const Op* ops, size_t n) {
  // One stream per epoll_wait, the caller's ops checked in between: once they are done the
  // caller goes, and what else is ready (typically the hedge's second copy of a small
  // message) is read during its next wait, not on this call's critical path.
  bool any = false;
  epoll_event ev;
  while (epoll_wait(epfd_, &ev, 1, 0) == 1) {
    rx_handle(*static_cast<RxStream*>(ev.data.ptr));
    any = true;
    if (any_op_done(ops, n)) break;
  }
  if (rx_acks_owed_) {
    std::unique_lock<std::mutex> lk(mu_);
    rx_send_owed_acks_locked();
  }
  return any;
}

void TransportImpl::rx_send_owed_acks_locked() {
  rx_acks_owed_ = false;
  // One write per peer for every chunk read in this pass (was one per chunk: at 2 hosts x 4
  // rails a 1 MiB all_reduce sent 6 acks a rank, each a packet, a wake-up and a read at the
  // peer). On the rail of the last chunk read; a busy or full socket leaves them to a writer.
  for (auto& pp : peers_) {
    if (!pp || !pp->ack_via) continue;
    Peer& p = *pp;
    Conn& c = *p.ack_via;
    p.ack_via = nullptr;
    if (!p.acks.empty()) rx_ack_now_locked(p, c);
  }
}

void TransportImpl::rx_ack_now_locked(Peer& p, Conn& c) {
  if (send_frames_now_locked(c, p, FrameHeader{}, now_ns()) != 1 || !p.acks.empty()) p.wake_ack_carrier();
  if (p.acks.empty()) p.acks_urgent = p.acks_refill = false;
}

void TransportImpl::rx_drive_once(const Op* ops, size_t n, int timeout_ms) {
  if (rx_drive_ready(ops, n)) return;
  bool brief = false;
  if (const int64_t budget = spin_budget_ns(&brief)) {
    // Poll instead of sleeping: no wake-up at all when the bytes come within the budget. A peer
    // this late may be waiting for a message of ours lost on a dead rail: the hedge copies
    // this rank owes go out now (a peer on time answers well within kHedgeAfterUs).
    const int64_t start = now_ns(), until = start + budget;
    const int64_t hedge_at = start + hedge_after_ns();
    epoll_event ev[2];
    bool hit = false, hedged = false;
    for (;;) {
      hit = epoll_wait(caller_ep_, ev, 2, 0) > 0 || any_op_done(ops, n);
      if (hit || aborted_.load() || stopping_.load()) break;
      const int64_t now = now_ns();
      if (now >= until) break;
      if (!hedged && now >= hedge_at && hedges_due_count_.load(std::memory_order_relaxed) > 0) {
        hedged = true;
        std::unique_lock<std::mutex> lk(mu_);
        counters_.waiter_hedges += send_due_hedges_locked(lk, INT64_MAX);
      }
      run_due_pass_on_caller(now);  // instead of the watchdog preempting some caller for it
    }
    note_spin(hit, brief);
    if (hit) note_reply(now_ns() - start);
    if (any_op_done(ops, n)) return;
  }
  // A sleeping waiter writes its hedge copies once they are stale (kHedgeStaleNs), not before
  // every sleep (that cost each small message a second write and its peer a second read): it
  // wakes for them itself. The watchdog's pass, which also sends them, may be two ticks off
  // while callers run the passes (run_due_pass_on_caller).
  const int64_t stale_at = send_stale_hedges();
  if (stale_at && timeout_ms >= 0)  // a copy falls due within this sleep: wake for it
    timeout_ms = int(std::clamp<int64_t>((stale_at - now_ns() + 999999) / 1000000, 0, timeout_ms));
  epoll_event ev[2];
  const int k = epoll_wait(caller_ep_, ev, 2, timeout_ms);
  for (int i = 0; i < k; ++i)
    if (ev[i].data.fd == caller_bell_) {
      uint64_t v;
      if (read(caller_bell_, &v, sizeof(v)) < 0) {}
    }
  rx_drive_ready(ops, n);
  if (stale_at && !any_op_done(ops, n) && now_ns() >= stale_at) send_stale_hedges();
}

int64_t TransportImpl::send_stale_hedges() {
  if (hedges_due_count_.load(std::memory_order_relaxed) == 0) return 0;
  std::unique_lock<std::mutex> lk(mu_);
  // Oldest first, nearly always: post_send appends, and send_due_hedges_locked puts the ones it
  // left in front (two of those at once may interleave: a wake-up then comes late, and the
  // watchdog's pass still sends the copy).
  auto oldest_stale_at = [&]() -> int64_t {
    return hedges_due_.empty() ? 0 : hedges_due_.front()->posted_ns + kHedgeStaleNs;
  };
  const int64_t now = now_ns();
  const int64_t due = oldest_stale_at();
  if (due && due <= now) counters_.waiter_hedges += send_due_hedges_locked(lk, now - kHedgeStaleNs);
  // One still overdue has no other rail to take it: it is the watchdog's (waking early for a
  // copy that cannot go would spin).
  const int64_t next = oldest_stale_at();
  return next > now_ns() ? next : 0;
}

int64_t TransportImpl::hedge_after_ns() const {
  const int64_t late = kHedgeLateFactor * spin_reply_ns_.load(std::memory_order_relaxed);
  return std::min(kHedgeStaleNs, std::max(int64_t(kHedgeAfterUs) * 1000, late));
}

void TransportImpl::note_reply(int64_t waited_ns) {
  const int64_t r = spin_reply_ns_.load(std::memory_order_relaxed);
  spin_reply_ns_.store(r + (waited_ns - r) / 8, std::memory_order_relaxed);
}

int64_t TransportImpl::spin_budget_ns(bool* brief) {
  // Spin while most spins end in data (a peer that answers within the budget: a free core on
  // each side); after a run of misses (the peer is computing, or waits for a CPU our spinning
  // would take) sleep at once, and spin on one wait in kSpinProbeEvery to notice a change.
  // While another thread wants a core (host pressure), only briefly, on the same terms.
  if (opt_.spin_us <= 0) return 0;
  const bool host_ok = spin_host_ok_.load(std::memory_order_relaxed);
  if (brief) *brief = !host_ok;
  const int64_t budget = int64_t(host_ok ? opt_.spin_us : std::min(opt_.spin_us, kBriefSpinUs)) * 1000;
  const float rate = (host_ok ? spin_hit_rate_ : brief_hit_rate_).load(std::memory_order_relaxed);
  if (rate >= kSpinKeepRate || ++spin_probe_ % kSpinProbeEvery == 0) {
    if (!host_ok) spin_briefs_.fetch_add(1, std::memory_order_relaxed);
    return budget;
  }
  if (!host_ok) spin_skips_.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

void TransportImpl::note_spin(bool hit, bool brief) {
  auto& rate = brief ? brief_hit_rate_ : spin_hit_rate_;
  const float r = rate.load(std::memory_order_relaxed);
  rate.store(r + (float(hit) - r) / 8, std::memory_order_relaxed);
  if (hit) spin_hits_.fetch_add(1, std::memory_order_relaxed);
  else spin_misses_.fetch_add(1, std::memory_order_relaxed);
}

void TransportImpl::rx_handle(RxStream& s) {
  if (!rx_take(s)) return;
  const IoResult r = rx_read(s);
  std::unique_lock<std::mutex> lk(mu_);
  rx_after_read_locked(s, r, lk);
}

bool TransportImpl::rx_take(RxStream& s) {
  std::lock_guard<std::mutex> g(mu_);
  if (stopping_) return false;  // close() frees every stream
  if (s.epoch != s.conn->epoch.load()) {
    rx_retire_locked(s);
    return false;
  }
  s.busy = true;
  return true;
}

bool TransportImpl::rx_claim_lost(const RxStream& s) const {
  return s.phase == RxStream::Phase::kPayload && s.dest && (s.msg->superseded[s.idx].load() || aborted_.load());
}

IoResult TransportImpl::rx_read(RxStream& s) {
  Conn& c = *s.conn;
  IoResult r;
  size_t budget = kRxBudgetBytes;
  bool drained = false;
  // The budget bounds what is read from the socket, never what is already staged: staged
  // bytes get no epoll event, so the stream must not be re-armed before they are parsed.
  while (r.ok() && !stopping_.load() && c.epoch.load() == s.epoch) {
    if (rx_claim_lost(s)) {
      // Another rail completed this chunk (or the group died): out of the buffer, and
      // what is left of the frame goes aside so the stream stays in step.
      std::lock_guard<std::mutex> g(mu_);
      rx_release_claim_locked(s, false);
    }
    const RxStream::Part part = s.part();
    const size_t need = part.size - s.have;
    if (s.stage_pos < s.stage_end) {  // read ahead earlier: parse from the stage
      const size_t k = std::min(need, s.stage_end - s.stage_pos);
      std::memcpy(part.at + s.have, s.stage.get() + s.stage_pos, k);
      s.stage_pos += k;
      r = rx_advance(s, part.size, k);
      continue;
    }
    // A short read drained the socket: stop here rather than pay a recv that says EAGAIN
    // (re-arming the one-shot registration reports bytes that came since).
    if (drained || budget == 0) break;
    // Large remainders go straight to their destination; small ones through the stage.
    const bool staged = need < RxStream::kStageBytes;
    const size_t ask = staged ? RxStream::kStageBytes : need;
    const ssize_t got = io_->read_some(s.fd, staged ? s.stage.get() : part.at + s.have, ask);
    if (got > 0) {
      budget -= std::min(budget, size_t(got));
      c.last_rx_ns.store(now_ns());
      drained = size_t(got) < ask;
      if (staged) {
        s.stage_pos = 0;
        s.stage_end = size_t(got);
      } else {
        r = rx_advance(s, part.size, size_t(got));
      }
      continue;
    }
    if (got == 0) r = IoResult::eof();
    else if (errno == EINTR) continue;
    else if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    else {
      r = IoResult::sys_error("recv", errno);
      if (std::string why = io_->failure(s.fd); !why.empty()) r.detail = std::move(why);
    }
  }
  return r;
}

IoResult TransportImpl::rx_advance(RxStream& s, size_t part_size, size_t k) {
  s.have += k;
  return s.have == part_size ? frame_verdict(rx_frame_done(s)) : IoResult{};
}

void TransportImpl::rx_after_read_locked(RxStream& s, const IoResult& r, std::unique_lock<std::mutex>& lk) {
  Conn& c = *s.conn;
  s.busy = false;
  if (!r.ok())
    fail_conn_locked(c, s.epoch, r.cause,
                     "receive from rank " + std::to_string(c.peer) + " on rail" + std::to_string(c.rail) +
                         " failed: " + r.text());
  if (stopping_) return;
  Peer& p = *peers_[c.peer];
  if (s.epoch != c.epoch.load()) {
    rx_retire_locked(s);
  } else {
    if (rx_claim_lost(s)) rx_release_claim_locked(s, false);
    rx_arm_locked(s);
    rx_plan_acks_locked(p, c);
  }
  // Window the acks just read freed (forget_inflight_locked) is filled now, retired or not.
  if (tl_driving) refill_freed_rails_locked(p, lk);
}

void TransportImpl::rx_plan_acks_locked(Peer& p, Conn& c) {
  // Acks that free the sender's window go out from this thread (no writer wake-up): at once
  // when the sender may be waiting for window to send more of a message, on the rail the
  // chunk came by; otherwise once this thread has read what is ready now, all in one write
  // (rx_send_owed_acks_locked).
  if (tl_driving && p.acks_urgent && !p.acks.empty()) {
    if (!p.acks_refill) {
      p.ack_via = &c;
      rx_acks_owed_ = true;
    } else {
      rx_ack_now_locked(p, c);
    }
  }
  if (p.acks.empty()) p.acks_urgent = p.acks_refill = false;
}

bool TransportImpl::rx_on_driving_thread() { return tl_driving; }

std::string TransportImpl::rx_frame_done(RxStream& s) {
  Conn& c = *s.conn;
  Peer& p = *peers_[c.peer];
  const FrameHeader& h = s.h;
  s.have = 0;
  if (s.phase == RxStream::Phase::kPayload) {
    s.phase = RxStream::Phase::kHeader;
    std::lock_guard<std::mutex> g(mu_);
    rx_data_done_locked(s);
    return "";
  }
  if (s.phase == RxStream::Phase::kPadding) {
    s.phase = RxStream::Phase::kHeader;
    return "";
  }
  if (s.phase == RxStream::Phase::kAbortReason) {
    s.phase = RxStream::Phase::kHeader;
    std::lock_guard<std::mutex> g(mu_);
    set_error_locked(error_kind_from_wire(h.offset), s.reason);
    return "";
  }
  if (h.magic != kFrameMagic) return "corrupt frame (bad magic)";
  switch (FrameType(h.type)) {
    case FrameType::kData: {
      std::string err;
      {
        std::lock_guard<std::mutex> g(mu_);
        err = rx_data_begin_locked(s);
      }
      if (!err.empty()) return err;
      s.phase = RxStream::Phase::kPayload;
      return h.len == 0 ? rx_frame_done(s) : "";
    }
    case FrameType::kAck:
    case FrameType::kAckAll: {
      std::lock_guard<std::mutex> g(mu_);
      on_ack_locked(p, h.seq, h.offset, FrameType(h.type) == FrameType::kAckAll);
      return "";
    }
    case FrameType::kHeartbeat: {
      // Echo a few per second (the RTT estimate needs no more): an echo per heartbeat
      // woke this rail's writer and the peer's reader 200 times a second for nothing.
      const int64_t sent = int64_t(h.offset);
      if (sent - c.last_echoed_ns < kEchoEveryNs && sent >= c.last_echoed_ns) return "";
      // The echo goes out with this rail's next watchdog pass (send_heartbeat_locked), not
      // by its writer: waking the writer here preempted a decode-sized caller ~30 times a second.
      std::lock_guard<std::mutex> g(mu_);
      c.last_echoed_ns = sent;
      if (c.epoch.load() == s.epoch) {
        c.echo_peer_clock = h.offset;
        c.echo_heard_ns = now_ns();
      }
      return "";
    }
    case FrameType::kHeartbeatEcho: {
      // Less the time the echo waited at the peer for its watchdog pass (at most all of it).
      const int64_t elapsed = std::max<int64_t>(0, now_ns() - int64_t(h.offset));
      const double rtt = double(elapsed - int64_t(std::min<uint64_t>(h.total, uint64_t(elapsed)))) * 1e-9;
      std::lock_guard<std::mutex> g(mu_);
      c.st.rtt_s = c.st.rtt_s == 0 ? rtt : 0.8 * c.st.rtt_s + 0.2 * rtt;
      return "";
    }
    case FrameType::kAbort:
      s.reason.assign(std::min(h.len, kMaxAbortReason), '\0');
      s.phase = RxStream::Phase::kAbortReason;
      if (s.reason.empty()) return rx_frame_done(s);
      return "";
    case FrameType::kProbe:
      // Its padding only has to cross the path (gray.cc); a probe larger than any segment is no probe.
      if (h.len > kMaxProbeBytes) return "corrupt frame (probe of " + std::to_string(h.len) + " bytes)";
      if (s.scratch.size() < h.len) s.scratch.resize(h.len);
      s.phase = RxStream::Phase::kPadding;
      return h.len == 0 ? rx_frame_done(s) : "";
    case FrameType::kGoodbye: {
      std::lock_guard<std::mutex> g(mu_);
      peer_closed_locked(p);
      return "";
    }
    case FrameType::kDrain:
    case FrameType::kUndrain: {
      // The peer drained (or undrained) its end of this rail: the link is out of
      // use in both directions, and this side's state says so too.
      std::lock_guard<std::mutex> g(mu_);
      c.peer_drained = FrameType(h.type) == FrameType::kDrain;
      if (is_connected(c.state)) c.state = connected_state_locked(c);
      p.wake_writers();
      return "";
    }
    case FrameType::kHold:
    case FrameType::kRelease: {
      std::lock_guard<std::mutex> g(mu_);
      on_peer_hold_locked(c, FrameType(h.type) == FrameType::kHold, h.offset == kReleaseRestored);
      return "";
    }
    default:
      return "corrupt frame (unknown type " + std::to_string(h.type) + ")";
  }
}

std::string TransportImpl::rx_data_begin_locked(RxStream& s) {
  Conn& c = *s.conn;
  Peer& p = *peers_[c.peer];
  const FrameHeader& h = s.h;
  if (h.chunk_bytes == 0 || h.offset % h.chunk_bytes != 0 || h.offset + h.len > h.total)
    return "corrupt data frame (offset/length out of range)";
  s.idx = h.offset / h.chunk_bytes;
  s.urgent = h.total > opt_.small_msg_bytes;
  s.msg.reset();
  s.dest = nullptr;
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
    std::shared_ptr<InMsg> m = slot;
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
    if (m->chunk != h.chunk_bytes || s.idx >= m->nchunks) return "corrupt data frame (chunking changed)";
    s.msg = m;
    if (m->state[s.idx] == kChunkNone && !aborted_) {
      // Claimed: straight into the destination, unless another rail completes it first.
      m->state[s.idx] = kChunkClaimed;
      m->active_readers++;
      s.dest = m->data + h.offset;
    }
  }
  if (!s.dest && s.scratch.size() < h.len) s.scratch.resize(h.len);
  return "";
}

void TransportImpl::rx_data_done_locked(RxStream& s) {
  Conn& c = *s.conn;
  Peer& p = *peers_[c.peer];
  const FrameHeader& h = s.h;
  std::shared_ptr<InMsg> m = std::move(s.msg);
  char* dest = s.dest;
  s.dest = nullptr;
  c.st.bytes_recv += h.len;
  // A message with more chunks than rails: its sender may be waiting for this ack's window.
  if (s.urgent && h.total > uint64_t(h.chunk_bytes) * uint64_t(num_rails())) p.acks_refill = true;
  if (!m) {  // whole message already complete: only re-acknowledge
    enqueue_ack_locked(p, h.seq, s.idx, false, s.urgent);
    return;
  }
  auto complete_chunk = [&] {
    m->state[s.idx] = kChunkDone;
    m->nrecv++;
    enqueue_ack_locked(p, h.seq, s.idx, false, s.urgent);
  };
  if (dest) {
    if (m->state[s.idx] == kChunkClaimed) complete_chunk();
    release_reader_locked(p, *m);
    return;
  }
  if (aborted_) return;  // after an abort the buffer may be gone
  if (m->state[s.idx] == kChunkDone) {
    enqueue_ack_locked(p, h.seq, s.idx, false, s.urgent);  // duplicate: the sender may have lost the first ack
    return;
  }
  // First complete copy. If another stream holds the claim, it is stuck mid-chunk on a silent
  // rail: this copy wins (same bytes) and that stream is told to stand aside.
  std::memcpy(m->data + h.offset, s.scratch.data(), h.len);
  const bool claimed_elsewhere = m->state[s.idx] == kChunkClaimed;
  if (claimed_elsewhere) m->superseded[s.idx] = true;
  complete_chunk();
  if (claimed_elsewhere) {
    // An idle claimer gets no event while its rail is silent: release it here.
    for (auto& other : p.conns) {
      RxStream* x = other->rx;
      if (x && !x->busy && x->msg == m && x->idx == s.idx && x->dest) rx_release_claim_locked(*x, false);
    }
  }
  if (m->nrecv == m->nchunks && m->active_readers == 0) finish_in_locked(p, *m);
}

void TransportImpl::rx_drop_idle_claims_locked() {
  for (auto& s : rx_streams_)
    if (!s->busy && s->dest) rx_release_claim_locked(*s, true);
}

}  // namespace r2cc
