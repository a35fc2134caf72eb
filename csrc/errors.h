// Typed failures of a group. The kind travels from C++ to Python as a value (and to the
// peers inside the abort frame), so nobody has to parse a sentence to know what broke.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace r2cc {

enum class ErrorKind : uint32_t {
  kNone = 0,
  kRailsDown = 1,     // no path to a peer while a collective waited on it past the grace period
  kPeerStalled = 2,   // the peer's host acknowledges bytes but its process sent nothing until the timeout
  kPeerGone = 3,      // the peer closed its communicator or its process died (connections closed/refused)
  kCallMismatch = 4,  // ranks called different collectives (op, dtype, count, reduce op or root differ)
  kTimeout = 5,       // a collective did not finish within op_timeout_s for another reason
  kClosed = 6,        // this communicator was closed
  kAborted = 7,       // abort() by the application or an operator
};
const char* error_kind_name(ErrorKind k);
// Unknown values (a newer peer) read as kAborted.
ErrorKind error_kind_from_wire(uint64_t v);

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
