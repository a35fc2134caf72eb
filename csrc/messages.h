// In-flight message records shared by the transport's threads. All fields are
// guarded by TransportImpl::mu_ except the payload bytes themselves.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace r2cc {

inline size_t num_chunks(size_t len, size_t chunk) { return len == 0 ? 0 : (len + chunk - 1) / chunk; }

constexpr size_t kMinChunkBytes = 16 * 1024;  // a smaller message is one chunk

// Chunk size for a message spread over `rails`: large messages use the configured chunk;
// smaller ones are still cut so that each of those rails gets a share.
inline size_t chunk_size_for(size_t len, size_t max_chunk, int rails) {
  const size_t min_chunk = kMinChunkBytes;
  size_t per_rail = (len + size_t(rails) - 1) / size_t(rails);
  size_t c = per_rail < max_chunk ? per_rail : max_chunk;
  if (c < min_chunk) c = min_chunk;
  return c;
}

// How many of `rails` a message below bulk size is spread over. Every chunk costs the two ends
// a fixed CPU time whatever its size (a write, a read, a frame and its ack), paid one chunk after
// another, while the chunks' bytes cross their rails side by side: k rails take about
// k*c + len/(k*B), least at k = sqrt(len/(c*B)). chunk_cost_bytes is c*B, what the slowest rail
// moves in that fixed time (0: not known yet; every rail then takes a share, as on slow rails:
// at 1 Gbit/s c*B is ~1 KiB and a 64 KiB message wants all four). No chunk under kMinChunkBytes.
inline int stripe_rails(size_t len, int rails, double chunk_cost_bytes) {
  if (chunk_cost_bytes <= 0) return rails;
  const int k = int(std::lround(std::sqrt(double(len) / chunk_cost_bytes)));
  const int by_floor = int(std::max<size_t>(1, len / kMinChunkBytes));
  return std::clamp(k, 1, std::max(1, std::min(rails, by_floor)));
}

struct OutMsg {
  int peer = -1;
  uint64_t seq = 0;
  uint64_t call_seq = 0, call_desc = 0;  // the call that sent it (call.h), stamped on every frame
  const char* data = nullptr;
  std::vector<char> owned;  // copy for small sends, so the caller's buffer is free at once
  size_t len = 0, chunk = 0, nchunks = 0;
  std::vector<uint8_t> acked;
  std::vector<int8_t> on_rail;  // rail currently carrying each chunk, -1 if queued/acked
  int8_t hedge_rail = -1;       // second rail carrying a hedged one-chunk message, -1 if none
  int64_t posted_ns = 0;        // when post_send queued or wrote it (due hedge copies)
  size_t nacked = 0;
  // Set (under the transport lock) when every chunk is acknowledged. Writers read it
  // without the lock to abandon a duplicate mid-chunk.
  std::atomic<bool> done{false};
  // Writers currently reading this buffer; the caller may reuse it only at zero.
  std::atomic<int> active_writers{0};
  size_t chunk_len(size_t idx) const { return idx + 1 < nchunks ? chunk : len - idx * chunk; }
};

// Chunk receive states: claimed = a reader is writing it into the buffer now.
enum : uint8_t { kChunkNone = 0, kChunkClaimed = 1, kChunkDone = 2 };

struct InMsg {
  int peer = -1;
  uint64_t seq = 0;
  uint64_t want_seq = 0, want_desc = 0;  // the receiving call, once posted
  uint64_t sent_seq = 0, sent_desc = 0;  // the sending call, from the first frame (known)
  size_t len = 0, chunk = 0, nchunks = 0;
  char* data = nullptr;      // where chunks land: the user's buffer or the stash
  char* user = nullptr;      // user's buffer once posted
  std::unique_ptr<char[]> stash;  // chunks that arrived before the receive was posted
  bool posted = false;
  bool known = false;        // the first frame told us len/chunk
  std::vector<uint8_t> state;
  // Readers writing into `data` right now; the message completes only at zero.
  int active_readers = 0;
  // Per chunk: another rail's copy completed it, the reader holding the claim stands aside.
  std::unique_ptr<std::atomic<bool>[]> superseded;
  size_t nrecv = 0;
  // Set under the transport lock once the bytes are in the user's buffer; a spinning waiter
  // reads it without the lock (then takes the lock before it returns).
  std::atomic<bool> done{false};
  std::string error;
};

}  // namespace r2cc
