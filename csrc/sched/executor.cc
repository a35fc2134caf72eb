#include "sched/executor.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace r2cc {
namespace {

// A rank that cannot go on with its plan fails the whole group: its peers would otherwise
// wait for messages that never come.
[[noreturn]] void abort_group(Transport& t, const std::string& why) {
  const std::string msg = "r2cc: rank " + std::to_string(t.rank()) + " aborted the group: " + why;
  t.abort(msg);
  throw AbortedError(ErrorKind::kAborted, msg);
}

// One call's progress through a program: which steps are done, which may start, what the
// transport holds. Step i's region is bytes of base[buffer] at element offsets.
class PlanRun {
 public:
  PlanRun(Transport& t, const PlanProgram& prog, char* const base[3], DType dt, RedOp op)
      : t_(t), prog_(prog), steps_(prog.steps()), es_(dtype_size(dt)), dt_(dt), op_(op),
        waiting_(prog.steps().size()), ready_(prog.steps().size(), 0), queues_(size_t(t.world()) * 2),
        cursor_(queues_.size(), 0) {
    for (int b = 0; b < 3; ++b) base_[b] = base[b];
    // Per peer, sends and receives in program order: the transport numbers messages by post order.
    for (size_t i = 0; i < steps_.size(); ++i)
      if (steps_[i].peer >= 0) queues_[queue_of(steps_[i])].push_back(int64_t(i));
  }

  void run() {
    const size_t n = steps_.size();
    try {
      for (size_t i = 0; i < n; ++i)
        if ((waiting_[i] = prog_.num_deps(i)) == 0) became_ready(int64_t(i));
      for (;;) {
        settle();
        if (!compute_.empty()) {  // one fold or copy, then post whatever it unblocked
          const int64_t i = compute_.front();
          compute_.pop_front();
          compute(steps_[i]);
          finished_.push_back(i);
          continue;
        }
        if (completed_ == n) return;
        if (pending_.empty())  // cannot happen with backward deps; never wait on nothing
          abort_group(t_, "its plan stopped at step " + std::to_string(first_unfinished()) + " of " +
                              std::to_string(n) + " with nothing in flight (an executor bug)");
        harvest(t_.wait_some(pending_));
      }
    } catch (const AbortedError&) {
      release_buffers();
      throw;
    } catch (const std::exception& e) {
      t_.abort("r2cc: rank " + std::to_string(t_.rank()) + " aborted the group: its plan failed: " + e.what());
      release_buffers();
      throw;
    }
  }

 private:
  size_t queue_of(const PlanStep& s) const { return size_t(s.peer) * 2 + (s.kind == StepKind::kRecv); }
  char* at(const PlanRegion& r) const { return base_[int(r.buf)] + size_t(r.off) * es_; }

  void became_ready(int64_t i) {
    const PlanStep& s = steps_[i];
    if (s.peer < 0) {
      compute_.push_back(i);
      return;
    }
    ready_[i] = 1;
    post_in_order(queue_of(s));
  }

  // Posts the ready prefix of one peer's send (or receive) queue.
  void post_in_order(size_t q) {
    auto& queue = queues_[q];
    size_t& k = cursor_[q];
    for (; k < queue.size() && ready_[queue[k]]; ++k) {
      const int64_t i = queue[k];
      const PlanStep& s = steps_[i];
      const size_t bytes = size_t(s.length) * es_;
      Op op = s.kind == StepKind::kSend ? t_.post_send(s.peer, at(s.region), bytes)
                                        : t_.post_recv(s.peer, at(s.region), bytes);
      if (op.done_at_post) {
        finished_.push_back(i);
      } else {
        pending_.push_back(op);
        pending_step_.push_back(i);
      }
    }
  }

  // Marks finished steps done and releases their children until nothing more is ready.
  void settle() {
    while (!finished_.empty()) {
      const int64_t i = finished_.back();
      finished_.pop_back();
      completed_++;
      for (const int64_t* c = prog_.children_begin(size_t(i)); c != prog_.children_end(size_t(i)); ++c)
        if (--waiting_[*c] == 0) became_ready(*c);
    }
  }

