#include "sched/program.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace r2cc {
namespace {

constexpr char kMagic[4] = {'R', '2', 'P', 'L'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 40;  // <4s I Q Q Q Q: magic, version, steps, sources, deps, scratch

[[noreturn]] void refuse(const std::string& why) {
  throw std::invalid_argument("r2cc: not a valid plan program: " + why);
}

[[noreturn]] void refuse_step(size_t i, const std::string& why) { refuse("step " + std::to_string(i) + " " + why); }

// Little-endian int64 arrays one after another, read in the order Program.encode() writes them.
class Reader {
 public:
  Reader(const char* p, size_t len) : p_(p), left_(len) {}
  std::vector<int64_t> take(uint64_t n, const char* name) {
    if (n > left_ / 8) refuse(std::string("the bytes end inside array ") + name);
    std::vector<int64_t> v(n);
    if (n) std::memcpy(v.data(), p_, n * 8);  // the executor runs on little-endian hosts only
    p_ += n * 8;
    left_ -= n * 8;
    return v;
  }
  size_t left() const { return left_; }

 private:
  const char* p_;
  size_t left_;
};

// A CSR pointer array: starts at 0, never decreases, ends at `total`.
void check_ptr(const std::vector<int64_t>& ptr, uint64_t total, const char* name) {
  if (ptr.front() != 0 || uint64_t(ptr.back()) != total) refuse(std::string(name) + " does not span its array");
  for (size_t i = 1; i < ptr.size(); ++i)
    if (ptr[i] < ptr[i - 1]) refuse(std::string(name) + " decreases at step " + std::to_string(i - 1));
}

PlanBuffer buffer_of(int64_t v, size_t step) {
  if (v < 0 || v > 2) refuse_step(step, "names buffer " + std::to_string(v) + " (0 in, 1 out, 2 scratch)");
  return PlanBuffer(v);
}

// Whether the program may run with `in` and `out` the same buffer, without copying the input
// first. Sound, not complete: it holds when every input element leaves the rank in exactly one
// way, and whatever overwrites it in `out` comes strictly after that:
//   - one SEND to q reads it, and only RECVs from q write it (q's message can only be a result
//     that folded this rank's element, so it arrives after q received all of ours; a later
//     re-send of those bytes is a duplicate q drops), or
//   - one REDUCE/COPY reads it from exactly its own region, and that step alone writes it.
// Direct and OptCC plans pass; one-shot (the input goes to every peer) and ring (partial sums
// in scratch) do not, and get the copy.
bool check_in_place_safe(const std::vector<PlanStep>& steps, const std::vector<PlanRegion>& sources) {
  struct Use {
    int64_t lo, hi;
    int64_t who;  // peer of a SEND (>= 0), or -1 - step of a local reader
  };
  std::vector<Use> reads;
  for (size_t i = 0; i < steps.size(); ++i) {
    const PlanStep& st = steps[i];
    if (st.length == 0) continue;
    if (st.kind == StepKind::kSend) {
      if (st.region.buf == PlanBuffer::kIn) reads.push_back({st.region.off, st.region.off + st.length, st.peer});
      continue;
    }
    for (uint32_t k = st.src_begin; k < st.src_end; ++k) {
      const PlanRegion& src = sources[k];
      if (src.buf != PlanBuffer::kIn) continue;
      if (st.region.buf != PlanBuffer::kOut || st.region.off != src.off) return false;  // the input goes elsewhere
      reads.push_back({src.off, src.off + st.length, -1 - int64_t(i)});
    }
  }
  std::sort(reads.begin(), reads.end(), [](const Use& a, const Use& b) { return a.lo < b.lo; });
  for (size_t k = 1; k < reads.size(); ++k)
    if (reads[k].lo < reads[k - 1].hi) return false;  // an element read twice (one-shot)
  for (size_t i = 0; i < steps.size(); ++i) {
    const PlanStep& st = steps[i];
    if (st.region.buf != PlanBuffer::kOut || st.length == 0 || st.kind == StepKind::kSend) continue;
    const int64_t lo = st.region.off, hi = lo + st.length;
    const int64_t who = st.kind == StepKind::kRecv ? st.peer : -1 - int64_t(i);
    // First read ending after lo; reads are disjoint and sorted, so their ends are sorted too.
    auto it = std::upper_bound(reads.begin(), reads.end(), lo, [](int64_t x, const Use& u) { return x < u.hi; });
    for (; it != reads.end() && it->lo < hi; ++it)
      if (it->who != who) return false;
  }
  return true;
}

}  // namespace

PlanProgram PlanProgram::decode(const void* data, size_t len) {
  const char* bytes = static_cast<const char*>(data);
  if (len < kHeaderBytes || std::memcmp(bytes, kMagic, 4) != 0) refuse("no R2PL header");
  uint32_t version;
  uint64_t n, m, e, scratch;
  std::memcpy(&version, bytes + 4, 4);
  std::memcpy(&n, bytes + 8, 8);
  std::memcpy(&m, bytes + 16, 8);
  std::memcpy(&e, bytes + 24, 8);
  std::memcpy(&scratch, bytes + 32, 8);
  if (version != kVersion)
    refuse("version " + std::to_string(version) + ", this core reads version " + std::to_string(kVersion));
  if (scratch > uint64_t(std::numeric_limits<int64_t>::max()) || n >= (uint64_t(1) << 40) ||
      m >= (uint64_t(1) << 32) || e >= (uint64_t(1) << 40))
    refuse("sizes out of range");
  Reader r(bytes + kHeaderBytes, len - kHeaderBytes);
  const auto kind = r.take(n, "kind"), peer = r.take(n, "peer"), buf = r.take(n, "buf");
  const auto off = r.take(n, "off"), length = r.take(n, "length");
  const auto src_ptr = r.take(n + 1, "src_ptr"), src_buf = r.take(m, "src_buf"), src_off = r.take(m, "src_off");
  const auto dep_ptr = r.take(n + 1, "dep_ptr"), dep_idx = r.take(e, "dep_idx");
  if (r.left()) refuse(std::to_string(r.left()) + " bytes after the last array");
  check_ptr(src_ptr, m, "src_ptr");
  check_ptr(dep_ptr, e, "dep_ptr");

  PlanProgram prog;
  prog.scratch_ = int64_t(scratch);
  // Grows the extent of a region's buffer; a region must fit in int64 and, in scratch, in it.
  auto touch = [&prog](size_t i, PlanRegion reg, int64_t count) {
    if (reg.off < 0 || count < 0 || reg.off > std::numeric_limits<int64_t>::max() - count)
      refuse_step(i, "has a negative or overflowing region");
    int64_t& ext = prog.extent_[int(reg.buf)];
    ext = std::max(ext, reg.off + count);
    if (reg.buf == PlanBuffer::kScratch && ext > prog.scratch_)
      refuse_step(i, "reaches scratch element " + std::to_string(ext) + " of " + std::to_string(prog.scratch_));
  };
  prog.steps_.resize(n);
  prog.sources_.resize(m);
  for (size_t s = 0; s < m; ++s) prog.sources_[s] = PlanRegion{buffer_of(src_buf[s], 0), src_off[s]};
  for (size_t i = 0; i < n; ++i) {
    if (kind[i] < 0 || kind[i] > 3) refuse_step(i, "has unknown kind " + std::to_string(kind[i]));
    PlanStep& st = prog.steps_[i];
    st.kind = StepKind(kind[i]);
    st.region = PlanRegion{buffer_of(buf[i], i), off[i]};
    st.length = length[i];
    st.src_begin = uint32_t(src_ptr[i]);
    st.src_end = uint32_t(src_ptr[i + 1]);
    const bool exchanges = st.kind == StepKind::kSend || st.kind == StepKind::kRecv;
    const int64_t nsrc = src_ptr[i + 1] - src_ptr[i];
    if (exchanges && (peer[i] < 0 || peer[i] > std::numeric_limits<int>::max() || nsrc != 0))
      refuse_step(i, "is a send/recv without a peer, or with sources");
    if (!exchanges && (nsrc < 1 || (st.kind == StepKind::kCopy && nsrc != 1)))
      refuse_step(i, "has " + std::to_string(nsrc) + " sources (reduce: >= 1, copy: 1)");
    if (st.kind != StepKind::kSend && st.region.buf == PlanBuffer::kIn) refuse_step(i, "writes the input buffer");
    st.peer = exchanges ? int(peer[i]) : -1;
    prog.max_peer_ = std::max(prog.max_peer_, st.peer);
    touch(i, st.region, st.length);
    for (uint32_t s = st.src_begin; s < st.src_end; ++s) touch(i, prog.sources_[s], st.length);
  }
  // Dependencies point backwards; children are their reverse, for the executor's worklist.
  prog.num_deps_.resize(n);
  prog.child_ptr_.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    prog.num_deps_[i] = dep_ptr[i + 1] - dep_ptr[i];
    for (int64_t d = dep_ptr[i]; d < dep_ptr[i + 1]; ++d) {
      if (dep_idx[d] < 0 || uint64_t(dep_idx[d]) >= i)
        refuse_step(i, "depends on step " + std::to_string(dep_idx[d]) + ", not an earlier one");
      prog.child_ptr_[dep_idx[d] + 1]++;
    }
  }
  prog.in_place_safe_ = check_in_place_safe(prog.steps_, prog.sources_);
  for (size_t i = 0; i < n; ++i) prog.child_ptr_[i + 1] += prog.child_ptr_[i];
  prog.children_.resize(e);
  std::vector<int64_t> fill(prog.child_ptr_.begin(), prog.child_ptr_.end() - 1);
  for (size_t i = 0; i < n; ++i)
    for (int64_t d = dep_ptr[i]; d < dep_ptr[i + 1]; ++d) prog.children_[fill[dep_idx[d]]++] = int64_t(i);
  return prog;
}

}  // namespace r2cc
