// Acting on a failed rail (the detector in detector.cc and the I/O loops decide that it
// failed): its un-acknowledged chunks go back to the peer's queue for the surviving rails, a
// rail gone quiet is set aside (suspect) while the others carry on, and a peer that said
// goodbye is closed.
//
// Contract: every function here runs under the transport lock and never blocks. After
// fail_conn_locked no byte of a re-queued chunk can leave through the old socket (it is shut
// down first), so a chunk is never written on two sockets of one rail. Re-sent chunks and
// failovers are counted in the rail's stats and the transport's counters.
#include <sys/socket.h>

#include "net.h"
#include "transport_internal.h"

namespace r2cc {

bool TransportImpl::peer_has_link_locked(const Peer& p) const {
  for (auto& c : p.conns)
    if (is_connected(c->state)) return true;
  return false;
}

bool TransportImpl::peer_has_path_locked(const Peer& p) const {
  for (auto& c : p.conns)
    if (is_connected(c->state) && !c->suspect) return true;
  return false;
}

void TransportImpl::requeue_inflight_locked(Conn& c, IoCause cause, const std::string& reason, int64_t now,
                                        bool count_failure) {
  Peer& p = *peers_[c.peer];
  c.st.failovers++;
  counters_.failovers++;
  c.note_error(cause, reason);
  c.st.last_detect_s = double(now - c.last_rx_ns.load()) * 1e-9;
  // Un-acknowledged chunks go back to the front of the queue, in order, for the
  // surviving rails; the receiver ignores whichever copy arrives second.
  for (auto it = c.inflight.rbegin(); it != c.inflight.rend(); ++it) {
    auto m = p.out.find(it->first);
    if (m == p.out.end() || m->second->acked[it->second]) continue;
    OutMsg& msg = *m->second;
    // A hedged message whose other copy travels on another rail needs no re-send.
    if (msg.hedge_rail == c.rail) {
      msg.hedge_rail = -1;
      continue;
    }
    if (msg.hedge_rail >= 0 && msg.on_rail[it->second] == c.rail) {
      msg.on_rail[it->second] = msg.hedge_rail;
      msg.hedge_rail = -1;
      continue;
    }
    msg.on_rail[it->second] = -1;
    p.queue.push_front(Chunk{m->second, it->second});  // the shared_ptr, not the alias
    const size_t bytes = msg.chunk_len(it->second);
    c.st.chunks_resent++;
    c.st.bytes_resent += bytes;
    counters_.chunks_resent++;
    counters_.bytes_resent += bytes;
  }
  c.inflight.clear();
  if (c.busy_since_ns) c.busy_ns += now - c.busy_since_ns;
  c.busy_since_ns = 0;
  c.inflight_bytes = 0;
  for (auto& a : c.acks_carried) p.acks.push_back(a.second);  // they may be stuck in its buffers
  c.acks_carried.clear();
  if (count_failure && !rail_held_[c.rail]) note_rail_failure_locked(c, reason, now);  // an operator's failover is no flap
  p.wake_writers();
  notify_done_locked();
}

void TransportImpl::drop_handoff_locked(Conn& c) {
  if (!c.handoff) return;
  finish_chunk_write_locked(c.handoff->chunk);  // its chunk was re-queued with the rest
  c.handoff.reset();
  c.writing = false;  // nobody was writing: the writer had not taken it yet
}

void TransportImpl::suspect_conn_locked(Conn& c, IoCause cause, const std::string& reason, SuspectWhy why) {
  if (c.suspect || !is_connected(c.state)) return;
  const int64_t now = now_ns();
  c.suspect = true;
  c.suspect_why = why;
  c.suspect_since_ns = now;
  // A slow rail is demoted at once: each slow verdict is a failure, so one that stays slow is held.
  c.suspect_counted = why == SuspectWhy::kSilent || why == SuspectWhy::kSlow;
  requeue_inflight_locked(c, cause, reason, now, c.suspect_counted);
}

void TransportImpl::fail_conn_locked(Conn& c, uint64_t epoch, IoCause cause, const std::string& reason) {
  if (c.epoch.load() != epoch || !is_connected(c.state)) return;
  // Shut the socket down before re-queueing: after this no byte of a re-queued
  // chunk can still leave through the dead connection.
  io_->shutdown(c.fd);
  Peer& p = *peers_[c.peer];
  c.state = RailState::kDown;
  c.epoch++;  // the reader/writer of the old socket stand down
  drop_handoff_locked(c);
  const int64_t now = now_ns();
  c.last_probe_ns = now;  // the first probe waits one interval: the peer needs to notice too
  c.echo_heard_ns = 0;    // an echo owed on the old socket: its clock belongs to that path
  if (c.suspect) {  // re-queued when it was set aside; counted then, unless a gray suspicion
    c.note_error(cause, reason);
    if (!c.suspect_counted && !rail_held_[c.rail]) note_rail_failure_locked(c, reason, now);
  } else {
    requeue_inflight_locked(c, cause, reason, now);
  }
  c.suspect = false;
  if (c.we_connect) dial_cv_.notify_one();  // its first probe is due in probe_interval_ms
  if (!peer_has_link_locked(p)) p.no_link_since_ns = now;
  p.wake_writers();
  notify_done_locked();
}

void TransportImpl::peer_closed_locked(Peer& p) {
  p.closed = true;
  p.no_link_since_ns = 0;
  for (auto& c : p.conns) {
    if (!is_connected(c->state)) continue;
    io_->shutdown(c->fd);
    c->state = RailState::kDown;
    c->epoch++;
    drop_handoff_locked(*c);
    // A goodbye: neither the path nor the peer's process failed (the peer is closed, not gone).
    c->note_error(IoCause::kOther, "rank " + std::to_string(p.rank) + " closed its communicator");
  }
  p.wake_writers();
  notify_done_locked();
}

}  // namespace r2cc
