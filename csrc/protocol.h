// Wire format of one rail connection. Version it: a peer speaking another
// version is rejected at the handshake, never misread.
#pragma once

#include <cstdint>

namespace r2cc {

constexpr uint32_t kFrameMagic = 0x52324343;  // "R2CC"
constexpr uint32_t kProtocolVersion = 5;  // 2: frames carry the call descriptor; 3: kHold, kRelease;
                                          // 4: a heartbeat echo carries its wait at the echoer;
                                          // 5: kProbe

enum class FrameType : uint32_t {
  kData = 1,           // seq, offset, total, len payload bytes follow
  kAck = 2,            // seq, offset = chunk index: that chunk is in the receiver's buffer
  kAckAll = 3,         // seq: the whole message was received
  kHeartbeat = 4,      // offset = sender's clock (ns); answered by kHeartbeatEcho
  kHeartbeatEcho = 5,  // offset = the clock value being echoed, total = ns it waited at the echoer
  kAbort = 6,          // offset = ErrorKind; len bytes of reason follow; the group is dead
  kDrain = 7,          // the sender drained this rail: stop putting new chunks on it
  kUndrain = 8,
  kGoodbye = 9,  // the sender closed its communicator after flushing: not a failure
  kHold = 10,    // the sender holds this flapping rail out (dampening): no new chunks on it
  kRelease = 11, // the sender's hold ended
  kProbe = 12,   // len bytes of padding follow: a full-size segment on an idle rail (gray.cc)
};

struct FrameHeader {
  uint32_t magic;
  uint32_t type;
  uint64_t seq;
  uint64_t offset;
  uint64_t total;        // message length (kData)
  uint32_t len;          // payload bytes after the header
  uint32_t chunk_bytes;  // chunk size of the message (kData), so the receiver can index chunks
  uint64_t call_seq = 0;   // kData: the sender's collective number (kP2PSeq for send/recv), see call.h
  uint64_t call_desc = 0;  // kData: CallDesc::pack() of the sender's call
};
constexpr uint64_t kReleaseRestored = 1;  // kRelease's offset: the operator restored the rail, end your hold too

static_assert(sizeof(FrameHeader) == 56, "frame header must stay 56 bytes");

constexpr uint32_t kMaxAbortReason = 4096;  // bytes of reason a kAbort frame carries at most
constexpr uint32_t kMaxProbeBytes = 65536;  // padding a kProbe frame carries at most

// A frame without a call descriptor (acks, heartbeats, drain, goodbye, abort).
inline FrameHeader control_frame(FrameType t, uint64_t seq = 0, uint64_t offset = 0, uint32_t len = 0) {
  return FrameHeader{kFrameMagic, uint32_t(t), seq, offset, 0, len, 0};
}

// Handshake, listener speaks first. Each side proves knowledge of the group secret
// by a keyed MAC over the other side's fresh nonce; the secret never crosses the wire.
struct HelloListener {
  uint32_t magic;
  uint32_t version;
  uint8_t nonce[16];
};
struct HelloConnector {
  uint32_t magic;
  uint32_t version;
  uint64_t group_hash;
  uint32_t rank;
  uint32_t rail;
  uint8_t nonce[16];
  uint64_t mac;  // siphash(secret, "C" | listener nonce | rank | rail)
};
enum class HelloStatus : uint32_t { kOk = 0, kRailHeld = 1, kRejected = 2 };
struct HelloReply {
  uint32_t status;
  uint32_t rank;
  uint64_t mac;  // siphash(secret, "L" | connector nonce | rank | rail)
};

}  // namespace r2cc
