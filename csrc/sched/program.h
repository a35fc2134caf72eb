// One rank's program of a plan, decoded from the flat form of Program.encode() in
// r2cc_serve/sched/ir.py. That file is the one definition of the steps, the executor contract
// and the encoding; this is its C++ reader. Decoding checks everything that can be checked
// without the call (kinds, buffers, dependency order, source counts, regions inside scratch),
// so a program that decodes can only be refused by a call for its size or its peers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace r2cc {

enum class StepKind : uint8_t { kSend = 0, kRecv = 1, kReduce = 2, kCopy = 3 };
enum class PlanBuffer : uint8_t { kIn = 0, kOut = 1, kScratch = 2 };

struct PlanRegion {
  PlanBuffer buf;
  int64_t off;  // elements
};

struct PlanStep {
  StepKind kind;
  int peer;         // SEND/RECV; -1 otherwise
  PlanRegion region;  // written (RECV, REDUCE, COPY) or read (SEND)
  int64_t length;   // elements
  uint32_t src_begin, src_end;  // into PlanProgram::sources (REDUCE, COPY)
};

class PlanProgram {
 public:
  // Parses `len` bytes of Program.encode(). Throws std::invalid_argument naming the step
  // and the rule it breaks. The bytes are copied; the caller keeps ownership of `data`.
  static PlanProgram decode(const void* data, size_t len);

  const std::vector<PlanStep>& steps() const { return steps_; }
  const std::vector<PlanRegion>& sources() const { return sources_; }
  // Steps that wait for step i (the reverse of its deps), and how many deps step i has.
  const int64_t* children_begin(size_t i) const { return children_.data() + child_ptr_[i]; }
  const int64_t* children_end(size_t i) const { return children_.data() + child_ptr_[i + 1]; }
  int64_t num_deps(size_t i) const { return num_deps_[i]; }
  int64_t scratch_elems() const { return scratch_; }
  // Elements of `in` / `out` the program touches (a call needs count >= these).
  int64_t extent(PlanBuffer b) const { return extent_[int(b)]; }
  int max_peer() const { return max_peer_; }  // -1 when the program exchanges nothing
  // May `in` and `out` be one buffer without copying the input first (see program.cc)?
  bool in_place_safe() const { return in_place_safe_; }

 private:
  std::vector<PlanStep> steps_;
  std::vector<PlanRegion> sources_;
  std::vector<int64_t> child_ptr_, children_, num_deps_;
  int64_t scratch_ = 0;
  int64_t extent_[3] = {0, 0, 0};
  int max_peer_ = -1;
  bool in_place_safe_ = false;
};

}  // namespace r2cc
