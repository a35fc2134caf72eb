// The generic plan executor: runs one rank's program (sched/program.h) on the transport.
//
// Contract (the executor side of the one in r2cc_serve/sched/ir.py):
// - Blocks until every step of this rank is done (GIL released by the caller).
// - A step starts once its deps are done. Sends and receives are posted to the transport as
//   soon as that allows, in program order per peer (messages match by order per pair);
//   REDUCE/COPY run on the calling thread with reduce_in_order (rank-order folds: the same
//   bits as csrc/collectives.cc). So stages overlap and micro-chunks pipeline by themselves.
// - `in` and `out` hold `count` elements and may be the same buffer: the input is then
//   copied first (the plan contract wants them apart) unless the program is in-place safe
//   (PlanProgram::in_place_safe: direct and OptCC are, like the built-in path); both stay the caller's, untouched by any
//   transport thread once this returns or throws. Scratch is allocated per call.
// - Begins the call like every collective (begin_call with the all_reduce descriptor), so
//   collective numbers and descriptors stay in step with ranks on the built-in path.
// - Failure: the group's AbortedError propagates (each wait has the transport's limits). A
//   program this call cannot run (regions past `count`, a peer outside the group, a plan that
//   stops progressing) aborts the group, so every rank fails alike, and throws AbortedError.
#pragma once

#include <cstddef>

#include "reduce.h"
#include "sched/program.h"
#include "transport.h"

namespace r2cc {

void run_all_reduce_plan(Transport& t, const PlanProgram& prog, const void* in, void* out, size_t count, DType dt,
                         RedOp op);

}  // namespace r2cc
