"""validate(): every builder passes; broken plans fail with a message naming the problem."""

import dataclasses

import numpy as np
import pytest

from r2cc_serve.sched import builders
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.ir import IN, OUT, RECV, REDUCE, SCRATCH, SEND, Plan, PlanError, ProgramBuilder
from r2cc_serve.sched.validate import validate

CANONICAL = [s for s in builders.SCHEDULES if s != "ring"]
TABLES = {
    "uniform": lambda p: Bandwidth.uniform(p, 1.0),
    "one_slow": lambda p: Bandwidth.degraded(p, 1.0, {p - 1: 0.5}),
    "two_slow": lambda p: Bandwidth.degraded(p, 1.0, {0: 0.75, p - 1: 0.6}),
    "just_above_threshold": lambda p: Bandwidth.degraded(p, 1.0, {1 % p: 0.9}),
}


@pytest.mark.parametrize("schedule", CANONICAL)
@pytest.mark.parametrize("table", list(TABLES))
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_canonical_schedules_validate(schedule, table, p):
    for count in (0, 1, p - 1, 97):
        for chunks in (1, 4):
            validate(builders.build(schedule, p, count, bw=TABLES[table](p), chunks=chunks, slice_bytes=40))


def test_canonical_at_sixteen_ranks_with_many_chunks():
    validate(builders.build("optcc", 16, 5000, bw=Bandwidth.degraded(16, 1.0, {15: 0.5, 3: 0.75}), chunks=8))


@pytest.mark.parametrize("p", [2, 3, 6])
def test_ring_sums_correctly_but_is_not_canonical(p):
    plan = builders.ring(p, 50)
    validate(plan, canonical=False)
    assert not plan.canonical
    with pytest.raises(PlanError, match="rank-order"):
        validate(plan)


def test_beyond_sixteen_ranks_partial_sums_are_allowed():
    validate(builders.ring(17, 40))  # canonical defaults to p <= 16


def _plan(p, count, programs, scratch=0):
    def make(r):
        b = ProgramBuilder()
        b.need_scratch(scratch)
        programs[r](b)
        return b.build()
    return Plan("test", p, count, 4, make)


def _exchange(fold, deps_on_recv=True):
    """Two ranks swap inputs into scratch; ``fold(b, me, src_buf)`` then writes out (the part tested)."""
    def rank(me):
        def build(b):
            r = b.add(RECV, 1 - me, SCRATCH, 0, 8)
            b.add(SEND, 1 - me, IN, 0, 8)
            fold(b, r if deps_on_recv else (), [IN, SCRATCH] if me == 0 else [SCRATCH, IN])
        return build
    return _plan(2, 8, [rank(0), rank(1)], scratch=8)


def _rank_order_fold(b, deps, srcs):
    b.add(REDUCE, -1, OUT, 0, 8, deps=deps, src_buf=srcs, src_off=[0, 0])


def test_hand_written_plan_is_valid():
    validate(_exchange(_rank_order_fold))


def test_missing_dependency_is_a_race():
    with pytest.raises(PlanError, match="races"):
        validate(_exchange(_rank_order_fold, deps_on_recv=False))


def test_wrong_fold_order_is_not_canonical():
    plan = _exchange(lambda b, deps, srcs: _rank_order_fold(b, deps, [SCRATCH, IN]))  # the other rank first
    with pytest.raises(PlanError, match="rank-order"):
        validate(plan)
    validate(plan, canonical=False)  # still a correct sum


def test_unwritten_output_is_reported():
    plan = _exchange(lambda b, deps, srcs: b.add(REDUCE, -1, OUT, 0, 6, deps=deps, src_buf=srcs, src_off=[0, 0]))
    with pytest.raises(PlanError, match=r"out\[6:8\] is never written"):
        validate(plan)


def test_misaligned_sources_are_caught():
    def fold(b, deps, srcs):
        shifted = [0, 4] if srcs[0] == IN else [4, 0]  # one source reads the wrong elements
        b.add(REDUCE, -1, OUT, 0, 4, deps=deps, src_buf=srcs, src_off=shifted)
        b.add(REDUCE, -1, OUT, 4, 4, deps=deps, src_buf=srcs, src_off=[4, 4])
    with pytest.raises(PlanError, match=r"out\[0:4\] is never written"):
        validate(_exchange(fold))


