// Every collective describes itself. The descriptor rides in each data frame, and the
// receiver compares it with its own call before a byte is reduced: two ranks that make
// different calls whose byte counts happen to match get an error naming both calls,
// never a silently wrong result.
#pragma once

#include <cstdint>
#include <string>

namespace r2cc {

enum class CallOp : uint8_t {
  kNone = 0, kAllReduce = 1, kAllGather = 2, kReduceScatter = 3, kGather = 4, kBroadcast = 5, kSend = 6, kRecv = 7,
};

// dtype: DType value, or kBytes for calls that move raw bytes (broadcast, send, recv).
struct CallDesc {
  static constexpr uint8_t kBytes = 15;
  static constexpr int32_t kNoRoot = -1;
  CallOp op = CallOp::kNone;
  uint8_t dtype = kBytes;
  uint8_t redop = 0;
  int32_t root = kNoRoot;
  uint64_t count = 0;  // elements (bytes for kBytes)

  bool is_p2p() const { return op == CallOp::kSend || op == CallOp::kRecv; }
  // 64 bits on the wire: op 4 | dtype 4 | redop 4 | root+1 12 | count 40.
  uint64_t pack() const;
  static CallDesc unpack(uint64_t v);
  // "all_reduce(sum, float32[100])", "broadcast(root 1, 400 bytes)"
  std::string describe() const;
};

// Collective calls are numbered per group (every rank makes every collective call);
// point-to-point calls are not (only two ranks take part) and carry kP2PSeq.
constexpr uint64_t kP2PSeq = ~uint64_t(0);

// Whether a message sent under (seq_a, a) may be received under (seq_b, b).
bool calls_match(uint64_t seq_a, const CallDesc& a, uint64_t seq_b, const CallDesc& b);
std::string describe_call(uint64_t seq, const CallDesc& d);

}  // namespace r2cc
