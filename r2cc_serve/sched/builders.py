"""Schedules as plans: direct, one_shot, ring, r2ccl-style and optcc all-reduce.

direct and optcc are one schedule, "owner computes": rank o owns a share of the vector; every
rank sends o its raw input for that share, o folds the p raw inputs in rank order (one REDUCE:
canonical, bit-identical across schedules) and sends the result to every rank. direct uses equal
shares cut into slices of ``slice_bytes``, exactly like ``all_reduce`` in csrc/collectives.cc;
optcc uses the bandwidth-aware shares of ``cost.optcc_shares`` and K micro-chunks per share. The
issue's four OptCC stages are this one schedule seen from the straggler S: its sends to owners
are the ingest (1), the healthy owners' receives the reduce-scatter (2), the owners' sends the
all-gather and S's broadcast of its own share (3), and the owners' sends to S the delivery (4).
Each connection is FIFO and every share is cut into the same K chunks, so S's links fall into
the chunk-by-chunk pipeline by themselves: no extra dependencies are needed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from r2cc_serve.errors import UserError
from r2cc_serve.sched import cost
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.ir import COPY, IN, OUT, RECV, REDUCE, SCRATCH, SEND, Plan, ProgramBuilder, Symmetry

SCHEDULES = ("direct", "one_shot", "ring", "r2ccl", "optcc")
DEFAULT_SLICE_BYTES = cost.DIRECT_SLICE_BYTES  # R2CC_PIPELINE_BYTES


def part(count: int, n: int, i) -> tuple:
    """Element range [begin, end) of part i of count cut into n near-equal parts (as the C++ does)."""
    i = np.asarray(i)
    return count * i // n, count * (i + 1) // n


def split_by_shares(count: int, shares) -> np.ndarray:
    """Owner start offsets (length p+1) giving each rank about shares[i]*count elements, in rank order."""
    x = np.asarray(shares, dtype=np.float64)
    ideal = x / x.sum() * count
    sizes = np.floor(ideal).astype(np.int64)
    short = count - int(sizes.sum())
    if short:  # largest remainders first; ties to lower ranks, so every rank computes the same
        order = np.lexsort((np.arange(x.size), -(ideal - sizes)))
        sizes[order[:short]] += 1
    return np.r_[0, np.cumsum(sizes)]


def chunk_table(bounds: np.ndarray, chunks) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) of chunk k of owner o, arrays [p, K]; ``chunks`` per owner or shared."""
    p = len(bounds) - 1
    k_per = np.broadcast_to(np.asarray(chunks), (p,))
    K = int(k_per.max())
    size = np.diff(bounds)
    k = np.arange(K)
    lo = bounds[:-1, None] + size[:, None] * k[None, :] // k_per[:, None]
    hi = bounds[:-1, None] + size[:, None] * (k[None, :] + 1) // k_per[:, None]
    hi = np.where(k[None, :] < k_per[:, None], hi, lo)
    return lo, hi - lo


