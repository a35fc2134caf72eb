"""Plans on real sockets: the C++ plan executor against the built-in all_reduce, bit for bit.

Every schedule folds each element in rank order, so direct, one_shot, optcc (any straggler
table) and auto must give the very bytes of the built-in path, for every dtype, op and size,
also when a rail fails mid-collective. Loopback rails, 2-4 spawned ranks.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from tests.comm import workers
from tests.comm.harness import run_ranks

# Straggler tables: at p=2 any shares are equal; at p=3 beta 0.5 the straggler owns nothing;
# at p=4 beta 0.75 it owns a tenth (the worked value).
TABLES = {2: "1,0.5", 3: "1,1,0.5", 4: "1,0.75,1,1"}
SCHEDULES = ("builtin", "direct", "one_shot", "optcc", "auto")


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha1(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def schedules_agree(rank, world, store, sizes, opts):
    """Every schedule's all_reduce (in place and not) as digests; failures against the reference."""
    comm = workers.open_comm(rank, world, store, **opts)
    digests, bad = {}, []
    try:
        for schedule in SCHEDULES:
            comm.set_schedule(schedule, TABLES[world] if schedule == "optcc" else "")
            for dtype in workers.DTYPES:
                for n in sizes:
                    inputs = [workers.make_input(r, n, dtype) for r in range(world)]
                    for op in ("sum", "max", "min") if n <= 70001 else ("sum",):
                        want = workers.reference_reduce(inputs, op)
                        got = comm.all_reduce(inputs[rank].clone(), op=op)
                        out = comm.all_reduce(inputs[rank], op=op, inplace=False)
                        if not (workers.bits_equal(got, want) and workers.bits_equal(out, want)):
                            bad.append(f"{schedule} {op} {dtype} n={n}")
                        digests[(schedule, str(dtype), n, op)] = _digest(got)
        plan, ran = comm.plan_info(), comm.plan_ran(sizes[-1], 4)  # auto ran last
    finally:
        comm.close()
    return {"bad": bad, "digests": digests, "plan": plan, "ran": ran}


def _check_against_builtin(results):
    for r in results:
        assert r["bad"] == [], r["bad"]
        d = r["digests"]
        for (schedule, dtype, n, op), digest in d.items():
            assert digest == d[("builtin", dtype, n, op)], (schedule, dtype, n, op)


@pytest.mark.parametrize("world,sizes", [(2, [0, 7, 4099, 300001]),
                                         (3, [0, 1, 7, 1000, 65536 + 5, (1 << 20) + 3])])
def test_plans_give_the_builtin_bits(world, sizes):
    _check_against_builtin(run_ranks(schedules_agree, world, sizes, {}, timeout=240))


def test_four_ranks_small_chunks_and_a_straggler_share():
    results = run_ranks(schedules_agree, 4, [0, 5, 70001, 250003], {"chunk_bytes": 16384}, timeout=240)
    _check_against_builtin(results)
    # auto exchanged the (uniform) rail counts in-band; every rank ended on the same epoch.
    assert len({r["plan"]["epoch"] for r in results}) == 1
    # sched/ reports what the last 4-byte call of the largest size ran: the same on every rank.
    assert results[0]["ran"]["count"] == 250003 and all(r["ran"] == results[0]["ran"] for r in results)


def test_optcc_failover_mid_collective_is_bit_exact(monkeypatch):
    # The spawned ranks inherit the knobs: a forced optcc plan under a straggler table.
    monkeypatch.setenv("R2CC_SCHEDULE", "optcc")
    monkeypatch.setenv("R2CC_BANDWIDTH_TABLE", TABLES[3])
    res = run_ranks(workers.failover_mid_collective, 3, 16 << 20, 0.03, {}, timeout=120)
    for r in res:
        assert r["exact"] and r["exact_after"], r
    assert sum(r["failovers"] for r in res) >= 1, res
    assert sum(r["resent"] for r in res) > 0, res


def unfit_program(rank, world, store):
    """Rank 0 runs a program made for a larger call; every rank must fail, none may hang."""
    from r2cc_serve import _C
    from r2cc_serve.sched import builders

    comm = workers.open_comm(rank, world, store, op_timeout_s=20.0)
    try:
        n = 1000
        program = _C.PlanProgram(builders.direct(world, n + (1000 if rank == 0 else 0)).program(rank).encode())
        x = workers.make_input(rank, n, torch.float32)
        try:
            comm._t.all_reduce_plan(program, x.data_ptr(), x.data_ptr(), n, _C.DType.f32, _C.RedOp.sum)
            return "no error"
        except _C.AbortedError as exc:
            return str(exc)
    finally:
        comm.close()


def test_a_program_unfit_for_the_call_fails_every_rank():
    msgs = run_ranks(unfit_program, 2, timeout=60)
    for m in msgs:
        assert "rank 0 aborted the group: its plan reaches element 2000 of an all_reduce of 1000" in m, m


def trial_then_keep(rank, world, store, n, calls):
    """auto under a straggler table: the first calls of a size alternate optcc and direct, then
    every rank keeps the same one (decided from gathered clocks); every result exact."""
    comm = workers.open_comm(rank, world, store)
    try:
        inputs = [workers.make_input(r, n, torch.float32) for r in range(world)]
        want = workers.reference_reduce(inputs, "sum")
        bad = sum(not workers.bits_equal(comm.all_reduce(inputs[rank].clone()), want) for _ in range(calls))
        return {"bad": bad, "trials": comm.plan_info()["trials"]}
    finally:
        comm.close()


def test_auto_checks_the_model_by_trial_and_every_rank_keeps_the_same(monkeypatch):
    monkeypatch.setenv("R2CC_SCHEDULE", "auto")
    monkeypatch.setenv("R2CC_BANDWIDTH_TABLE", "1,1,0.5")
    monkeypatch.setenv("R2CC_PLAN_TRIAL_CALLS", "4")
    res = run_ranks(trial_then_keep, 3, (2 << 20) // 4, 9, timeout=120)
    assert all(r["bad"] == 0 for r in res), res
    trials = [r["trials"] for r in res]
    assert len(trials[0]) == 1 and trials[0][0]["modeled"] == "optcc" and trials[0][0]["baseline"] == "direct"
    assert trials[0][0]["kept"] in ("optcc", "direct") and trials[0][0]["modeled_s"] > 0, trials
    assert all(t == trials[0] for t in trials), trials  # the same verdict and numbers on every rank
