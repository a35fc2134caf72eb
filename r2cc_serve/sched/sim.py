"""Flow-level simulator: run a plan's dependency graph over per-rank NIC capacities.

Model. Every rank has an out and an in capacity (bytes/s). A message is a flow from its sender's
out to its receiver's in; concurrent flows share each capacity max-min fairly (progressive
filling). Messages on one (sender, receiver) connection go one after another (FIFO). A message
starts when its SEND and RECV steps are both ready (their deps done) and the previous message on
its connection has left; the SEND completes when the last byte leaves, the RECV ``alpha_s``
later. REDUCE/COPY take ``bytes read / reduce_Bps`` (0: instant), without contention.

Speed. Two things keep 1024-rank plans to seconds:

- Symmetry. A plan may declare rank relabelings that leave its timing unchanged
  (``ir.Symmetry``), e.g. "all healthy ranks alike". Then only one representative per class is
  simulated; a message between classes stands for its whole orbit of copies, which load the
  sender's out and the receiver's in with their multiplicity. Generators that would mix ranks
  of different bandwidth are dropped (in the worst case every rank is simulated).
- Fixed rates. When no rank ever has two connections in one direction (a ring), no flows can
  share a capacity, every rate is min(out, in) and the plan is a longest-path problem, solved
  wave by wave without events.

Everything is numpy over arrays of steps and flows; events with equal times are handled together.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import numpy as np

from r2cc_serve.errors import UserError
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.ir import COPY, RECV, REDUCE, SEND, Plan, PlanError, Symmetry

_REL = 1e-12  # times within this relative distance are one event


@dataclass(frozen=True)
class SimResult:
    seconds: float
    engine: str  # "fluid" or "fixed-rate"
    representatives: int  # ranks simulated (p without symmetry)
    steps: int
    flows: int
    events: int
    wall_s: float


def simulate(plan: Plan, bw: Bandwidth, alpha_s: float = 0.0, reduce_Bps: float = 0.0,
             use_symmetry: bool = True) -> SimResult:
    """Completion time of ``plan`` on ``bw``; raises PlanError if the plan deadlocks."""
    if bw.p != plan.p:
        raise UserError(f"bandwidth table has {bw.p} ranks, the plan {plan.p}")
    if alpha_s < 0 or reduce_Bps < 0:
        raise UserError("alpha and reduce bandwidth must be >= 0")
    t0 = time.perf_counter()
    g = _Graph(plan, bw, use_symmetry)
    engine = _FixedRate(g, alpha_s, reduce_Bps) if g.contention_free() else _Fluid(g, alpha_s, reduce_Bps)
    seconds, events = engine.run()
    return SimResult(seconds, engine.name, len(g.reps), len(g.kind), g.n_flows, events,
                     time.perf_counter() - t0)


class _Graph:
    """Steps of the representative ranks, and messages grouped into flows (orbits)."""

    def __init__(self, plan: Plan, bw: Bandwidth, use_symmetry: bool) -> None:
        p = plan.p
        sym = _usable_symmetry(plan.symmetry, bw) if use_symmetry else Symmetry()
        gen, cls, idx, size = sym.orbit_info(p)
        cls = np.unique(cls, return_inverse=True)[1].reshape(-1)  # compact class ids
        reps = np.flatnonzero(idx == 0)
        rep_pos_of_class = np.zeros(cls.max() + 1, dtype=np.int64)
        rep_pos_of_class[cls[reps]] = np.arange(len(reps))
        class_size = np.zeros(cls.max() + 1, dtype=np.int64)
        class_size[cls] = size
        progs = [plan.program(int(r)) for r in reps]
        offs = np.r_[0, np.cumsum([len(pr) for pr in progs])]
        self.reps = reps
        self.kind = _cat([pr.kind for pr in progs], np.int8)
        self.rank_pos = np.repeat(np.arange(len(reps)), np.diff(offs))
        n_src = _cat([np.maximum(np.diff(pr.src_ptr), 1) for pr in progs], np.int64)
        self.nbytes = _cat([pr.length for pr in progs], np.int64).astype(np.float64) * plan.elem_bytes
        self.read_bytes = self.nbytes * n_src
        dep_counts = _cat([np.diff(pr.dep_ptr) for pr in progs], np.int64)
        dep_idx = _cat([pr.dep_idx + o for pr, o in zip(progs, offs)], np.int64)
        self.ndeps = dep_counts.copy()
        owner = np.repeat(np.arange(len(self.kind)), dep_counts)
        order = np.argsort(dep_idx, kind="stable")  # children CSR: dep -> dependents
        self.child = owner[order]
        self.child_count = np.bincount(dep_idx, minlength=len(self.kind))
        self.child_ptr = np.r_[0, np.cumsum(self.child_count)]
        self.cap = np.r_[bw.out_Bps[reps], bw.in_Bps[reps]]
        self._flows(progs, gen, cls, idx, size, rep_pos_of_class, class_size)

    def _flows(self, progs, gen, cls, idx, size, rep_pos_of_class, class_size) -> None:
        kind = self.kind
        comm = np.flatnonzero((kind == SEND) | (kind == RECV))
        if not comm.size:
            self.n_flows = 0
            self.flow_of = np.full(len(kind), -1)
            return
        rank = self.reps[self.rank_pos[comm]]
        peer = _cat([pr.peer for pr in progs], np.int64)[comm]
        is_send = kind[comm] == SEND
        # Position of each message on its (sender, receiver) pair: order of appearance.
        pair = (self.rank_pos[comm] * 2 + is_send) * len(gen) + peer
        order = np.argsort(pair, kind="stable")
        sorted_pair = pair[order]
        first = np.r_[0, np.flatnonzero(np.diff(sorted_pair)) + 1]
        m = np.empty(comm.size, dtype=np.int64)
        m[order] = np.arange(comm.size) - np.repeat(first, np.diff(np.r_[first, comm.size]))
        a = np.where(is_send, rank, peer)  # sender
        b = np.where(is_send, peer, rank)  # receiver
        same = (gen[a] >= 0) & (gen[a] == gen[b])
        offset = np.where(same, (idx[b] - idx[a]) % np.maximum(size[a], 1), -1)
        # A flow is an orbit of messages: (sender class, receiver class, offset, m), packed in one int.
        cols = [cls[a], cls[b], offset + 1, m]
        spans = [int(c.max()) + 1 for c in cols]
        if np.prod(np.asarray(spans, dtype=np.float64)) >= 2.0**62:
            raise PlanError("plan too large to simulate: too many messages per connection")
        packed = np.zeros(comm.size, dtype=np.int64)
        for c, span in zip(cols, spans):
            packed = packed * span + c
        order = np.argsort(packed)  # also groups each flow's member steps together
        sorted_keys = packed[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_keys)) + 1]
        n = len(starts)
        flow_sorted = np.cumsum(np.r_[0, np.diff(sorted_keys) != 0])
        flow = np.empty(comm.size, dtype=np.int64)
        flow[order] = flow_sorted
        uniq = np.empty((n, 4), dtype=np.int64)
        rest = sorted_keys[starts]
        for i in (3, 2, 1, 0):
            rest, uniq[:, i] = np.divmod(rest, spans[i])
        uniq[:, 2] -= 1
        self.n_flows = n
        self.flow_of = np.full(len(kind), -1, dtype=np.int64)
        self.flow_of[comm] = flow
        if np.any(np.bincount(flow[is_send], minlength=n) == 0) or np.any(np.bincount(flow[~is_send], minlength=n) == 0):
            raise PlanError("a message has no matching send or recv among the simulated ranks "
                            "(unmatched messages, or a symmetry the plan does not have); run validate()")
        same = uniq[:, 2] >= 0
        src_cls, dst_cls = uniq[:, 0], uniq[:, 1]
        self.w_out = np.where(same, 1, class_size[dst_cls]).astype(np.float64)
        self.w_in = np.where(same, 1, class_size[src_cls]).astype(np.float64)
        self.src = rep_pos_of_class[src_cls]
        self.dst = rep_pos_of_class[dst_cls] + len(self.reps)
        self.size = np.maximum.reduceat(self.nbytes[comm[order]], starts)
        self.members = np.diff(np.r_[starts, comm.size])
        # FIFO: the previous message on the same connection (same key but m - 1).
        same_conn = np.all(uniq[1:, :3] == uniq[:-1, :3], axis=1) & (uniq[1:, 3] == uniq[:-1, 3] + 1)
        self.pred = np.r_[-1, np.where(same_conn, np.arange(n - 1), -1)]
        self.succ = np.full(n, -1)
        has = self.pred >= 0
        self.succ[self.pred[has]] = np.flatnonzero(has)
        self.member_steps = comm[order]
        self.member_send = is_send[order]
        self.member_ptr = np.r_[starts, comm.size]

    def contention_free(self) -> bool:
        """True if no rank ever has two connections in one direction (then rates are fixed)."""
        if self.n_flows == 0:
            return True
        if np.any(self.w_out != 1) or np.any(self.w_in != 1):
            return False
        conn = self.pred < 0  # first message of each connection
        return (np.bincount(self.src[conn]).max() <= 1) and (np.bincount(self.dst[conn]).max() <= 1)

    def children_of(self, steps: np.ndarray) -> np.ndarray:
        return _gather(self.child_ptr, self.child, steps)

    def members_of(self, flows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = _gather_index(self.member_ptr, flows)
        return self.member_steps[pos], self.member_send[pos]

    def compute_time(self, steps: np.ndarray, reduce_Bps: float) -> np.ndarray:
        if reduce_Bps <= 0:
            return np.zeros(steps.size)
        return self.read_bytes[steps] / reduce_Bps


class _Fluid:
    """Event-driven max-min sharing; one event per distinct completion time."""

    name = "fluid"

    def __init__(self, g: _Graph, alpha_s: float, reduce_Bps: float) -> None:
        self.g, self.alpha, self.reduce_Bps = g, alpha_s, reduce_Bps
        n, f = len(g.kind), g.n_flows
        self.ndeps = g.ndeps.copy()
        self.done = np.zeros(n, dtype=bool)
        self.finish = np.zeros(n)
        self.ready_members = np.zeros(f, dtype=np.int64)
        self.pred_left = g.pred < 0 if f else np.zeros(0, dtype=bool)
        self.state = np.zeros(f, dtype=np.int8)  # 0 waiting, 1 on the wire, 2 left
        self.remaining = np.zeros(f)
        self.timers: list = []  # (time, seq, steps)
        self.step_stamp = np.zeros(n, dtype=np.int64)
        self.flow_stamp = np.zeros(f, dtype=np.int64)
        self.seq = 0
        self.t = 0.0
        self.n_done = 0

    def run(self) -> tuple[float, int]:
        g = self.g
        self._ready(np.flatnonzero(self.ndeps == 0))
        events = 0
        while self.n_done < len(g.kind):
            active = np.flatnonzero(self.state == 1)
            rate = np.zeros(0)
            t_flow = np.inf
            if active.size:
                rate = _max_min(g.src[active], g.dst[active], g.w_out[active], g.w_in[active], g.cap)
                t_flow = self.t + (self.remaining[active] / rate).min()
            t_next = min(t_flow, self.timers[0][0] if self.timers else np.inf)
            if not np.isfinite(t_next):
                raise PlanError(f"deadlock: {len(g.kind) - self.n_done} steps can never run")
            events += 1
            horizon = t_next + _REL * max(t_next, 1e-300)
            left = active[self.t + self.remaining[active] / rate <= horizon] if active.size else active
            self.remaining[active] -= rate * (t_next - self.t)
            self.t = t_next
            if left.size:
                self.remaining[left] = 0
                self._left(left)
            while self.timers and self.timers[0][0] <= horizon:
                self._ready(self._finish_steps(heapq.heappop(self.timers)[2]))
        return float(self.finish.max()) if len(g.kind) else 0.0, events

    def _ready(self, steps: np.ndarray) -> None:
        """Steps whose deps are done: start local work, count message ends; cascade instant ones."""
        g = self.g
        while steps.size:
            kind = g.kind[steps]
            local = steps[(kind == REDUCE) | (kind == COPY)]
            comm = steps[(kind == SEND) | (kind == RECV)]
            instant = local
            if local.size and self.reduce_Bps > 0:
                dur = g.compute_time(local, self.reduce_Bps)
                for d in np.unique(dur[dur > 0]):
                    self._timer(self.t + d, local[dur == d])
                instant = local[dur <= 0]
            if comm.size:
                flows = g.flow_of[comm]
                np.add.at(self.ready_members, flows, 1)
                self._try_start(_distinct(flows, self.flow_stamp))
            steps = self._finish_steps(instant)

    def _try_start(self, flows: np.ndarray) -> None:
        g = self.g
        ok = flows[(self.state[flows] == 0) & (self.ready_members[flows] == g.members[flows]) & self.pred_left[flows]]
        if ok.size:
            self.state[ok] = 1
            self.remaining[ok] = g.size[ok]
            empty = ok[g.size[ok] <= 0]
            if empty.size:
                self._left(empty)

    def _left(self, flows: np.ndarray) -> None:
        """Flows whose last byte left: free the connection, complete the ends."""
        g = self.g
        self.state[flows] = 2
        steps, is_send = g.members_of(flows)
        nxt = g.succ[flows]
        nxt = nxt[nxt >= 0]
        self.pred_left[nxt] = True
        if self.alpha > 0:
            self._timer(self.t + self.alpha, steps[~is_send])
            self._ready(self._finish_steps(steps[is_send]))
        else:
            self._ready(self._finish_steps(steps))
        self._try_start(nxt)

    def _finish_steps(self, steps: np.ndarray) -> np.ndarray:
        """Mark steps done now; return dependents that became ready."""
        if not steps.size:
            return steps
        self.done[steps] = True
        self.finish[steps] = self.t
        self.n_done += steps.size
        kids = self.g.children_of(steps)
        if not kids.size:
            return kids
        np.subtract.at(self.ndeps, kids, 1)
        kids = kids[self.ndeps[kids] == 0]
        return _distinct(kids, self.step_stamp)

    def _timer(self, when: float, steps: np.ndarray) -> None:
        if steps.size:
            self.seq += 1
            heapq.heappush(self.timers, (when, self.seq, steps))


class _FixedRate:
    """Longest path when every flow runs alone: rate = min(out, in), no events needed."""

    name = "fixed-rate"

    def __init__(self, g: _Graph, alpha_s: float, reduce_Bps: float) -> None:
        self.g, self.alpha, self.reduce_Bps = g, alpha_s, reduce_Bps

    def run(self) -> tuple[float, int]:
        g = self.g
        n, f = len(g.kind), g.n_flows
        ndeps = g.ndeps.copy()
        ready_at, finish = np.zeros(n), np.zeros(n)
        rate = np.minimum(g.cap[g.src], g.cap[g.dst]) if f else np.zeros(0)
        flow_ready = np.zeros(f)
        members_ready = np.zeros(f, dtype=np.int64)
        pred_end = np.where(g.pred < 0, 0.0, np.nan) if f else np.zeros(0)
        started = np.zeros(f, dtype=bool)
        step_stamp, flow_stamp = np.zeros(n, dtype=np.int64), np.zeros(f, dtype=np.int64)
        steps = np.flatnonzero(ndeps == 0)
        waves = n_done = 0
        while steps.size:
            waves += 1
            kind = g.kind[steps]
            is_comm = (kind == SEND) | (kind == RECV)
            local, comm = steps[~is_comm], steps[is_comm]
            finish[local] = ready_at[local] + g.compute_time(local, self.reduce_Bps)
            done = [local]
            go = np.zeros(0, dtype=np.int64)
            if comm.size:
                flows = g.flow_of[comm]
                np.maximum.at(flow_ready, flows, ready_at[comm])
                np.add.at(members_ready, flows, 1)
                go = _distinct(flows, flow_stamp)
            while go.size:  # a flow leaving may start the next one on its connection
                go = go[(members_ready[go] == g.members[go]) & ~np.isnan(pred_end[go]) & ~started[go]]
                started[go] = True
                end = np.maximum(flow_ready[go], pred_end[go]) + g.size[go] / rate[go]
                ms, is_send = g.members_of(go)
                finish[ms] = np.repeat(end, g.members[go]) + np.where(is_send, 0.0, self.alpha)
                done.append(ms)
                nxt = g.succ[go]
                pred_end[nxt[nxt >= 0]] = end[nxt >= 0]
                go = nxt[nxt >= 0]
            done = np.concatenate(done)
            n_done += done.size
            kids = g.children_of(done)
            if kids.size:
                np.maximum.at(ready_at, kids, np.repeat(finish[done], g.child_count[done]))
                np.subtract.at(ndeps, kids, 1)
                kids = _distinct(kids[ndeps[kids] == 0], step_stamp)
            steps = kids
        if n_done < n:
            raise PlanError(f"deadlock: {n - n_done} steps can never run")
        return (float(finish.max()) if n else 0.0), waves


def _max_min(src: np.ndarray, dst: np.ndarray, w_out: np.ndarray, w_in: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Weighted progressive filling: raise all rates together, freeze flows at full resources."""
    n, nres = src.size, cap.size
    rate = np.zeros(n)
    live = np.ones(n, dtype=bool)
    cap = cap.astype(np.float64).copy()
    while live.any():
        load = (np.bincount(src[live], weights=w_out[live], minlength=nres)
                + np.bincount(dst[live], weights=w_in[live], minlength=nres))
        used = load > 0
        share = np.full(nres, np.inf)
        share[used] = np.maximum(cap[used], 0.0) / load[used]
        level = share.min()
        full = share <= level * (1 + 1e-12)
        hit = live & (full[src] | full[dst])
        rate[hit] = level
        live &= ~hit
        cap -= (np.bincount(src[hit], weights=w_out[hit] * level, minlength=nres)
                + np.bincount(dst[hit], weights=w_in[hit] * level, minlength=nres))
    return rate


def _distinct(values: np.ndarray, stamp: np.ndarray) -> np.ndarray:
    """Distinct values without sorting; ``stamp`` is scratch as long as the value range."""
    pos = np.arange(values.size)
    stamp[values] = pos
    return values[stamp[values] == pos]


def _usable_symmetry(sym: Symmetry, bw: Bandwidth) -> Symmetry:
    """The declared symmetry without generators that would mix ranks of different bandwidth."""
    def uniform(ranks) -> bool:
        r = np.asarray(ranks)
        return np.ptp(bw.out_Bps[r]) == 0 and np.ptp(bw.in_Bps[r]) == 0
    return Symmetry(tuple(g for g in sym.generators if all(uniform(c) for c in g)))


def _cat(arrays, dtype) -> np.ndarray:
    return np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype=dtype)


def _gather_index(ptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions ptr[r]..ptr[r+1] for every r in rows, concatenated."""
    counts = ptr[rows + 1] - ptr[rows]
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(ptr[rows] - np.r_[0, np.cumsum(counts)[:-1]], counts)
    return starts + np.arange(total)


def _gather(ptr: np.ndarray, values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return values[_gather_index(ptr, rows)]