  void harvest(const std::vector<size_t>& done) {
    for (auto it = done.rbegin(); it != done.rend(); ++it) {  // descending: swap-removal keeps indices valid
      finished_.push_back(pending_step_[*it]);
      pending_[*it] = pending_.back();
      pending_.pop_back();
      pending_step_[*it] = pending_step_.back();
      pending_step_.pop_back();
    }
  }

  void compute(const PlanStep& s) {
    const PlanRegion* src = prog_.sources().data() + s.src_begin;
    const int nsrc = int(s.src_end - s.src_begin);
    if (s.kind == StepKind::kCopy) {
      std::memmove(at(s.region), at(src[0]), size_t(s.length) * es_);
      return;
    }
    inputs_.resize(size_t(nsrc));
    for (int k = 0; k < nsrc; ++k) inputs_[k] = at(src[k]);
    reduce_in_order(dt_, op_, at(s.region), inputs_.data(), nsrc, size_t(s.length));
  }

  size_t first_unfinished() const {
    for (size_t i = 0; i < steps_.size(); ++i)
      if (waiting_[i] > 0 || (steps_[i].peer >= 0 && !ready_[i])) return i;
    return steps_.size();
  }

  // After an error: returns once no transport thread is inside a buffer of a posted op
  // (wait_some guarantees that when it throws; ops that completed meanwhile are dropped).
  void release_buffers() {
    while (!pending_.empty()) {
      try {
        std::vector<size_t> done = t_.wait_some(pending_);
        harvest(done);
        finished_.clear();
      } catch (const AbortedError&) {
        return;
      }
    }
  }

  Transport& t_;
  const PlanProgram& prog_;
  const std::vector<PlanStep>& steps_;
  const size_t es_;
  const DType dt_;
  const RedOp op_;
  char* base_[3];
  std::vector<int64_t> waiting_;     // deps not yet done, per step
  std::vector<uint8_t> ready_;       // send/recv whose deps are done (posted once its turn comes)
  std::vector<std::vector<int64_t>> queues_;  // per (peer, send|recv): steps in program order
  std::vector<size_t> cursor_;       // next step of each queue to post
  std::deque<int64_t> compute_;      // ready folds and copies, first ready first
  std::vector<int64_t> finished_;    // done, children not yet released
  std::vector<Op> pending_;          // posted, not complete
  std::vector<int64_t> pending_step_;
  std::vector<const void*> inputs_;
  size_t completed_ = 0;
};

// Why this call cannot run the program ("" when it can).
std::string unfit(const PlanProgram& prog, const Transport& t, size_t count) {
  const int64_t c = int64_t(count);
  if (prog.extent(PlanBuffer::kIn) > c || prog.extent(PlanBuffer::kOut) > c)
    return "its plan reaches element " +
           std::to_string(std::max(prog.extent(PlanBuffer::kIn), prog.extent(PlanBuffer::kOut))) +
           " of an all_reduce of " + std::to_string(count);
  if (prog.max_peer() >= t.world()) return "its plan names rank " + std::to_string(prog.max_peer());
  for (const PlanStep& s : prog.steps())
    if (s.peer == t.rank()) return "its plan sends to itself";
  return "";
}

bool overlaps(const void* a, const void* b, size_t bytes) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return bytes && x < y + bytes && y < x + bytes;
}

}  // namespace

void run_all_reduce_plan(Transport& t, const PlanProgram& prog, const void* in, void* out, size_t count, DType dt,
                         RedOp op) {
  t.begin_call(CallDesc{CallOp::kAllReduce, uint8_t(dt), uint8_t(op), CallDesc::kNoRoot, count});
  const std::string why = unfit(prog, t, count);
  if (!why.empty()) abort_group(t, why);
  const size_t es = dtype_size(dt), bytes = count * es;
  std::unique_ptr<char[]> in_copy;  // in place: sends must read the input, not partial results
  if (overlaps(in, out, bytes) && !(in == out && prog.in_place_safe())) {
    in_copy.reset(new char[bytes]);
    std::memcpy(in_copy.get(), in, bytes);
    in = in_copy.get();
  }
  std::unique_ptr<char[]> scratch(new char[size_t(prog.scratch_elems()) * es + 1]);  // not zeroed: plans write first
  char* const base[3] = {const_cast<char*>(static_cast<const char*>(in)), static_cast<char*>(out), scratch.get()};
  PlanRun(t, prog, base, dt, op).run();
}

}  // namespace r2cc
