"""A slow, obviously-correct executor in numpy: the semantics a C++ executor must match.

Runs every rank's program in one process, message by message, on real arrays. Tests use it to
compare schedules bit for bit; the C++ executor's golden tests can use it the same way.
Reductions follow csrc/reduce.cc: sources folded in the order given, 16-bit floats accumulated
in fp32 and rounded once.
"""

from __future__ import annotations

import numpy as np

from r2cc_serve.sched.ir import COPY, IN, OUT, SCRATCH, Plan
from r2cc_serve.sched.validate import execution_order, match_messages


def run(plan: Plan, inputs: list[np.ndarray], op: str = "sum") -> list[np.ndarray]:
    """Outputs of every rank for these inputs (one 1-D array of ``plan.count`` per rank)."""
    if len(inputs) != plan.p or any(x.shape != (plan.count,) for x in inputs):
        raise ValueError(f"need {plan.p} inputs of {plan.count} elements")
    progs = plan.programs()
    partner = match_messages(plan, progs)
    dtype = inputs[0].dtype
    bufs = [{IN: x.copy(), OUT: np.zeros(plan.count, dtype), SCRATCH: np.zeros(pr.scratch, dtype)}
            for x, pr in zip(inputs, progs)]

    def region(r: int, buf: int, off: int, n: int) -> np.ndarray:
        return bufs[r][buf][off:off + n]

    for what, a, b in execution_order(progs, partner):
        if what == "message":
            (sr, si), (dr, di) = a, b
            sp, dp = progs[sr], progs[dr]
            n = int(sp.length[si])
            region(dr, int(dp.buf[di]), int(dp.off[di]), n)[:] = region(sr, int(sp.buf[si]), int(sp.off[si]), n)
            continue
        pr, i = progs[a], b
        n = int(pr.length[i])
        srcs = [region(a, buf, o, n).copy() for buf, o in pr.sources(i)]
        region(a, int(pr.buf[i]), int(pr.off[i]), n)[:] = srcs[0] if pr.kind[i] == COPY else fold(srcs, op)
    return [b[OUT] for b in bufs]


def fold(arrays: list[np.ndarray], op: str = "sum") -> np.ndarray:
    """op(...op(a0, a1)..., an) element-wise; float16 accumulates in float32 and rounds once."""
    wide = arrays[0].dtype == np.float16
    acc = arrays[0].astype(np.float32) if wide else arrays[0].copy()
    combine = {"sum": np.add, "max": np.maximum, "min": np.minimum}[op]
    for a in arrays[1:]:
        acc = combine(acc, a.astype(np.float32) if wide else a)
    return acc.astype(arrays[0].dtype)
