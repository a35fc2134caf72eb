// The transport's books: nothing stranded. Every chunk of a message not yet acknowledged is either
// waiting in its peer's queue or booked in flight on exactly the connected rail that carries it,
// and a rail's in-flight bytes are the bytes of the chunks booked on it. A chunk on no rail and in
// no queue would never be sent again (the collective would wait for op_timeout_s); a chunk booked
// on a failed rail would be re-sent by nobody.
//
// audit_books() checks this under the lock (tests call it between and during faults); a build
// with -DR2CC_CHECK_BOOKS checks it in every watchdog pass and aborts the group, naming the
// chunk, at the first breach.
#include <algorithm>
#include <set>
#include <utility>

#include "transport_internal.h"

namespace r2cc {

std::vector<std::string> TransportImpl::audit_books() const {
  std::lock_guard<std::mutex> g(mu_);
  return audit_books_locked();
}

std::vector<std::string> TransportImpl::audit_books_locked() const {
  std::vector<std::string> bad;
  auto chunk_name = [](int peer, uint64_t seq, size_t idx) {
    return "message " + std::to_string(seq) + " chunk " + std::to_string(idx) + " to rank " + std::to_string(peer);
  };
  for (const auto& pp : peers_) {
    const Peer& p = *pp;
    if (p.rank == rank_ || p.closed) continue;
    std::set<std::pair<uint64_t, uint32_t>> queued;
    for (const Chunk& ch : p.queue)
      if (ch.msg) queued.emplace(ch.msg->seq, ch.idx);
    for (const auto& [seq, mp] : p.out) {
      const OutMsg& m = *mp;
      for (size_t i = 0; i < m.nchunks; ++i) {
        if (m.acked[i]) continue;
        const int r = m.on_rail[i];
        if (r < 0) {
          if (!queued.count({seq, uint32_t(i)}))
            bad.push_back(chunk_name(p.rank, seq, i) + ": unacknowledged, on no rail and not queued");
          continue;
        }
        const Conn& c = *p.conns[size_t(r)];
        if (!is_connected(c.state))
          bad.push_back(chunk_name(p.rank, seq, i) + ": booked on rail" + std::to_string(r) + ", which is " +
                        rail_state_name(c.state));
        else if (std::find(c.inflight.begin(), c.inflight.end(), std::make_pair(seq, uint32_t(i))) == c.inflight.end())
          bad.push_back(chunk_name(p.rank, seq, i) + ": carried by rail" + std::to_string(r) +
                        " but not in its in-flight list");
      }
    }
    for (const auto& cp : p.conns) {
      const Conn& c = *cp;
      size_t bytes = 0;
      for (const auto& [seq, idx] : c.inflight) {
        auto it = p.out.find(seq);
        const OutMsg* m = it == p.out.end() ? nullptr : it->second.get();
        if (!m || idx >= m->nchunks || m->acked[idx] || (m->on_rail[idx] != c.rail && m->hedge_rail != c.rail))
          bad.push_back(chunk_name(p.rank, seq, idx) + ": still booked in flight on rail" + std::to_string(c.rail) +
                        (m ? " though it is acknowledged or carried elsewhere" : " though its message is complete"));
        else
          bytes += m->chunk_len(idx);
      }
      // What the window and the status file count must be what the rail is trying to send.
      if (bytes != c.inflight_bytes)
        bad.push_back("rail" + std::to_string(c.rail) + " to rank " + std::to_string(p.rank) + ": " +
                      std::to_string(bytes) + " bytes of live chunks in flight but " +
                      std::to_string(c.inflight_bytes) + " counted");
      if (!is_connected(c.state) && (!c.inflight.empty() || c.inflight_bytes))
        bad.push_back("rail" + std::to_string(c.rail) + " to rank " + std::to_string(p.rank) + " is " +
                      rail_state_name(c.state) + " yet books " + std::to_string(c.inflight.size()) +
                      " chunks in flight");
    }
  }
  return bad;
}

}  // namespace r2cc
