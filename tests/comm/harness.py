"""Runs one function in `world` spawned processes, one per rank, joined by a TCPStore.

The function gets (rank, world, store, *args) and returns something picklable;
run_ranks returns the results ordered by rank, or raises with every rank's error.
Every process has a deadline: a hang fails the test instead of blocking CI.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import socket
import traceback


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn, rank, world, port, args, q):
    from torch.distributed import TCPStore

    try:
        store = TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=60))
        q.put((rank, True, fn(rank, world, store, *args)))
    except BaseException as exc:  # report everything, the parent decides
        q.put((rank, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_ranks(fn, world: int, *args, timeout: float = 120.0):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world, port, args, q), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    results, errors = {}, {}
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout)
    try:
        while len(results) + len(errors) < world:
            left = (deadline - datetime.datetime.now()).total_seconds()
            if left <= 0:
                raise TimeoutError(f"ranks {sorted(set(range(world)) - set(results) - set(errors))} did not finish "
                                   f"within {timeout} s; finished: {sorted(results)}; errors: {errors}")
            try:
                rank, ok, val = q.get(timeout=min(left, 1.0))
            except Exception:
                if all(not p.is_alive() for p in procs) and q.empty():
                    raise RuntimeError(f"ranks died without a result: exit codes {[p.exitcode for p in procs]}")
                continue
            (results if ok else errors)[rank] = val
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("rank errors:\n" + "\n".join(f"rank {r}: {e}" for r, e in sorted(errors.items())))
    return [results[r] for r in range(world)]
