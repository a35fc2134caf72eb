// Typed failures of a group. The kind travels from C++ to Python as a value (and to the
// peers inside the abort frame), so nobody has to parse a sentence to know what broke.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace r2cc {

// Every kind once: (enumerator, value on the wire, name). The enum, its names, the wire decoding
// and the Python enum _C.ErrorKind are generated from this list; r2cc_serve/comm/errors.py maps
// each name to an exception class, and tests/unit/test_error_kinds.py fails when a kind is
// added on one side only.
//   kRailsDown     no path to a peer while a collective waited on it past the grace period
//   kPeerStalled   the peer's host acknowledges bytes but its process sent nothing until the timeout
//   kPeerGone      the peer closed its communicator or its process died (connections closed/refused)
//   kCallMismatch  ranks called different collectives (op, dtype, count, reduce op or root differ)
//   kTimeout       a collective did not finish within op_timeout_s for another reason
//   kClosed        this communicator was closed
//   kAborted       abort() by the application or an operator
#define R2CC_ERROR_KINDS(X)              \
  X(kNone, 0, "none")                    \
  X(kRailsDown, 1, "rails_down")         \
  X(kPeerStalled, 2, "peer_stalled")     \
  X(kPeerGone, 3, "peer_gone")           \
  X(kCallMismatch, 4, "call_mismatch")   \
  X(kTimeout, 5, "timeout")              \
  X(kClosed, 6, "closed")                \
  X(kAborted, 7, "aborted")

enum class ErrorKind : uint32_t {
#define R2CC_ERROR_KIND_ENUMERATOR(id, wire, name) id = wire,
  R2CC_ERROR_KINDS(R2CC_ERROR_KIND_ENUMERATOR)
#undef R2CC_ERROR_KIND_ENUMERATOR
};

// Calls f(kind, name) for every kind, in the list's order.
template <typename F>
void for_each_error_kind(F&& f) {
#define R2CC_ERROR_KIND_VISIT(id, wire, name) f(ErrorKind::id, name);
  R2CC_ERROR_KINDS(R2CC_ERROR_KIND_VISIT)
#undef R2CC_ERROR_KIND_VISIT
}

inline const char* error_kind_name(ErrorKind kind) {
  const char* out = "aborted";  // a value outside the list
  for_each_error_kind([&](ErrorKind k, const char* name) {
    if (k == kind) out = name;
  });
  return out;
}

// Unknown values (a newer peer) and kNone (an abort frame that names no kind) read as kAborted.
inline ErrorKind error_kind_from_wire(uint64_t v) {
  ErrorKind out = ErrorKind::kAborted;
  for_each_error_kind([&](ErrorKind k, const char*) {
    if (k != ErrorKind::kNone && uint64_t(k) == v) out = k;
  });
  return out;
}

// Thrown by every call once the group is aborted; the first error is kept and rethrown.
class AbortedError : public std::runtime_error {
 public:
  AbortedError(ErrorKind kind, const std::string& what) : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// An operator action refused because it would take away the last healthy rail to a peer
// (pass force to do it anyway). Nothing was changed.
class LastRailError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

}  // namespace r2cc
