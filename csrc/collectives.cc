#include "collectives.h"

#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

namespace r2cc {
namespace {

// Element range [begin, end) of part `i` when `count` is cut into `n` near-equal parts.
struct Range {
  size_t begin, end;
  size_t size() const { return end - begin; }
};
Range part(size_t count, size_t n, size_t i) { return Range{count * i / n, count * (i + 1) / n}; }

void wait_all(Transport& t, const std::vector<Op>& ops) {
  for (auto& op : ops) t.wait(op);
}

void check_root(const Transport& t, int root) {
  if (root < 0 || root >= t.world())
    throw std::invalid_argument("r2cc: root rank " + std::to_string(root) + " is outside the group of " +
                                std::to_string(t.world()));
}

// Every call starts by describing itself (call.h), before any early return, so that
// the ranks' collective numbers stay in step and a differing call is caught.
void begin(Transport& t, CallOp op, DType dt, size_t count, RedOp red = RedOp::kSum, int root = CallDesc::kNoRoot) {
  CallDesc d;
  d.op = op;
  d.dtype = uint8_t(dt);
  d.redop = uint8_t(red);
  d.root = root;
  d.count = count;
  t.begin_call(d);
}

void begin_bytes(Transport& t, CallOp op, size_t bytes, int root = CallDesc::kNoRoot) {
  CallDesc d;
  d.op = op;
  d.root = root;
  d.count = bytes;
  t.begin_call(d);
}

}  // namespace

namespace {

// Small vectors: every rank sends its whole input to every other rank and reduces all
// of them itself, in rank order. One message delay instead of two, same bits.
void all_reduce_one_shot(Transport& t, const char* src, char* dst, size_t count, DType dt, RedOp op) {
  const int p = t.world(), me = t.rank();
  const size_t bytes = count * dtype_size(dt);
  char* const theirs = t.scratch(size_t(p) * bytes);  // fully overwritten
  std::vector<Op> recvs, sends;
  for (int k = 1; k < p; ++k) {
    const int q = (me + k) % p;
    recvs.push_back(t.post_recv(q, theirs + size_t(q) * bytes, bytes));
  }
  for (int k = 1; k < p; ++k) sends.push_back(t.post_send((me + k) % p, src, bytes));
  wait_all(t, recvs);
  if (dst == src) wait_all(t, sends);  // in place: the input must not change under a send
  std::vector<const void*> inputs(p);
  for (int r = 0; r < p; ++r) inputs[r] = r == me ? src : theirs + size_t(r) * bytes;
  reduce_in_order(dt, op, dst, inputs.data(), p, count);
  wait_all(t, sends);
}

}  // namespace

void all_reduce(Transport& t, const void* in, void* out, size_t count, DType dt, RedOp op, size_t slice_bytes,
                size_t one_shot_bytes) {
  const int p = t.world(), me = t.rank();
  const size_t es = dtype_size(dt);
  const char* src = static_cast<const char*>(in);
  char* dst = static_cast<char*>(out);
  begin(t, CallOp::kAllReduce, dt, count, op);
  if (p == 1 || count == 0) {
    if (dst != src) std::memmove(dst, src, count * es);
    return;
  }
  if (count * es <= one_shot_bytes) return all_reduce_one_shot(t, src, dst, count, dt, op);
  size_t max_seg = 0;
  for (int r = 0; r < p; ++r) max_seg = std::max(max_seg, part(count, p, r).size());
  const size_t nslices = std::max<size_t>(1, (max_seg * es + slice_bytes - 1) / std::max<size_t>(slice_bytes, 1));
  auto slice = [&](int seg_owner, size_t j) {
    Range s = part(count, p, seg_owner);
    Range r = part(s.size(), nslices, j);
    return Range{s.begin + r.begin, s.begin + r.end};
  };
  // Other ranks' copies of my segment, laid out by rank.
  char* const contrib = t.scratch(size_t(p) * max_seg * es);  // fully overwritten
  const Range mine = part(count, p, me);
  auto contrib_at = [&](int r, const Range& rg) { return contrib + (size_t(r) * max_seg + (rg.begin - mine.begin)) * es; };

  std::vector<std::vector<Op>> rs_recv(nslices);
  std::vector<Op> sends, ag_recv;
  for (size_t j = 0; j < nslices; ++j)
    for (int k = 1; k < p; ++k) {
      const int q = (me + k) % p;
      Range rg = slice(me, j);
      rs_recv[j].push_back(t.post_recv(q, contrib_at(q, rg), rg.size() * es));
    }
  for (size_t j = 0; j < nslices; ++j)
    for (int k = 1; k < p; ++k) {
      const int q = (me + k) % p;
      Range rg = slice(q, j);
      ag_recv.push_back(t.post_recv(q, dst + rg.begin * es, rg.size() * es));
    }
  for (size_t j = 0; j < nslices; ++j)
    for (int k = 1; k < p; ++k) {
      const int q = (me + k) % p;
      Range rg = slice(q, j);
      sends.push_back(t.post_send(q, src + rg.begin * es, rg.size() * es));
    }
  std::vector<const void*> inputs(p);
  for (size_t j = 0; j < nslices; ++j) {
    wait_all(t, rs_recv[j]);
    Range rg = slice(me, j);
    for (int r = 0; r < p; ++r) inputs[r] = r == me ? src + rg.begin * es : contrib_at(r, rg);
    reduce_in_order(dt, op, dst + rg.begin * es, inputs.data(), p, rg.size());
    for (int k = 1; k < p; ++k) sends.push_back(t.post_send((me + k) % p, dst + rg.begin * es, rg.size() * es));
  }
  wait_all(t, ag_recv);
  wait_all(t, sends);
}

void all_gather(Transport& t, const void* in, void* out, size_t count, DType dt) {
  begin(t, CallOp::kAllGather, dt, count);
  const int p = t.world(), me = t.rank();
  const size_t bytes = count * dtype_size(dt);
  char* dst = static_cast<char*>(out);
  if (dst + size_t(me) * bytes != in) std::memmove(dst + size_t(me) * bytes, in, bytes);
  std::vector<Op> ops;
  for (int k = 1; k < p; ++k) {
    const int q = (me + k) % p;
    ops.push_back(t.post_recv(q, dst + size_t(q) * bytes, bytes));
  }
  for (int k = 1; k < p; ++k) ops.push_back(t.post_send((me + k) % p, dst + size_t(me) * bytes, bytes));
  wait_all(t, ops);
}

void reduce_scatter(Transport& t, const void* in, void* out, size_t count, DType dt, RedOp op) {
  begin(t, CallOp::kReduceScatter, dt, count, op);
  const int p = t.world(), me = t.rank();
  const size_t es = dtype_size(dt), bytes = count * es;
  const char* src = static_cast<const char*>(in);
  char* const contrib = t.scratch(size_t(p) * bytes);  // fully overwritten
  std::vector<Op> recvs, sends;
  for (int k = 1; k < p; ++k) {
    const int q = (me + k) % p;
    recvs.push_back(t.post_recv(q, contrib + size_t(q) * bytes, bytes));
  }
  for (int k = 1; k < p; ++k) {
    const int q = (me + k) % p;
    sends.push_back(t.post_send(q, src + size_t(q) * bytes, bytes));
  }
  wait_all(t, recvs);
  std::vector<const void*> inputs(p);
  for (int r = 0; r < p; ++r) inputs[r] = r == me ? src + size_t(me) * bytes : contrib + size_t(r) * bytes;
  reduce_in_order(dt, op, out, inputs.data(), p, count);
  wait_all(t, sends);
}

void gather(Transport& t, const void* in, void* out, size_t count, DType dt, int root) {
  check_root(t, root);
  begin(t, CallOp::kGather, dt, count, RedOp::kSum, root);
  const int p = t.world(), me = t.rank();
  const size_t bytes = count * dtype_size(dt);
  if (me != root) {
    t.wait(t.post_send(root, in, bytes));
    return;
  }
  char* dst = static_cast<char*>(out);
  if (dst + size_t(me) * bytes != in) std::memmove(dst + size_t(me) * bytes, in, bytes);
  std::vector<Op> ops;
  for (int q = 0; q < p; ++q)
    if (q != me) ops.push_back(t.post_recv(q, dst + size_t(q) * bytes, bytes));
  wait_all(t, ops);
}

void broadcast(Transport& t, void* buf, size_t bytes, int root) {
  check_root(t, root);
  begin_bytes(t, CallOp::kBroadcast, bytes, root);
  const int p = t.world(), me = t.rank();
  if (me != root) {
    t.wait(t.post_recv(root, buf, bytes));
    return;
  }
  std::vector<Op> ops;
  for (int k = 1; k < p; ++k) ops.push_back(t.post_send((me + k) % p, buf, bytes));
  wait_all(t, ops);
}

void send(Transport& t, const void* buf, size_t bytes, int peer) {
  begin_bytes(t, CallOp::kSend, bytes);
  t.wait(t.post_send(peer, buf, bytes));
}

void recv(Transport& t, void* buf, size_t bytes, int peer) {
  begin_bytes(t, CallOp::kRecv, bytes);
  t.wait(t.post_recv(peer, buf, bytes));
}

}  // namespace r2cc