def test_two_step_fold_is_not_canonical():
    """A reduce of a reduce rounds twice for 16-bit floats: not bit-identical."""
    def rank(me):
        def build(b):
            peers = [q for q in range(3) if q != me]
            r = b.add(RECV, peers, SCRATCH, [8 * q for q in peers], 8)
            b.add(SEND, peers, IN, 0, 8)
            src = lambda q: (IN, 0) if q == me else (SCRATCH, 8 * q)  # noqa: E731
            first = b.add(REDUCE, -1, SCRATCH, 32, 8, deps=r, src_buf=[src(0)[0], src(1)[0]],
                          src_off=[src(0)[1], src(1)[1]])
            b.add(REDUCE, -1, OUT, 0, 8, deps=first, src_buf=[SCRATCH, src(2)[0]], src_off=[32, src(2)[1]])
        return build
    plan = _plan(3, 8, [rank(0), rank(1), rank(2)], scratch=40)
    with pytest.raises(PlanError, match="single reduce: False"):
        validate(plan)
    validate(plan, canonical=False)


def test_size_mismatch_unmatched_and_bounds_errors():
    def sender(b):
        b.add(SEND, 1, IN, 0, 8)

    def short_recv(b):
        b.add(RECV, 0, OUT, 0, 4)
    with pytest.raises(PlanError, match="length differs"):
        validate(_plan(2, 8, [sender, short_recv]))
    with pytest.raises(PlanError, match="no matching recv"):
        validate(_plan(2, 8, [sender, lambda b: None]))
    with pytest.raises(PlanError, match="never sent"):
        validate(_plan(2, 8, [lambda b: None, short_recv]))

    def out_of_bounds(b):
        b.add(SEND, 1, IN, 4, 8)
    with pytest.raises(PlanError, match="outside"):
        validate(_plan(2, 8, [out_of_bounds, short_recv]))

    def writes_input(b):
        b.add(RECV, 1, IN, 0, 8)
    with pytest.raises(PlanError, match="read-only"):
        validate(_plan(2, 8, [writes_input, sender]))


def test_a_reduce_may_write_over_a_source_only_exactly():
    def fold(shift):
        def build(b):
            b.add(REDUCE, buf=OUT, off=0, length=8, src_buf=[OUT, IN], src_off=[shift, 0])
        return build
    with pytest.raises(PlanError, match="part-way"):
        validate(_plan(1, 16, [fold(4)]))
    with pytest.raises(PlanError) as exact:  # in place is allowed (it fails later, on what it computes)
        validate(_plan(1, 16, [fold(0)]))
    assert "part-way" not in str(exact.value)


def test_bad_peer_and_forward_dependency():
    def self_send(b):
        b.add(SEND, 0, IN, 0, 8)
    with pytest.raises(PlanError, match="bad peer"):
        validate(_plan(1, 8, [self_send]))
    good = _exchange(_rank_order_fold)
    prog = good.program(0)
    forward = dataclasses.replace(prog, dep_idx=np.full_like(prog.dep_idx, len(prog) - 1))
    bad = Plan("t", 2, 8, 4, lambda r: forward if r == 0 else good.program(1))
    with pytest.raises(PlanError, match="earlier steps"):
        validate(bad)


def test_deadlock_is_reported():
    """Each rank waits for its own recv before sending: nobody ever sends."""
    def rank(me):
        def build(b):
            r = b.add(RECV, 1 - me, OUT, 0, 8)
            b.add(SEND, 1 - me, IN, 0, 8, deps=r)
        return build
    with pytest.raises(PlanError, match="deadlock"):
        validate(_plan(2, 8, [rank(0), rank(1)]))


def test_every_builder_program_reads_only_written_scratch():
    """Scratch sizes suffice: validation checks bounds for sources too."""
    plan = builders.build("r2ccl", 6, 600, bw=Bandwidth.degraded(6, 1.0, {2: 0.5, 5: 0.5}), chunks=5)
    validate(plan)
    assert all(np.all(plan.program(r).length >= 0) for r in range(6))
