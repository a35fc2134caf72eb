// Collectives built on the transport's point-to-point messages. Each is a fixed
// plan (who sends which bytes to whom, in which order); every rank derives the
// same plan from (rank, world, count), so message sequence numbers match.
// All calls block until done and throw AbortedError if the group dies.
#pragma once

#include <cstddef>

#include "reduce.h"
#include "transport.h"

namespace r2cc {

// Direct reduce-scatter + all-gather: rank r owns segment r, receives every
// rank's copy of it, reduces in rank order, sends the result back to all.
// Pipelined in slices of `slice_bytes`. `out` may equal `in`.
// Vectors of at most one_shot_bytes go in one exchange (each rank reduces every input);
// larger ones by reduce-scatter + all-gather in slices of slice_bytes.
void all_reduce(Transport& t, const void* in, void* out, size_t count, DType dt, RedOp op, size_t slice_bytes,
                size_t one_shot_bytes);
// out = concat over ranks of each rank's `in` (count elements each).
void all_gather(Transport& t, const void* in, void* out, size_t count, DType dt);
// in holds world*count elements; rank r gets the reduction of every rank's block r.
void reduce_scatter(Transport& t, const void* in, void* out, size_t count, DType dt, RedOp op);
// root's out = concat of every rank's in; out unused elsewhere.
void gather(Transport& t, const void* in, void* out, size_t count, DType dt, int root);
void broadcast(Transport& t, void* buf, size_t bytes, int root);
void send(Transport& t, const void* buf, size_t bytes, int peer);
void recv(Transport& t, void* buf, size_t bytes, int peer);

}  // namespace r2cc
