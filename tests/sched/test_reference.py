"""Schedules compared bit for bit on real data by the reference executor."""

import numpy as np
import pytest

from r2cc_serve.sched import builders, reference
from r2cc_serve.sched.bandwidth import Bandwidth

CANONICAL = [s for s in builders.SCHEDULES if s != "ring"]


def _inputs(p, count, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-1000, 1000, count).astype(dtype) for _ in range(p)]
    return [(rng.standard_normal(count) * 10.0 ** rng.integers(-3, 4, count)).astype(dtype) for _ in range(p)]


def _bits(a):
    return a.view(np.uint8).tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("p", [2, 3, 5, 7])
def test_canonical_schedules_are_bit_identical_to_the_rank_order_fold(dtype, p):
    xs = _inputs(p, 613, dtype, seed=p)
    want = _bits(reference.fold(xs))
    tables = [Bandwidth.uniform(p, 1.0), Bandwidth.degraded(p, 1.0, {p - 1: 0.5}),
              Bandwidth.degraded(p, 1.0, {0: 0.8, p // 2: 0.55})]
    for bw in tables:
        for schedule in CANONICAL:
            for chunks in (1, 3):
                plan = builders.build(schedule, p, 613, bw=bw, chunks=chunks, slice_bytes=256)
                outs = reference.run(plan, xs)
                assert all(_bits(o) == want for o in outs), (schedule, chunks, bw.betas)


def test_ring_differs_in_the_last_bits_which_is_why_it_is_not_canonical():
    xs = _inputs(5, 2000, np.float32, seed=1)
    outs = reference.run(builders.ring(5, 2000), xs)
    want = reference.fold(xs)
    assert all(np.allclose(o, want, rtol=1e-4, atol=1e-3) for o in outs)
    assert any(_bits(o) != _bits(want) for o in outs)


def test_max_and_min_reductions():
    xs = _inputs(4, 100, np.float32, seed=3)
    plan = builders.build("optcc", 4, 100, bw=Bandwidth.degraded(4, 1.0, {2: 0.6}), chunks=2)
    for op, f in (("max", np.maximum), ("min", np.minimum)):
        want = f.reduce(np.stack(xs))
        assert all(np.array_equal(o, want) for o in reference.run(plan, xs, op=op))


def test_fp16_accumulates_in_fp32_and_rounds_once():
    a = np.array([2048.0], np.float16)
    b = np.array([1.0], np.float16)
    # fp16 steps are 2 at 2048: (2048 + 1) + 1 rounds twice to 2048, once to 2050.
    assert reference.fold([a, b, b])[0] == 2050
