#include "reduce.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace r2cc {
namespace {

constexpr size_t kTile = 2048;  // elements per tile: the accumulator stays in L1

inline float bf16_to_f32(uint16_t v) {
  uint32_t bits = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {  // round to nearest even, as torch does
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

inline float f16_to_f32(uint16_t v) {
  _Float16 h;
  std::memcpy(&h, &v, 2);
  return float(h);
}

inline uint16_t f32_to_f16(float f) {
  _Float16 h = _Float16(f);
  uint16_t v;
  std::memcpy(&v, &h, 2);
  return v;
}

template <RedOp OP, typename A>
inline A combine(A a, A b) {
  if constexpr (OP == RedOp::kSum) return a + b;
  if constexpr (OP == RedOp::kMax) return b > a ? b : a;
  return b < a ? b : a;
}

// Up to kMaxFixed inputs: one pass, every input read once per element, the sum kept in a
// register. The tiled loops below took 2-3x longer than that for 4 inputs (8 passes over an L1
// accumulator). The order of operations per element is the same, so are the bits. `out` may
// equal an input (in place) but never overlaps one part-way (reduce.h), hence ivdep.
constexpr int kMaxFixed = 8;

template <typename T, typename A, RedOp OP, int N, A (*Widen)(T), T (*Narrow)(A)>
void reduce_fixed(T* out, const void* const* in, size_t count) {
  const T* a[N];
  for (int r = 0; r < N; ++r) a[r] = static_cast<const T*>(in[r]);
#pragma GCC ivdep
  for (size_t i = 0; i < count; ++i) {
    A v = Widen(a[0][i]);
    for (int r = 1; r < N; ++r) v = combine<OP>(v, Widen(a[r][i]));
    out[i] = Narrow(v);
  }
}

template <typename T>
inline T same(T v) { return v; }

// reduce_fixed<..., n> for 2 <= n <= kMaxFixed; false for other n.
template <typename T, typename A, RedOp OP, A (*Widen)(T), T (*Narrow)(A), int N = 2>
bool reduce_fixed_n(T* out, const void* const* in, int n, size_t count) {
  if constexpr (N > kMaxFixed) {
    return false;
  } else {
    if (n == N) {
      reduce_fixed<T, A, OP, N, Widen, Narrow>(out, in, count);
      return true;
    }
    return reduce_fixed_n<T, A, OP, Widen, Narrow, N + 1>(out, in, n, count);
  }
}

// Native types: accumulate in the type itself.
template <typename T, RedOp OP>
void reduce_native(T* out, const void* const* in, int n, size_t count) {
  if (reduce_fixed_n<T, T, OP, same<T>, same<T>>(out, in, n, count)) return;
  T acc[kTile];
  for (size_t base = 0; base < count; base += kTile) {
    const size_t m = std::min(kTile, count - base);
    const T* a0 = static_cast<const T*>(in[0]) + base;
    for (size_t i = 0; i < m; ++i) acc[i] = a0[i];
    for (int r = 1; r < n; ++r) {
      const T* ar = static_cast<const T*>(in[r]) + base;
      for (size_t i = 0; i < m; ++i) acc[i] = combine<OP>(acc[i], ar[i]);
    }
    std::memcpy(out + base, acc, m * sizeof(T));
  }
}

// 16-bit floats: widen to fp32, reduce, round once.
template <RedOp OP, float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void reduce_half(uint16_t* out, const void* const* in, int n, size_t count) {
  if (reduce_fixed_n<uint16_t, float, OP, Widen, Narrow>(out, in, n, count)) return;
  float acc[kTile];
  for (size_t base = 0; base < count; base += kTile) {
    const size_t m = std::min(kTile, count - base);
    const uint16_t* a0 = static_cast<const uint16_t*>(in[0]) + base;
    for (size_t i = 0; i < m; ++i) acc[i] = Widen(a0[i]);
    for (int r = 1; r < n; ++r) {
      const uint16_t* ar = static_cast<const uint16_t*>(in[r]) + base;
      for (size_t i = 0; i < m; ++i) acc[i] = combine<OP>(acc[i], Widen(ar[i]));
    }
    for (size_t i = 0; i < m; ++i) out[base + i] = Narrow(acc[i]);
  }
}

template <RedOp OP>
void dispatch_type(DType t, void* out, const void* const* in, int n, size_t count) {
  switch (t) {
    case DType::kF32: return reduce_native<float, OP>(static_cast<float*>(out), in, n, count);
    case DType::kI32: return reduce_native<int32_t, OP>(static_cast<int32_t*>(out), in, n, count);
    case DType::kI64: return reduce_native<int64_t, OP>(static_cast<int64_t*>(out), in, n, count);
    case DType::kF16: return reduce_half<OP, f16_to_f32, f32_to_f16>(static_cast<uint16_t*>(out), in, n, count);
    case DType::kBF16: return reduce_half<OP, bf16_to_f32, f32_to_bf16>(static_cast<uint16_t*>(out), in, n, count);
  }
  throw std::invalid_argument("r2cc: unsupported dtype");
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kI64: return 8;
  }
  throw std::invalid_argument("r2cc: unsupported dtype");
}

void reduce_in_order(DType t, RedOp op, void* out, const void* const* inputs, int n, size_t count) {
  switch (op) {
    case RedOp::kSum: return dispatch_type<RedOp::kSum>(t, out, inputs, n, count);
    case RedOp::kMax: return dispatch_type<RedOp::kMax>(t, out, inputs, n, count);
    case RedOp::kMin: return dispatch_type<RedOp::kMin>(t, out, inputs, n, count);
  }
  throw std::invalid_argument("r2cc: unsupported reduce op");
}

}  // namespace r2cc
