// Element-wise reductions in canonical rank order: out = op(...op(in[0], in[1])..., in[n-1]).
// The order never depends on rails, chunking or failovers, so results are
// bit-identical on every run. 16-bit floats accumulate in fp32 and round once.
#pragma once

#include <cstddef>

namespace r2cc {

enum class DType { kF32 = 0, kF16 = 1, kBF16 = 2, kI32 = 3, kI64 = 4 };
enum class RedOp { kSum = 0, kMax = 1, kMin = 2 };

size_t dtype_size(DType t);

// `inputs` has n pointers ordered by rank; `out` may be one of them (in place), but must not
// overlap any input part-way.
void reduce_in_order(DType t, RedOp op, void* out, const void* const* inputs, int n, size_t count);

}  // namespace r2cc
