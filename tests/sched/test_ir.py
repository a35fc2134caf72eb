"""Plan data: the builder helper, the flat encoding, message order and symmetry bookkeeping."""

import numpy as np
import pytest

from r2cc_serve.sched import builders
from r2cc_serve.sched.bandwidth import Bandwidth
from r2cc_serve.sched.ir import (IN, OUT, RECV, REDUCE, SCRATCH, SEND, Program, ProgramBuilder, Symmetry,
                                 message_index)


def test_builder_batches_broadcast_scalars_and_keep_order():
    b = ProgramBuilder()
    r = b.add(RECV, [1, 2], SCRATCH, [0, 10], 10)
    s = b.add(SEND, [1, 2], IN, 0, 10)
    red = b.add(REDUCE, -1, OUT, 0, 10, deps=r, src_buf=[IN, SCRATCH, SCRATCH], src_off=[0, 0, 10])
    b.need_scratch(20)
    prog = b.build()
    assert r.tolist() == [0, 1] and s.tolist() == [2, 3] and red.tolist() == [4]
    assert prog.kind.tolist() == [RECV, RECV, SEND, SEND, REDUCE]
    assert prog.deps(4).tolist() == [0, 1]
    assert prog.sources(4) == [(IN, 0), (SCRATCH, 0), (SCRATCH, 10)]
    assert prog.scratch == 20 and "reduce" in prog.describe(4)


def test_builder_rejects_forward_dependencies():
    b = ProgramBuilder()
    b.add(SEND, 1, IN, 0, 4)
    with pytest.raises(ValueError):
        b.add(SEND, 1, IN, 0, 4, deps=[5])


def test_encode_round_trips_every_field():
    plan = builders.build("optcc", 4, 1000, bw=Bandwidth.degraded(4, 1.0, {3: 0.5}), chunks=3)
    for r in range(4):
        prog = plan.program(r)
        back = Program.decode(prog.encode())
        for name in ("kind", "peer", "buf", "off", "length", "src_ptr", "src_buf", "src_off", "dep_ptr", "dep_idx"):
            assert np.array_equal(getattr(back, name), getattr(prog, name)), name
        assert back.scratch == prog.scratch


def test_decode_rejects_other_data():
    with pytest.raises(ValueError):
        Program.decode(b"\0" * 64)


def test_message_index_counts_per_peer_in_list_order():
    b = ProgramBuilder()
    b.add(SEND, [1, 2, 1, 1, 2], IN, 0, 1)
    b.add(RECV, 1, OUT, 0, 1)
    m = message_index(b.build(), SEND)
    assert m.tolist() == [0, 0, 1, 2, 1, -1]


def test_symmetry_orbits_and_linked_cycles():
    sym = Symmetry((((0, 1, 2),), ((3, 4), (6, 7))))
    gen, cls, idx, size = sym.orbit_info(8)
    assert gen.tolist() == [0, 0, 0, 1, 1, -1, 1, 1]
    assert idx.tolist() == [0, 1, 2, 0, 1, 0, 0, 1]
    assert size.tolist() == [3, 3, 3, 2, 2, 1, 2, 2]
    assert len(set(cls.tolist())) == 4  # {0,1,2}, {3,4}, {5}, {6,7}
    with pytest.raises(ValueError):
        Symmetry((((0, 1),), ((1, 2),))).orbit_info(3)


def test_plan_programs_are_made_once_and_checked():
    plan = builders.direct(3, 30)
    assert plan.program(1) is plan.program(1)
    with pytest.raises(IndexError):
        plan.program(3)
    assert plan.summary()["schedule"] == "direct" and plan.nbytes == 120
