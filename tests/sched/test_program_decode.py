"""The C++ reader of Program.encode() (csrc/sched/program.cc): every builder's programs load,
malformed ones are refused with the step named (no transport needed)."""

import struct

import numpy as np
import pytest

from r2cc_serve.sched import builders
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.ir import IN, OUT, RECV, SEND, ProgramBuilder

_C = pytest.importorskip("r2cc_serve._C")


@pytest.mark.parametrize("schedule", ["direct", "one_shot", "ring", "r2ccl", "optcc"])
def test_every_schedule_decodes(schedule):
    plan = builders.build(schedule, 5, 10001, bw=Bandwidth.degraded(5, 1.0, {4: 0.5}), chunks=3)
    for r in range(5):
        prog = plan.program(r)
        loaded = _C.PlanProgram(prog.encode())
        assert (loaded.steps, loaded.scratch_elems) == (len(prog), prog.scratch)


def test_malformed_programs_are_refused():
    b = ProgramBuilder()
    b.add(RECV, 1, IN, 0, 10)  # writes the input
    with pytest.raises(ValueError, match="step 0 writes the input buffer"):
        _C.PlanProgram(b.build().encode())
    good = builders.direct(2, 100).program(0)
    data = good.encode()
    with pytest.raises(ValueError, match="end inside array dep_idx"):
        _C.PlanProgram(data[:-8])
    with pytest.raises(ValueError, match="after the last array"):
        _C.PlanProgram(data + b"\0" * 8)
    bumped = struct.pack("<4sI", b"R2PL", 2) + data[8:]
    with pytest.raises(ValueError, match="version 2"):
        _C.PlanProgram(bumped)
    forward = good.dep_idx.copy()
    forward[0] = len(good) - 1  # a dependency on a later step
    bad = type(good)(**{**good.__dict__, "dep_idx": forward})
    with pytest.raises(ValueError, match="not an earlier one"):
        _C.PlanProgram(bad.encode())
    small = type(good)(**{**good.__dict__, "scratch": 1})
    with pytest.raises(ValueError, match="reaches scratch element"):
        _C.PlanProgram(small.encode())
    assert np.all(good.dep_idx >= 0)


@pytest.mark.parametrize("schedule,safe", [("direct", True), ("optcc", True), ("one_shot", False),
                                           ("ring", False)])
def test_in_place_safety(schedule, safe):
    """Owner-computes plans run in place without copying the input (as the built-in path does);
    one-shot sends the input to every peer and ring folds it into scratch: they get the copy."""
    bw = Bandwidth.degraded(4, 1.0, {3: 0.75})
    plan = builders.build(schedule, 4, 100003, bw=bw, chunks=4)
    assert [_C.PlanProgram(plan.program(r).encode()).in_place_safe for r in range(4)] == [safe] * 4


def test_a_second_reader_of_the_input_makes_a_program_unsafe():
    b = ProgramBuilder()
    b.add(SEND, 1, IN, 0, 10)
    b.add(SEND, 2, IN, 5, 10)  # overlaps the first: element 5..9 leaves twice
    b.add(RECV, 1, OUT, 0, 15)
    assert not _C.PlanProgram(b.build().encode()).in_place_safe
    b = ProgramBuilder()
    b.add(SEND, 1, IN, 0, 10)
    b.add(RECV, 2, OUT, 0, 10)  # overwritten by a rank that never saw this rank's piece
    assert not _C.PlanProgram(b.build().encode()).in_place_safe
    b = ProgramBuilder()
    b.add(SEND, 1, IN, 0, 10)
    b.add(RECV, 1, OUT, 0, 10)
    assert _C.PlanProgram(b.build().encode()).in_place_safe
