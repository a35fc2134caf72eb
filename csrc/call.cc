#include "call.h"

#include "errors.h"
#include "reduce.h"

namespace r2cc {

uint64_t CallDesc::pack() const {
  const uint64_t r = root < 0 || root >= 0xFFF ? 0 : uint64_t(root) + 1;
  const uint64_t c = count & ((uint64_t(1) << 40) - 1);
  return uint64_t(op) << 60 | uint64_t(dtype & 0xF) << 56 | uint64_t(redop & 0xF) << 52 | r << 40 | c;
}

CallDesc CallDesc::unpack(uint64_t v) {
  CallDesc d;
  d.op = CallOp(v >> 60);
  d.dtype = uint8_t(v >> 56 & 0xF);
  d.redop = uint8_t(v >> 52 & 0xF);
  const uint64_t r = v >> 40 & 0xFFF;
  d.root = r == 0 ? kNoRoot : int32_t(r - 1);
  d.count = v & ((uint64_t(1) << 40) - 1);
  return d;
}

namespace {
const char* op_name(CallOp op) {
  switch (op) {
    case CallOp::kAllReduce: return "all_reduce";
    case CallOp::kAllGather: return "all_gather";
    case CallOp::kReduceScatter: return "reduce_scatter";
    case CallOp::kGather: return "gather";
    case CallOp::kBroadcast: return "broadcast";
    case CallOp::kSend: return "send";
    case CallOp::kRecv: return "recv";
    case CallOp::kNone: break;
  }
  return "?";
}

const char* dtype_name(uint8_t d) {
  switch (d) {
    case uint8_t(DType::kF32): return "float32";
    case uint8_t(DType::kF16): return "float16";
    case uint8_t(DType::kBF16): return "bfloat16";
    case uint8_t(DType::kI32): return "int32";
    case uint8_t(DType::kI64): return "int64";
  }
  return "bytes";
}

const char* redop_name(uint8_t r) {
  switch (r) {
    case uint8_t(RedOp::kSum): return "sum";
    case uint8_t(RedOp::kMax): return "max";
    case uint8_t(RedOp::kMin): return "min";
  }
  return "?";
}
}  // namespace

std::string CallDesc::describe() const {
  std::string s = std::string(op_name(op)) + "(";
  if (op == CallOp::kAllReduce || op == CallOp::kReduceScatter) s += std::string(redop_name(redop)) + ", ";
  if (root != kNoRoot) s += "root " + std::to_string(root) + ", ";
  if (dtype == kBytes) s += std::to_string(count) + " bytes)";
  else s += std::string(dtype_name(dtype)) + "[" + std::to_string(count) + "])";
  return s;
}

std::string describe_call(uint64_t seq, const CallDesc& d) {
  return d.describe() + (seq == kP2PSeq ? std::string() : " as collective #" + std::to_string(seq));
}

bool calls_match(uint64_t seq_a, const CallDesc& a, uint64_t seq_b, const CallDesc& b) {
  if (a.is_p2p() || b.is_p2p())  // a send pairs with a recv of the same bytes (sizes are checked apart)
    return a.op == CallOp::kSend && b.op == CallOp::kRecv;
  return seq_a == seq_b && a.pack() == b.pack();
}

}  // namespace r2cc
