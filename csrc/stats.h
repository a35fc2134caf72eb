// What the transport reports about itself: per connection, per peer, and counters.
//
// Each field is written once, in a list below: (type, name, initial value). The struct members
// and, through each_field(), the Python classes (bindings.cc: read-only attributes, FIELDS and
// as_dict()) are generated from it. r2cc_serve/_C.pyi lists the same names in the same order and
// r2cc_serve/comm/communicator.py returns as_dict(); tests/unit/test_stats_fields.py fails when
// either drifts from the list. A list's order is the order of the dicts users see.
#pragma once

#include <cstdint>
#include <string>

namespace r2cc {

// One (peer, rail) connection of this rank.
//   held             operator failover: not re-admitted until restore_rail
//   last_detect_s    how long the last failure took to detect (silence before it)
//   suspect_after_s  how long this rail may now be quiet before it is suspect
//   last_error_time  unix seconds
//   fallback         a fallback rail (e.g. the management network)
//   flap_failures    failures that count towards flapping, with dampening on or off: failed for
//                    good, or set aside for silence or slowness. Not the operator's failovers,
//                    nor a gray set-aside that cleared by itself (failovers counts those too)
//   flap_penalty     the dampening penalty now (each failure adds 1; it halves every flap_half_life_s)
//   holds            times this side held the rail out (flapping or loss)
//   hold_left_s      time left of this side's hold (0: not held by this side)
//   hold_reason      why the rail is held (this side's reason, or that the peer holds it)
//   retrans_pct      share of this side's data segments retransmitted in the last loss window (percent)
//   loss_holds       times this side held the rail out for loss
//   stuck_suspects   times it was set aside because the peer's host acknowledged none of our
//                    outstanding bytes for the quiet time while the peer still spoke (gray)
//   slow_suspects    times it was set aside because it delivered our backlog at under a quarter
//                    of the usual rate (its chunks were late)
//   mute_suspects    times it was set aside because the peer's bytes stopped arriving on it
//                    while its other rails delivered
#define R2CC_CONN_STATS(X)                \
  X(int, peer, -1)                        \
  X(int, rail, -1)                        \
  X(std::string, state, "")               \
  X(bool, held, false)                    \
  X(uint64_t, bytes_sent, 0)              \
  X(uint64_t, bytes_recv, 0)              \
  X(uint64_t, chunks_sent, 0)             \
  X(uint64_t, chunks_resent, 0)           \
  X(uint64_t, bytes_resent, 0)            \
  X(uint64_t, failovers, 0)               \
  X(uint64_t, reconnects, 0)              \
  X(uint64_t, inflight_bytes, 0)          \
  X(double, bandwidth_Bps, 0)             \
  X(double, rtt_s, 0)                     \
  X(double, suspect_after_s, 0)           \
  X(double, last_detect_s, 0)             \
  X(std::string, last_error, "")          \
  X(double, last_error_time, 0)           \
  X(bool, fallback, false)                \
  X(uint64_t, flap_failures, 0)           \
  X(double, flap_penalty, 0)              \
  X(uint64_t, holds, 0)                   \
  X(double, hold_left_s, 0)               \
  X(std::string, hold_reason, "")        \
  X(double, retrans_pct, 0)               \
  X(uint64_t, loss_holds, 0)             \
  X(uint64_t, stuck_suspects, 0)         \
  X(uint64_t, slow_suspects, 0)          \
  X(uint64_t, mute_suspects, 0)

// What this rank knows of a peer as a whole (not per rail).
//   stalled        every rail silent while its host still acknowledges our bytes
//   stalled_for_s  how long the current stall has lasted (0 when not stalled)
//   stalls         stalls seen so far
//   last_stall_s   duration of the last stall that ended
//   silent_s       time since any byte came from the peer on any rail
//   has_path       some rail to the peer is connected and not suspect
//   closed         the peer closed its communicator (said goodbye): its rails' downs are no fault
//   chunk_bytes    chunk size of the next bulk message to the peer (sized to its slowest rail)
//   chunk_cost_bytes  a chunk's fixed CPU cost as bytes of the slowest rail (16 KiB assumed
//                     until the rails are measured); a message below bulk size goes on about
//                     sqrt(size / this) rails
//   one_rail_max_bytes  the largest message that now goes on one rail alone
//   all_rails_min_bytes the smallest message that now goes on every rail taking chunks
#define R2CC_PEER_STATS(X)        \
  X(int, peer, -1)                \
  X(bool, stalled, false)         \
  X(double, stalled_for_s, 0)     \
  X(uint64_t, stalls, 0)          \
  X(double, last_stall_s, 0)      \
  X(double, silent_s, 0)          \
  X(bool, has_path, true)         \
  X(bool, closed, false)          \
  X(uint64_t, chunk_bytes, 0)     \
  X(double, chunk_cost_bytes, 0)  \
  X(uint64_t, one_rail_max_bytes, 0) \
  X(uint64_t, all_rails_min_bytes, 0)

// Totals of the transport.
//   spin_hits      waits that spun and got their bytes without sleeping
//   spin_misses    waits that spun for nothing, then slept
//   handoffs       inline writes that filled the socket: the rail's writer finished the chunk
//   hedges         hedge copies written (a small message's second copy, on another rail)
//   waiter_hedges  those a waiting caller wrote itself (spinning, or once stale while it
//                  slept); the rest came from watchdog passes
//   hedges_unneeded  small messages left without a copy because the peer's kernel had every
//                    byte of the first one (the peer was late, not the rail)
//   writer_chunks  data chunks a rail's writer thread wrote (the rest left from a caller)
//   holds          rails held out for flapping (flap dampening) or loss
//   loss_holds     rails held out because they lose packets (loss.cc)
//   spin_skips     waits that slept at once: the host's CPU was under pressure and brief polls
//                  had stopped paying
//   spin_briefs    waits that polled only briefly (kBriefSpinUs) because of that pressure
//   cpu_pressure   share of the last ~second some thread on the host waited for a core (0..1)
//   watchdog_passes      watchdog passes (one per tick)
//   watchdog_locked_us   time the watchdog's passes took, in total (under the transport lock
//                        but for the writes of hedge copies, which let it go)
//   watchdog_pass_max_us the longest of them (a caller that needs the lock waits that long)
//   caller_watchdog_passes  passes a caller ran itself, spinning or ending a call (counted in
//                           watchdog_passes too)
//   gray_suspects  rails set aside while the peer still spoke on them: our bytes stuck or slow,
//                  or the peer's stopped (the per-rail stuck, slow and mute counts, summed)
//   probes         full-size probes written on rails with nothing else in flight
//   own_stalls     watchdog passes that came over half a rail timeout late: this process was
//                  held up (no CPU, swapped); silence and progress are judged afresh after one
#define R2CC_COUNTERS(X)                \
  X(uint64_t, rejected_handshakes, 0)   \
  X(uint64_t, failovers, 0)             \
  X(uint64_t, chunks_resent, 0)         \
  X(uint64_t, bytes_resent, 0)          \
  X(uint64_t, spin_hits, 0)             \
  X(uint64_t, spin_misses, 0)           \
  X(uint64_t, handoffs, 0)              \
  X(uint64_t, hedges, 0)                \
  X(uint64_t, waiter_hedges, 0)         \
  X(uint64_t, hedges_unneeded, 0)       \
  X(uint64_t, writer_chunks, 0)         \
  X(uint64_t, holds, 0)                 \
  X(uint64_t, loss_holds, 0)            \
  X(uint64_t, spin_skips, 0)            \
  X(uint64_t, spin_briefs, 0)           \
  X(double, cpu_pressure, 0)            \
  X(uint64_t, watchdog_passes, 0)       \
  X(uint64_t, watchdog_locked_us, 0)    \
  X(uint64_t, watchdog_pass_max_us, 0)  \
  X(uint64_t, caller_watchdog_passes, 0) \
  X(uint64_t, gray_suspects, 0)         \
  X(uint64_t, probes, 0)                \
  X(uint64_t, own_stalls, 0)

// Generators: a member with its initial value; a call f(name, member pointer) of each_field().
#define R2CC_STATS_MEMBER(type, name, init) type name = init;
#define R2CC_STATS_VISIT(type, name, init) f(#name, &Self::name);

struct ConnStats {
  R2CC_CONN_STATS(R2CC_STATS_MEMBER)
  template <typename F>
  static void each_field(F&& f) {  // f(name, member pointer) per field, in the list's order
    using Self = ConnStats;
    R2CC_CONN_STATS(R2CC_STATS_VISIT)
  }
};

struct PeerStats {
  R2CC_PEER_STATS(R2CC_STATS_MEMBER)
  template <typename F>
  static void each_field(F&& f) {
    using Self = PeerStats;
    R2CC_PEER_STATS(R2CC_STATS_VISIT)
  }
};

struct Counters {
  R2CC_COUNTERS(R2CC_STATS_MEMBER)
  template <typename F>
  static void each_field(F&& f) {
    using Self = Counters;
    R2CC_COUNTERS(R2CC_STATS_VISIT)
  }
};

#undef R2CC_STATS_VISIT
#undef R2CC_STATS_MEMBER

}  // namespace r2cc
