// The transport's options, each once. The bindings generate TransportOptions' Python class from
// the same list (bindings.cc), so the list stays in a header of its own.
#pragma once

#include <cstddef>

#include "net.h"  // PortRange

namespace r2cc {

// Every option once: (type, name, default). The struct and its Python binding are generated
// from this list; r2cc_serve/envs.py names the R2CC_* knob of each (the communicator copies
// the knobs in by iterating that registry) and a test checks both sides' defaults agree.
// hedge_bytes: a one-chunk send up to this size gets a second copy on another rail when it is
// late to be acknowledged (send_due_hedges_locked).
// watchdog_realtime: heartbeats and failure detection keep running on a saturated CPU.
// fallback_rails: the last N rails carry data only when no primary rail to a peer is connected.
// spin_us: a waiting caller polls its sockets this long before it sleeps (less latency, more CPU),
// only while the host's CPU pressure (share of time some thread waited for a core) is below
// spin_max_cpu_pressure (host_load.cc): a spin must not take a core another thread wants.
// loss_hold_pct, loss_min_segments: a rail that retransmits loss_hold_pct percent more of its
// segments than the peer's best other rail, over at least loss_min_segments, is held (loss.cc).
// flap_*, hold_*: flap dampening (dampening.cc): each failure of a rail adds 1 to its penalty,
// which halves every flap_half_life_s; a failure that brings it to flap_threshold (0: never)
// holds the rail out until it has gone hold_s without failing, doubled for each new hold up to
// hold_max_s.
// port_range: each rail's listener takes the first free port of it ({0, 0}: any port; net.h).
// chunk_bytes / min_chunk_bytes: a bulk message's chunk carries ~kChunkTimeMs of the slowest rail
// to its peer, between these two (bulk_chunk_locked).
#define R2CC_TRANSPORT_OPTIONS(X)          \
  X(size_t, chunk_bytes, 1024 * 1024)      \
  X(size_t, min_chunk_bytes, 256 * 1024)   \
  X(size_t, window_bytes, 1024 * 1024)     \
  X(int, heartbeat_ms, 10)                 \
  X(int, rail_timeout_ms, 60)              \
  X(int, peer_silence_ms, 400)             \
  X(int, probe_interval_ms, 200)           \
  X(int, all_down_grace_ms, 600)           \
  X(double, connect_timeout_s, 30)         \
  X(double, op_timeout_s, 300)             \
  X(size_t, small_msg_bytes, 64 * 1024)    \
  X(size_t, hedge_bytes, 16 * 1024)        \
  X(bool, watchdog_realtime, true)         \
  X(int, fallback_rails, 0)                \
  X(int, spin_us, 1000)                    \
  X(double, spin_max_cpu_pressure, 0.10)   \
  X(double, flap_threshold, 2.0)           \
  X(double, flap_half_life_s, 60)          \
  X(double, hold_s, 10)                    \
  X(double, hold_max_s, 300)               \
  X(double, loss_hold_pct, 0.5)            \
  X(int, loss_min_segments, 1000)          \
  X(PortRange, port_range, PortRange(29650, 29749))

struct TransportOptions {
#define R2CC_OPTION_FIELD(type, name, value) type name = value;
  R2CC_TRANSPORT_OPTIONS(R2CC_OPTION_FIELD)
#undef R2CC_OPTION_FIELD
};

}  // namespace r2cc