def chunk_major_table(count: int, shares, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """(start, length) [p, K] when the vector is first cut into K chunks and each chunk is split
    among owners by ``shares``: chunk k of all owners is then one contiguous range."""
    lo, hi = part(count, chunks, np.arange(chunks))
    bounds = np.stack([lo[k] + split_by_shares(int(hi[k] - lo[k]), shares) for k in range(chunks)], axis=1)
    return bounds[:-1], np.diff(bounds, axis=0)


def _symmetry(groups) -> Symmetry:
    return Symmetry(tuple((tuple(g),) for g in groups if len(g) > 1))


class OwnerSteps(NamedTuple):
    builder: ProgramBuilder
    reduce_step: dict  # chunk k of my share -> its REDUCE step
    result_recv: dict  # (owner, chunk) -> the RECV of that finished piece


def _owner_computes(me: int, p: int, start: np.ndarray, length: np.ndarray, result_to=None) -> OwnerSteps:
    """Steps of rank ``me`` in the owner-computes schedule over chunk table (start, length) [p, K].

    Every rank's raw input is folded; ``result_to`` are the ranks owners send results to
    (default: everyone). List order sets the per-pair message order: for each peer, all raw
    pieces come before all results, chunk by chunk.
    """
    b = ProgramBuilder()
    ranks = np.arange(p)
    takes_result = np.ones(p, dtype=bool) if result_to is None else np.isin(ranks, result_to)
    peers = (me + np.arange(1, p)) % p  # the C++ posting order
    mine = length[me]
    K = length.shape[1]
    share_len = int(mine.sum())
    piece_at = np.cumsum(mine) - mine  # where chunk k of my share sits in a contributor's slot
    b.need_scratch(p * share_len)
    # Raw contributions to my share: rank r's slot at r*share_len, my pieces one after another.
    rs_recv = {}
    for k in np.flatnonzero(mine).tolist():
        rs_recv[k] = b.add(RECV, peers, SCRATCH, peers * share_len + piece_at[k], mine[k])
    kk, oo = (a.reshape(-1) for a in np.meshgrid(np.arange(K), peers, indexing="ij"))  # chunk-major
    keep = length[oo, kk] > 0
    kk, oo = kk[keep], oo[keep]
    if oo.size:
        b.add(SEND, oo, IN, start[oo, kk], length[oo, kk])
    result_recv = {}
    if takes_result[me] and oo.size:
        idx = b.add(RECV, oo, OUT, start[oo, kk], length[oo, kk])
        result_recv = dict(zip(zip(oo.tolist(), kk.tolist()), idx.tolist()))
    targets = peers[takes_result[peers]]
    src_buf = np.where(ranks == me, IN, SCRATCH)
    reduce_step = {}
    for k in np.flatnonzero(mine).tolist():
        src_off = np.where(ranks == me, start[me, k], ranks * share_len + piece_at[k])
        red = b.add(REDUCE, -1, OUT, start[me, k], mine[k], deps=rs_recv[k], src_buf=src_buf, src_off=src_off)
        reduce_step[k] = int(red[0])
        if targets.size:
            b.add(SEND, targets, OUT, start[me, k], mine[k], deps=red)
    return OwnerSteps(b, reduce_step, result_recv)


def _single_rank_plan(schedule: str, count: int, elem_bytes: int) -> Plan:
    def make(rank: int):
        b = ProgramBuilder()
        if count:
            b.add(COPY, -1, OUT, 0, count, src_buf=[IN], src_off=[0])
        return b.build()
    return Plan(schedule, 1, count, elem_bytes, make)


def _check(p: int, count: int, elem_bytes: int) -> None:
    if p < 1 or count < 0 or elem_bytes < 1:
        raise UserError(f"bad all-reduce shape: p={p}, count={count}, elem_bytes={elem_bytes}")


def direct(p: int, count: int, elem_bytes: int = 4, slice_bytes: int = DEFAULT_SLICE_BYTES,
           groups=None) -> Plan:
    """Today's reduce-scatter + all-gather: equal shares (part(count, p, r)), sliced like the C++.

    ``groups``: ranks with equal bandwidth (only used to tell the simulator what is symmetric;
    the schedule itself is symmetric under any relabeling)."""
    _check(p, count, elem_bytes)
    if p == 1:
        return _single_rank_plan("direct", count, elem_bytes)
    bounds = np.r_[part(count, p, np.arange(p))[0], count]
    max_seg = int(np.diff(bounds).max())
    nslices = max(1, -(-(max_seg * elem_bytes) // max(slice_bytes, 1)))
    start, length = chunk_table(bounds, nslices)
    groups = groups or [list(range(p))]
    return Plan("direct", p, count, elem_bytes, lambda r: _owner_computes(r, p, start, length).builder.build(),
                symmetry=_symmetry(groups), info={"slices": nslices})


def one_shot(p: int, count: int, elem_bytes: int = 4, groups=None) -> Plan:
    """Every rank sends its whole input to every other and folds all p in rank order itself."""
    _check(p, count, elem_bytes)
    if p == 1:
        return _single_rank_plan("one_shot", count, elem_bytes)

    def make(me: int):
        b = ProgramBuilder()
        if count == 0:
            return b.build()
        peers = (me + np.arange(1, p)) % p
        b.need_scratch(p * count)
        recvs = b.add(RECV, peers, SCRATCH, peers * count, count)
        b.add(SEND, peers, IN, 0, count)
        ranks = np.arange(p)
        b.add(REDUCE, -1, OUT, 0, count, deps=recvs, src_buf=np.where(ranks == me, IN, SCRATCH),
              src_off=np.where(ranks == me, 0, ranks * count))
        return b.build()

    groups = groups or [list(range(p))]
    return Plan("one_shot", p, count, elem_bytes, make, symmetry=_symmetry(groups))


def ring(p: int, count: int, elem_bytes: int = 4, uniform: bool = True) -> Plan:
    """Classic ring 0 -> 1 -> ... -> p-1 -> 0: reduce-scatter then all-gather of p chunks.

    Partial sums travel the ring, so chunk c is folded in the order c+1, c+2, ..., c: NOT
    canonical (its bits differ from the other schedules'). It is here as the baseline every
    paper compares with, and for groups over 16 ranks where partial sums are allowed.
    ``uniform``: all ranks equally fast (the simulator may then run one representative)."""
    _check(p, count, elem_bytes)
    if p == 1:
        return _single_rank_plan("ring", count, elem_bytes)
    lo, hi = part(count, p, np.arange(p))
    cmax = int((hi - lo).max())

    def make(r: int):
        b = ProgramBuilder()
        nxt, prv = (r + 1) % p, (r - 1) % p
        s = np.arange(p - 1)
        b.need_scratch(2 * p * cmax)
        c_in = (r - s - 1) % p  # chunk arriving at reduce-scatter step s
        n_in = hi[c_in] - lo[c_in]
        recv = b.add(RECV, prv, SCRATCH, c_in * cmax, n_in)
        # Partials live in scratch (second half); the last step folds straight into out.
        last = s == p - 2
        dst_buf = np.where(last, OUT, SCRATCH)
        dst_off = np.where(last, lo[c_in], p * cmax + c_in * cmax)
        red = b.add(REDUCE, -1, dst_buf, dst_off, n_in, deps=recv[:, None],
                    src_buf=np.broadcast_to([SCRATCH, IN], (p - 1, 2)),
                    src_off=np.stack([c_in * cmax, lo[c_in]], axis=1))
        c_out = (r - s) % p  # chunk sent at step s: raw at step 0, then the partial just made
        n_out = hi[c_out] - lo[c_out]
        b.add(SEND, nxt, IN, lo[c_out[0]], n_out[0])
        if p > 2:
            b.add(SEND, nxt, SCRATCH, p * cmax + c_out[1:] * cmax, n_out[1:], deps=red[:-1, None])
        # All-gather: forward what arrived one step before.
        c_ag_in = (r - s) % p
        ag_recv = b.add(RECV, prv, OUT, lo[c_ag_in], hi[c_ag_in] - lo[c_ag_in])
        c_ag_out = (r + 1 - s) % p
        b.add(SEND, nxt, OUT, lo[c_ag_out[0]], hi[c_ag_out[0]] - lo[c_ag_out[0]], deps=[red[-1]])
        if p > 2:
            b.add(SEND, nxt, OUT, lo[c_ag_out[1:]], (hi - lo)[c_ag_out[1:]], deps=ag_recv[:-1, None])
        return b.build()

    sym = Symmetry(((tuple(range(p)),),)) if uniform else Symmetry()
    return Plan("ring", p, count, elem_bytes, make, symmetry=sym, canonical=False)


def r2ccl(p: int, count: int, degraded, elem_bytes: int = 4, chunks: int = 1) -> Plan:
    """R2CCL-style split: all-reduce among the healthy ranks plus a broadcast to the stragglers.

    Our reading of R2CCL's scheme (the paper gives no pseudo-code we could check): each degraded
    rank sends its raw input, cut by the healthy owners' equal shares, into the healthy ranks'
    reduce-scatter (so results stay canonical); the healthy ranks finish the all-reduce among
    themselves; one healthy root per straggler (round robin) forwards every finished chunk to it.
    The root carries one extra M out, hence about 1.5x fault-free at large p whatever beta is.
    """
    _check(p, count, elem_bytes)
    degraded = sorted(set(int(d) for d in degraded))
    healthy = [r for r in range(p) if r not in degraded]
    if not healthy:
        raise UserError("r2ccl needs at least one healthy rank")
    if not degraded or p == 1:
        return _renamed(direct(p, count, elem_bytes), "r2ccl")
    h = len(healthy)
    shares = np.zeros(p)
    shares[healthy] = 1.0
    start, length = chunk_major_table(count, shares, chunks)
    lo, hi = part(count, chunks, np.arange(chunks))
    nonempty = np.flatnonzero(hi > lo)
    root_of = {s: healthy[j % h] for j, s in enumerate(degraded)}

    def make(me: int):
        steps = _owner_computes(me, p, start, length, result_to=healthy)
        b = steps.builder
        for s in [s for s, root in root_of.items() if root == me]:
            for k in nonempty.tolist():  # forward chunk k once every piece of it is here
                deps = [steps.reduce_step[k]] if length[me, k] else []
                deps += [steps.result_recv[(o, k)] for o in healthy if o != me and length[o, k]]
                b.add(SEND, s, OUT, lo[k], hi[k] - lo[k], deps=deps)
        if me in root_of and nonempty.size:
            b.add(RECV, root_of[me], OUT, lo[nonempty], hi[nonempty] - lo[nonempty])
        return b.build()

    roots = [root_of[s] for s in degraded]
    plain = tuple(r for r in healthy if r not in roots)
    gens = [(plain,)] if len(plain) > 1 else []
    if len(set(roots)) == len(roots) and len(roots) > 1:  # straggler j and its root move together
        gens.append((tuple(degraded), tuple(roots)))
    return Plan("r2ccl", p, count, elem_bytes, make, symmetry=Symmetry(tuple(gens)),
                info={"degraded": degraded, "roots": [root_of[s] for s in degraded], "chunks": chunks})


def optcc(p: int, count: int, bw: Bandwidth, elem_bytes: int = 4, chunks: int = 1) -> Plan:
    """Asymmetry-aware owner-computes: shares from ``cost.optcc_shares``, K micro-chunks each."""
    _check(p, count, elem_bytes)
    if bw.p != p:
        raise UserError(f"bandwidth table has {bw.p} ranks, the plan {p}")
    if p == 1:
        return _single_rank_plan("optcc", count, elem_bytes)
    shares = cost.optcc_shares(bw.betas)
    start, length = chunk_major_table(count, shares, chunks)
    return Plan("optcc", p, count, elem_bytes, lambda r: _owner_computes(r, p, start, length).builder.build(),
                symmetry=_symmetry(bw.classes()),
                info={"shares": [round(float(x), 6) for x in shares], "chunks": int(chunks)})


def _renamed(plan: Plan, schedule: str) -> Plan:
    plan.schedule = schedule
    return plan


def build(schedule: str, p: int, count: int, bw: Bandwidth | None = None, elem_bytes: int = 4,
          chunks: int = 1, slice_bytes: int = DEFAULT_SLICE_BYTES) -> Plan:
    """Any schedule by name; ``bw`` (default uniform) sets shares, stragglers and symmetry."""
    bw = bw or Bandwidth.uniform(p, 1.0)
    if bw.p != p:
        raise UserError(f"bandwidth table has {bw.p} ranks, the plan {p}")
    if chunks < 1:
        raise UserError(f"chunks must be >= 1, got {chunks}")
    groups = bw.classes()
    if schedule == "direct":
        return direct(p, count, elem_bytes, slice_bytes, groups)
    if schedule == "one_shot":
        return one_shot(p, count, elem_bytes, groups)
    if schedule == "ring":
        return ring(p, count, elem_bytes, uniform=len(groups) == 1)
    if schedule == "r2ccl":
        return r2ccl(p, count, cost.split_degraded(bw)[0], elem_bytes, chunks)
    if schedule == "optcc":
        return optcc(p, count, bw, elem_bytes, chunks)
    raise UserError(f"unknown schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
