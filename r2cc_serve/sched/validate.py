"""Static and symbolic checks of a plan (see ``validate`` for what is promised).

Symbolic execution tracks, for every element of every buffer of every rank, which input element
it holds and how it was made: ``Value(shift, ranks, clean)`` means "the element at buffer offset x
is the reduction over ``ranks`` (in that order) of input element ``x - shift``"; ``clean`` says it
was made by one REDUCE of raw inputs (or is a raw input), which is what makes 16-bit results
bit-identical across schedules (a second reduce would round twice). Buffers are kept as maps of
intervals, so the cost grows with the number of steps, not with the element count.
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import NamedTuple

import numpy as np

from r2cc_serve.sched.ir import (BUFFER_NAMES, COPY, IN, OUT, RECV, REDUCE, SCRATCH, SEND, Plan, PlanError,
                                 Program, message_index)


class Value(NamedTuple):
    shift: int
    ranks: tuple
    clean: bool


class IntervalMap:
    """Piecewise-constant contents of one buffer: piece i covers [starts[i], starts[i+1])."""

    def __init__(self, size: int, value) -> None:
        self.size = size
        self.starts = [0]
        self.vals = [value]

    def _split(self, x: int) -> int:
        i = bisect.bisect_right(self.starts, x) - 1
        if self.starts[i] != x:
            self.starts.insert(i + 1, x)
            self.vals.insert(i + 1, self.vals[i])
            i += 1
        return i

    def read(self, a: int, b: int) -> list[tuple[int, int, object]]:
        """Pieces of [a, b) as (start, end, value), clipped."""
        i = bisect.bisect_right(self.starts, a) - 1
        out = []
        while i < len(self.starts) and self.starts[i] < b:
            end = self.starts[i + 1] if i + 1 < len(self.starts) else self.size
            out.append((max(a, self.starts[i]), min(b, end), self.vals[i]))
            i += 1
        return out

    def write(self, a: int, b: int, pieces: list[tuple[int, int, object]]) -> None:
        """Replace [a, b) by pieces given as (start, end, value) in buffer offsets."""
        if a >= b:
            return
        i = self._split(a)
        j = self._split(b) if b < self.size else len(self.starts)
        self.starts[i:j] = [s for s, _, _ in pieces]
        self.vals[i:j] = [v for _, _, v in pieces]


def validate(plan: Plan, canonical: bool | None = None) -> None:
    """Raise PlanError unless the plan is well formed and computes the all-reduce.

    Checks: deps point to earlier steps; regions are in bounds and ``in`` is never written;
    every send has a matching recv of equal length (by order per pair); no step races another
    on a region (conflicting accesses are ordered by deps); no deadlock; and, by symbolic
    execution, every output element is the reduction of every rank's input element exactly
    once. With ``canonical`` (default: ``p <= 16``) each output element must come from one
    reduce over the raw inputs of ranks 0..p-1 in rank order: the determinism guarantee, every
    canonical schedule gives the same bits. Beyond 16 ranks schedules may use partial sums
    (e.g. the ring), so only "each rank exactly once" is required unless asked.
    Pure Python over every step of every rank: meant for tests and plans up to a few dozen ranks.
    """
    validate_plan(plan, plan.p <= 16 if canonical is None else canonical)


def validate_plan(plan: Plan, canonical: bool) -> None:
    progs = plan.programs()
    for r, prog in enumerate(progs):
        _check_structure(plan, r, prog)
    pairs = match_messages(plan, progs)
    for r, prog in enumerate(progs):
        _check_races(r, prog)
    state = _execute(plan, progs, pairs)
    _check_outputs(plan, state, canonical)


def _where(r: int, prog: Program, i: int) -> str:
    return f"rank {r} {prog.describe(i)}"


def _check_structure(plan: Plan, r: int, prog: Program) -> None:
    sizes = {IN: plan.count, OUT: plan.count, SCRATCH: prog.scratch}
    for i in range(len(prog)):
        kind, buf, off, n = int(prog.kind[i]), int(prog.buf[i]), int(prog.off[i]), int(prog.length[i])
        deps = prog.deps(i)
        if deps.size and (deps.min() < 0 or deps.max() >= i):
            raise PlanError(f"{_where(r, prog, i)}: deps must name earlier steps, got {deps.tolist()}")
        if buf not in sizes or off < 0 or n < 0 or off + n > sizes[buf]:
            raise PlanError(f"{_where(r, prog, i)}: region outside the buffer (size {sizes.get(buf)})")
        if kind in (RECV, REDUCE, COPY) and buf == IN:
            raise PlanError(f"{_where(r, prog, i)}: writes the input buffer, which is read-only")
        peer = int(prog.peer[i])
        if kind in (SEND, RECV):
            if not 0 <= peer < plan.p or peer == r:
                raise PlanError(f"{_where(r, prog, i)}: bad peer {peer}")
            if prog.src_ptr[i + 1] != prog.src_ptr[i]:
                raise PlanError(f"{_where(r, prog, i)}: a send/recv has no sources")
            continue
        srcs = prog.sources(i)
        if (kind == COPY and len(srcs) != 1) or (kind == REDUCE and not srcs) or kind not in (COPY, REDUCE):
            raise PlanError(f"{_where(r, prog, i)}: bad kind or source count {len(srcs)}")
        for sb, so in srcs:
            if sb not in sizes or so < 0 or so + n > sizes[sb]:
                raise PlanError(f"{_where(r, prog, i)}: source {BUFFER_NAMES[sb] if sb in sizes else sb}"
                                f"[{so}:{so + n}] outside the buffer")
            # The C++ fold reads each element's sources once, then writes it: the region may be a
            # source (in place) but must not overlap one part-way (csrc/reduce.h).
            if kind == REDUCE and sb == buf and so != off and so < off + n and off < so + n:
                raise PlanError(f"{_where(r, prog, i)}: region overlaps source {BUFFER_NAMES[sb]}[{so}:{so + n}] "
                                "part-way (a reduce may only write over a source exactly)")


def match_messages(plan: Plan, progs: list[Program]) -> dict[tuple[int, int], tuple[int, int]]:
    """(rank, step) of every send/recv -> (peer rank, matching step); checks equal lengths."""
    sends, recvs = {}, {}
    for r, prog in enumerate(progs):
        for kind, table in ((SEND, sends), (RECV, recvs)):
            m = message_index(prog, kind)
            for i in np.flatnonzero(prog.kind == kind).tolist():
                table[(r, int(prog.peer[i]), int(m[i]))] = i
    partner = {}
    for (a, b, k), i in sends.items():
        j = recvs.get((b, a, k))
        if j is None:
            raise PlanError(f"{_where(a, progs[a], i)}: message {k} to rank {b} has no matching recv")
        if progs[a].length[i] != progs[b].length[j]:
            raise PlanError(f"{_where(a, progs[a], i)}: length differs from the matching "
                            f"{_where(b, progs[b], j)}")
        partner[(a, i)], partner[(b, j)] = (b, j), (a, i)
    for (b, a, k), j in recvs.items():
        if (b, j) not in partner:
            raise PlanError(f"{_where(b, progs[b], j)}: message {k} from rank {a} is never sent")
    return partner


def _accesses(prog: Program, i: int) -> tuple[list[tuple[int, int, int]], tuple[int, int, int] | None]:
    """(reads, write) of step i as (buffer, start, end)."""
    kind, n = int(prog.kind[i]), int(prog.length[i])
    region = (int(prog.buf[i]), int(prog.off[i]), int(prog.off[i]) + n)
    if kind == SEND:
        return [region], None
    reads = [(b, o, o + n) for b, o in prog.sources(i)]
    return reads, region


def _check_races(r: int, prog: Program) -> None:
    """Conflicting accesses to a region must be ordered by deps: the executor runs steps out of order.

    Steps only depend on earlier ones, so list order is a topological order: it suffices that each
    access is ordered after the last write of each piece, and a write after the reads since then.
    """
    anc = [0] * len(prog)  # ancestors as bitsets
    for i in range(len(prog)):
        a = 0
        for d in prog.deps(i).tolist():
            a |= anc[d] | (1 << d)
        anc[i] = a
    maps: dict[int, IntervalMap] = {}
    for i in range(len(prog)):
        reads, write = _accesses(prog, i)
        accesses = [(acc, False) for acc in reads] + ([(write, True)] if write else [])
        for (buf, a, b), is_write in accesses:
            if a >= b:
                continue
            m = maps.setdefault(buf, IntervalMap(1 << 62, (None, ())))
            for _, _, (writer, readers) in m.read(a, b):
                earlier = ([writer] if writer is not None else []) + (list(readers) if is_write else [])
                for j in earlier:
                    if j != i and not (anc[i] >> j) & 1:
                        raise PlanError(f"rank {r}: {prog.describe(i)} races with {prog.describe(j)} "
                                        f"on {BUFFER_NAMES[buf]}: add a dependency")
        for buf, a, b in reads:
            if a < b:
                m = maps[buf]
                m.write(a, b, [(s, e, (w, rd + (i,))) for s, e, (w, rd) in m.read(a, b)])
        if write and write[1] < write[2]:
            maps[write[0]].write(write[1], write[2], [(write[1], write[2], (i, ()))])


def execution_order(progs: list[Program], partner: dict):
    """Yield every step once, in an order deps and message matching allow: ("message", (sender,
    send step), (receiver, recv step)) or ("local", rank, step). Raises PlanError on deadlock."""
    waiting = [np.diff(prog.dep_ptr).astype(np.int64) for prog in progs]
    children = [_children(prog) for prog in progs]
    half_ready = set()  # message ends whose partner is not ready yet
    queue = deque((r, i) for r, prog in enumerate(progs) for i in np.flatnonzero(waiting[r] == 0).tolist())
    done = 0

    def finish(r: int, i: int) -> None:
        for c in children[r][i]:
            waiting[r][c] -= 1
            if waiting[r][c] == 0:
                queue.append((r, c))

    while queue:
        r, i = queue.popleft()
        if int(progs[r].kind[i]) not in (SEND, RECV):
            yield "local", r, i
            finish(r, i)
            done += 1
            continue
        other = partner[(r, i)]
        if other not in half_ready:
            half_ready.add((r, i))
            continue
        half_ready.discard(other)
        send, recv = ((r, i), other) if progs[r].kind[i] == SEND else (other, (r, i))
        yield "message", send, recv
        finish(*send)
        finish(*recv)
        done += 2
    total = sum(len(p) for p in progs)
    if done != total:
        stuck = [f"rank {r} {progs[r].describe(i)}" for r, i in sorted(half_ready)[:3]]
        raise PlanError(f"deadlock: {total - done} of {total} steps never run (e.g. {'; '.join(stuck)})")


def _execute(plan: Plan, progs: list[Program], partner: dict) -> list[dict[int, IntervalMap]]:
    """Run every step once symbolically; return the buffers."""
    state = []
    for r, prog in enumerate(progs):
        state.append({IN: IntervalMap(plan.count, Value(0, (r,), True)),
                      OUT: IntervalMap(plan.count, None), SCRATCH: IntervalMap(max(prog.scratch, 1), None)})
    for what, a, b in execution_order(progs, partner):
        if what == "message":
            (sr, si), (dr, di) = a, b
            sp, dp = progs[sr], progs[dr]
            pieces = state[sr][int(sp.buf[si])].read(int(sp.off[si]), int(sp.off[si] + sp.length[si]))
            _store(state[dr][int(dp.buf[di])], int(dp.off[di]), int(sp.off[si]), pieces)
            continue
        r, i, prog = a, b, progs[a]
        dst_off, n = int(prog.off[i]), int(prog.length[i])
        srcs = prog.sources(i)
        reads = [state[r][buf].read(o, o + n) for buf, o in srcs]
        if prog.kind[i] == COPY:
            _store(state[r][int(prog.buf[i])], dst_off, srcs[0][1], reads[0])
        else:
            state[r][int(prog.buf[i])].write(dst_off, dst_off + n, _reduce(reads, srcs, dst_off))
    return state


def _children(prog: Program) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(len(prog))]
    counts = np.diff(prog.dep_ptr)
    owners = np.repeat(np.arange(len(prog)), counts)
    for child, dep in zip(owners.tolist(), prog.dep_idx.tolist()):
        out[dep].append(child)
    return out


def _moved(v, delta: int):
    return None if v is None else v._replace(shift=v.shift + delta)


def _store(m: IntervalMap, dst: int, src: int, pieces) -> None:
    """Write pieces read at buffer offset ``src`` to offset ``dst`` of ``m`` (a copy or a message)."""
    if not pieces:
        return
    delta = dst - src
    a, b = pieces[0][0] + delta, pieces[-1][1] + delta
    m.write(a, b, [(s + delta, e + delta, _moved(v, delta)) for s, e, v in pieces])


def _reduce(reads: list, srcs: list[tuple[int, int]], dst: int) -> list:
    """Combine sources piece by piece; misaligned or unset inputs give None (garbage)."""
    cuts = sorted({s - o for pieces, (_, o) in zip(reads, srcs) for s, _, _ in pieces} |
                  {e - o for pieces, (_, o) in zip(reads, srcs) for _, e, _ in pieces})
    out = []
    for lo, hi in zip(cuts, cuts[1:]):
        vals = [_value_at(pieces, o + lo) for pieces, (_, o) in zip(reads, srcs)]
        origins = {o - v.shift for v, (_, o) in zip(vals, srcs) if v is not None}
        if any(v is None for v in vals) or len(origins) != 1:
            out.append((dst + lo, dst + hi, None))
            continue
        ranks = tuple(r for v in vals for r in v.ranks)
        clean = all(v.clean and len(v.ranks) == 1 for v in vals)
        out.append((dst + lo, dst + hi, Value(dst - origins.pop(), ranks, clean)))
    return out


def _value_at(pieces, x: int):
    for s, e, v in pieces:
        if s <= x < e:
            return v
    return None


def _check_outputs(plan: Plan, state, canonical: bool) -> None:
    want = tuple(range(plan.p))
    for r in range(plan.p):
        for s, e, v in state[r][OUT].read(0, plan.count):
            if v is None or v.shift != 0:
                raise PlanError(f"rank {r}: out[{s}:{e}] is never written with its own element")
            if canonical and not (v.clean and v.ranks == want):
                raise PlanError(f"rank {r}: out[{s}:{e}] is not one rank-order reduce of raw inputs "
                                f"(ranks {v.ranks[:20]}, single reduce: {v.clean}); canonical plans are "
                                "required up to 16 ranks")
            if tuple(sorted(v.ranks)) != want:
                raise PlanError(f"rank {r}: out[{s}:{e}] sums ranks {sorted(v.ranks)[:20]}, not each rank once")
